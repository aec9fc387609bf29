"""The one atomic file write (a boundary: it touches the filesystem).

Readers (slurmctld's hook reading the published model list, the simulated-GPU backend
reading a job's load, slurmctld loading job_submit.lua) must never see a half-written file:
write a temp file in the same folder, then `os.replace` it over the target.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644, mtime: float | None = None, durable: bool = False) -> None:
    """Replace `path` by `data` atomically; the temp file is removed if anything fails.

    `mode` is applied before the rename (readers never see a narrower one); `mtime` sets the
    new file's modification time (slurmctld reloads a script only when it is newer);
    `durable` fsyncs the file and then its folder, so the rename survives a crash.
    Raises OSError as the failing call raised it.
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temp, mode)
        if mtime is not None:
            os.utime(temp, (mtime, mtime))
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, *, mode: int = 0o644, mtime: float | None = None, durable: bool = False) -> None:
    """`atomic_write_bytes` of `text` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode, mtime=mtime, durable=durable)


def _fsync_dir(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
