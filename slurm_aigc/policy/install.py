"""Install the rendered hook into Slurm's config directory (`slurm-aigc policy install`).

Order: render -> `luac -p` on a temp file -> `fsio.atomic_write_bytes` (a temp file in the target
directory, fsync, mtime one second ahead, os.replace, fsync the dir).
slurmctld therefore never reads half a file, and a script with a syntax error (which would
stop a restarting slurmctld) never reaches the directory.

Slurm 22.05 re-reads job_submit.lua only when its mtime is newer than the second of its last
load, so a file replaced within that same second would be ignored until the next change; the
new file's mtime is set one second past both the clock and the old file's mtime, which is
newer than any earlier load.

A site's own job_submit.lua is never replaced by accident: a file whose first line is not
one of ours (`-- slurm-aigc ...`, the rendered hook's marker or the local cluster's
placeholder) is refused unless `force`, and then copied aside first
(`job_submit.lua.site-backup-<UTC time>`, never overwritten).
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
from slurm_aigc.fsio import atomic_write_bytes

HOOK_FILE = "job_submit.lua"
# Every job_submit.lua we write starts with this (render.MARKER, the local cluster's placeholder).
OURS_PREFIX = "-- slurm-aigc "
Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class PolicyInstallError(AigcError):
    """The hook could not be checked or installed; the installed file is unchanged."""


@dataclass(frozen=True)
class InstallResult:
    path: Path
    bytes_written: int
    mtime_s: float
    backup: Path | None = None  # where a replaced site hook was copied


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
    """Write `text` to `path` durably through the one atomic writer, one second newer than before."""
    directory = path.parent
    if not directory.is_dir():
        raise PolicyInstallError(f"{directory} is not a directory (Slurm's config dir?)")
    data = text.encode("utf-8")
    mtime = next_mtime(path, clock())
    try:
        atomic_write_bytes(path, data, mode=0o644, mtime=mtime, durable=True)
    except OSError as error:
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


def install_hook(text: str, conf_dir: Path, *, luac: str | None = None, run: Runner = _run,
                 clock: Callable[[], float] = time.time, force: bool = False) -> InstallResult:
    """Check and install an already rendered hook as `<conf_dir>/job_submit.lua`.

    An existing hook that is not ours is refused, or with `force` backed up and replaced.
    """
    syntax_check(text, luac=luac, run=run)
    target = conf_dir / HOOK_FILE
    backup = None
    if not is_ours(target):
        if not force:
            raise PolicyInstallError(
                f"{target} is not slurm-aigc's (its first line does not start with {OURS_PREFIX.strip()!r}): "
                "a site's own hook is not replaced; merge it into the policy, move it aside, "
                "or pass --force (it is copied aside first)")
        backup = back_up(target, clock())
    result = atomic_write(target, text, clock=clock)
    return InstallResult(result.path, result.bytes_written, result.mtime_s, backup)


def is_ours(path: Path) -> bool:
    """True when there is no hook, an empty one, or one we wrote (first line `-- slurm-aigc ...`)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline(4096)
    except FileNotFoundError:
        return True
    except OSError as error:
        raise PolicyInstallError(f"cannot read {path}: {error.strerror or error}") from error
    return first == "" or first.startswith(OURS_PREFIX)


def back_up(path: Path, now_s: float) -> Path:
    """Copy `path` to `<path>.site-backup-<UTC time>` (a new name, never an existing file)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s))
    for attempt in range(100):
        backup = path.with_name(f"{path.name}.site-backup-{stamp}" + (f".{attempt}" if attempt else ""))
        try:
            with open(path, "rb") as source, open(backup, "xb") as copy:
                shutil.copyfileobj(source, copy)
                copy.flush()
                os.fsync(copy.fileno())
        except FileExistsError:
            continue
        except OSError as error:
            raise PolicyInstallError(f"cannot back up {path} to {backup}: {error.strerror or error}") from error
        shutil.copystat(path, backup)
        return backup
    raise PolicyInstallError(f"cannot back up {path}: 100 backups from {stamp} already exist")
