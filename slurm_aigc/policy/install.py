"""Install the rendered hook into Slurm's config directory (`slurm-aigc policy install`).

Order: render -> `luac -p` on a temp file -> write `job_submit.lua.aigc-tmp` in the target
directory, fsync -> set its mtime one second ahead -> os.replace (atomic) -> fsync the dir.
slurmctld therefore never reads half a file, and a script with a syntax error (which would
stop a restarting slurmctld) never reaches the directory.

Slurm 22.05 re-reads job_submit.lua only when its mtime is newer than the second of its last
load, so a file replaced within that same second would be ignored until the next change; the
new file's mtime is set one second past both the clock and the old file's mtime, which is
newer than any earlier load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_aigc.errors import AigcError

HOOK_FILE = "job_submit.lua"
Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class PolicyInstallError(AigcError):
    """The hook could not be checked or installed; the installed file is unchanged."""


@dataclass(frozen=True)
class InstallResult:
    path: Path
    bytes_written: int
    mtime_s: float


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)


def find_luac() -> str:
    """Debian's lua5.1 package installs `luac5.1`; slurmctld links Lua 5.1."""
    for name in ("luac5.1", "luac"):
        path = shutil.which(name)
        if path:
            return path
    raise PolicyInstallError("luac5.1 not found: install Debian's lua5.1 package")


def syntax_check(text: str, *, luac: str | None = None, run: Runner = _run) -> None:
    """`luac5.1 -p FILE`: parse only; raises PolicyInstallError with luac's message."""
    compiler = luac or find_luac()
    with tempfile.NamedTemporaryFile("w", suffix=".lua", encoding="utf-8", delete=False) as handle:
        handle.write(text)
        path = handle.name
    try:
        result = run([compiler, "-p", path])
    finally:
        os.unlink(path)
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip().replace(path, HOOK_FILE)
        raise PolicyInstallError(f"rendered {HOOK_FILE} fails `luac -p`: {message}")


def atomic_write(path: Path, text: str, *, clock: Callable[[], float] = time.time) -> InstallResult:
    """Write `text` to `path` via a temp file in the same directory and os.replace."""
    directory = path.parent
    if not directory.is_dir():
        raise PolicyInstallError(f"{directory} is not a directory (Slurm's config dir?)")
    temp = directory / f".{path.name}.aigc-tmp"
    data = text.encode("utf-8")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)
        mtime = next_mtime(path, clock())
        os.utime(temp, (mtime, mtime))
        os.replace(temp, path)
        _fsync_dir(directory)
    except OSError as error:
        temp.unlink(missing_ok=True)
        raise PolicyInstallError(f"cannot write {path}: {error.strerror or error}") from error
    return InstallResult(path, len(data), mtime)


def next_mtime(path: Path, now_s: float) -> float:
    """A whole second newer than both now and the file being replaced.

    slurmctld 22.05 skips a script whose mtime is not newer than its last load, whether that
    load time is the clock or the old file's own (future) mtime.
    """
    try:
        previous = os.stat(path).st_mtime
    except FileNotFoundError:
        previous = 0.0
    return float(max(int(now_s), int(previous)) + 1)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install_hook(text: str, conf_dir: Path, *, luac: str | None = None, run: Runner = _run,
                 clock: Callable[[], float] = time.time) -> InstallResult:
    """Check and install an already rendered hook as `<conf_dir>/job_submit.lua`."""
    syntax_check(text, luac=luac, run=run)
    return atomic_write(conf_dir / HOOK_FILE, text, clock=clock)
