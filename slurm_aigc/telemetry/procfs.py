"""The node-local boundary of attribution: `/proc` and the Prolog's job records.

Everything the agent learns about jobs on its node without asking slurmctld is read here;
`attribution.py` turns what these readers return into answers and does no I/O itself.

* `ProcFs`: `/proc/<pid>/{stat,status,cmdline,cgroup,environ}` (root reads any process);
* `JobRecordDir`: the files `daemon/slurm-aigc-jobrecord` writes, one per job on the node
  (`<dir>/<node>/<jobid>.json`), read only when root owns them and only root may write them:
  a record says which GPUs Slurm gave the job, so nobody else may forge one.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

from slurm_aigc.telemetry.procstat import start_ticks_of

LOG = logging.getLogger(__name__)

# Where the Prolog writes, unless SLURM_AIGC_JOB_RECORDS says otherwise (both must agree).
# A copy of RECORDS_DIR in daemon/slurm-aigc-jobrecord, which may not import slurm_aigc;
# tests/unit/test_jobrecord.py checks the two agree.
DEFAULT_JOB_RECORDS_DIR = Path("/run/slurm-aigc/jobs")
JOB_RECORDS_ENV = "SLURM_AIGC_JOB_RECORDS"
_RECORD_NAME_RE = re.compile(r"^(\d+)\.json$")
_MAX_RECORD_BYTES = 64 * 1024


def job_records_dir() -> Path:
    """The Prolog's record directory (`$SLURM_AIGC_JOB_RECORDS`, default /run/slurm-aigc/jobs)."""
    return Path(os.environ.get(JOB_RECORDS_ENV) or DEFAULT_JOB_RECORDS_DIR)


class ProcFs:
    """`/proc` (or a copy of its layout under `root`, for tests); a vanished pid reads as None."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = Path(root)

    def _read(self, pid: int, name: str) -> str | None:
        try:
            return (self.root / str(pid) / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def stat(self, pid: int) -> str | None:
        """`/proc/<pid>/stat`."""
        return self._read(pid, "stat")

    def start_ticks(self, pid: int) -> int | None:
        """Start time of `pid` in clock ticks since boot (stat field 22), None if it is gone."""
        return start_ticks_of(self.stat(pid))

    def status(self, pid: int) -> str | None:
        """`/proc/<pid>/status`."""
        return self._read(pid, "status")

    def cmdline(self, pid: int) -> str | None:
        """`/proc/<pid>/cmdline` (NUL-separated)."""
        return self._read(pid, "cmdline")

    def cgroup(self, pid: int) -> str | None:
        """`/proc/<pid>/cgroup`."""
        return self._read(pid, "cgroup")

    def environ(self, pid: int) -> str | None:
        """`/proc/<pid>/environ` (NUL-separated; the process may have rewritten it)."""
        return self._read(pid, "environ")


class JobRecordDir:
    """The Prolog's records of one node: job id -> record text, trusted files only."""

    def __init__(self, node: str, root: Path | None = None, *, require_root: bool = True) -> None:
        self.path = (root if root is not None else job_records_dir()) / node
        self._require_root = require_root
        self._warned: set[str] = set()

    def read(self) -> dict[str, str]:
        """Every trusted record now in the directory (none when it does not exist)."""
        if not self._trusted(self.path, directory=True):
            return {}
        try:
            names = os.listdir(self.path)
        except OSError:
            return {}
        records = {}
        for name in names:
            match = _RECORD_NAME_RE.match(name)
            text = self._read(self.path / name) if match else None
            if match and text is not None:
                records[match.group(1)] = text
        return records

    def _read(self, path: Path) -> str | None:
        if not self._trusted(path, directory=False):
            return None
        try:
            with path.open("rb") as handle:
                return handle.read(_MAX_RECORD_BYTES).decode("utf-8", errors="replace")
        except OSError:
            return None  # the Epilog removed it between listing and reading

    def _trusted(self, path: Path, *, directory: bool) -> bool:
        """Root-owned, not writable by group or others (else anyone could claim GPUs)."""
        try:
            info = path.lstat()
        except OSError:
            return False
        kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
        owner_ok = info.st_uid == 0 or not self._require_root
        if kind_ok and owner_ok and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return True
        if str(path) not in self._warned:
            self._warned.add(str(path))
            LOG.warning("ignoring job record %s: not a root-owned %s writable by root only", path,
                        "directory" if directory else "file")
        return False
