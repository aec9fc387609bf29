"""GPU process -> Slurm job, and per-job per-GPU usage from one node reading.

Lookup order: the pid's cgroup path (`/proc/<pid>/cgroup`, written by Slurm's cgroup
plugin, what Princeton's jobstats relies on); then the pid's ancestry, as
`proctrack/linuxproc` itself tracks jobs: the nearest root-owned `slurmstepd` ancestor
names its step in its command line (`slurmstepd: [123.batch]`); then Slurm's own
lookup (`scontrol pidinfo <pid>`, which asks the slurmd of this host and so fails when
several slurmd share a host, as on the local cluster). Results are cached per (pid,
process start time) for `ttl_s`, so a reused pid is never mistaken for the old process
and `scontrol` is not run for every process at every poll.

Splitting a shared GPU (shards, MPS, or several jobs on one GPU) between jobs:
each job's memory is the sum of its processes' memory. The GPU's SM utilization (the
authority: per-process samples cover different windows) is split in proportion to
each process's own SM utilization when NVML gave one for every process on that GPU,
else in proportion to used memory, else evenly per process. Processes that belong to no
job keep their share (it is not handed to the jobs). `shared` is true when more than
one job has processes on (or is allocated) the GPU.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slurm_aigc.errors import AigcError
from slurm_aigc.telemetry.records import GpuProcess, GpuReading, NodeReading
from slurm_aigc.telemetry.simgpu import process_start_ticks

LOG = logging.getLogger(__name__)

# cgroup v1: /slurm/uid_1000/job_123/step_0/task_0 (or /slurm_<node>/... with multiple slurmd)
# cgroup v2: /system.slice/slurmstepd.scope/job_123/step_batch/user/task_0
#            (or /system.slice/<node>_slurmstepd.scope/... with multiple slurmd)
_SLURM_JOB_RE = re.compile(r"/[^/]*slurm[^/]*/(?:[^/]+/)*?job_(\d+)(?:/|$)")


def job_from_cgroup(cgroup_text: str) -> str | None:
    """Job id from the text of `/proc/<pid>/cgroup` (v1 or v2 Slurm layouts), or None."""
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        match = _SLURM_JOB_RE.search(parts[2])
        if match:
            return match.group(1)
    return None


_STEPD_RE = re.compile(r"^slurmstepd: \[(\d+)(?:\+\d+)?\.[^\]]+\]")


def job_from_stepd_cmdline(cmdline: str) -> str | None:
    """Job id from a slurmstepd command line (`slurmstepd: [123.batch]`, `[123.0]`), or None."""
    match = _STEPD_RE.match(cmdline.replace("\0", " ").strip())
    return match.group(1) if match else None


def job_from_ancestry(proc_root: Path, pid: int, max_depth: int = 64) -> str | None:
    """Walk parent pids up to the nearest `slurmstepd` owned by root; its step names the job.

    Requiring uid 0 keeps a user's process renamed to `slurmstepd` from claiming a job.
    """
    current = pid
    for _ in range(max_depth):
        stat = _read(proc_root / str(current) / "stat")
        if stat is None or current <= 1:
            return None
        fields = stat[stat.rfind(")") + 2 :].split()
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        if comm == "slurmstepd" and _uid(proc_root, current) == 0:
            return job_from_stepd_cmdline(_read(proc_root / str(current) / "cmdline") or "")
        try:
            current = int(fields[1])
        except (IndexError, ValueError):
            return None
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _uid(proc_root: Path, pid: int) -> int | None:
    for line in (_read(proc_root / str(pid) / "status") or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


class PidLookup(Protocol):
    """The part of `slurm_aigc.slurm.SlurmCli` the Attributor uses."""

    def job_of_pid(self, pid: int) -> str | None:
        """`scontrol pidinfo PID` -> job id or None."""
        ...


@dataclass(frozen=True)
class _Entry:
    job_id: str | None
    start_ticks: int | None
    expires_s: float


class Attributor:
    """pid -> job id: cgroup, then slurmstepd ancestry, then `scontrol pidinfo`; cached."""

    def __init__(
        self,
        slurm: PidLookup | None,
        proc_root: Path = Path("/proc"),
        ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slurm = slurm
        self.proc_root = Path(proc_root)
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: dict[int, _Entry] = {}

    def job_of(self, pid: int) -> str | None:
        """The Slurm job id of `pid`, or None when it is in no job (or is gone)."""
        now = self.clock()
        ticks = process_start_ticks(self.proc_root, pid)
        entry = self._cache.get(pid)
        if entry is not None and entry.expires_s > now and entry.start_ticks == ticks:
            return entry.job_id
        job_id = self._lookup(pid)
        self._cache[pid] = _Entry(job_id, ticks, now + self.ttl_s)
        return job_id

    def jobs_of(self, pids: Iterable[int]) -> dict[int, str | None]:
        """`job_of` for many pids; drops cache entries that expired."""
        now = self.clock()
        self._cache = {pid: e for pid, e in self._cache.items() if e.expires_s > now}
        return {pid: self.job_of(pid) for pid in pids}

    def _lookup(self, pid: int) -> str | None:
        job_id = job_from_cgroup(_read(self.proc_root / str(pid) / "cgroup") or "")
        if job_id is None:
            job_id = job_from_ancestry(self.proc_root, pid)
        if job_id is not None or self.slurm is None:
            return job_id
        try:
            return self.slurm.job_of_pid(pid)
        except AigcError as error:
            LOG.warning("scontrol pidinfo %d failed: %s", pid, error)
            return None


# --------------------------------------------------------------------------- per-job rows


@dataclass(frozen=True)
class JobGpuUsage:
    """One job's share of one GPU in one reading (what `job_gpu_samples` stores)."""

    job_id: str
    gpu_index: int
    sm_util_pct: float | None
    memory_used_mib: float
    shared: bool
    pids: tuple[int, ...]


def job_gpu_usage(
    reading: NodeReading,
    pid_jobs: Mapping[int, str | None],
    allocations: Mapping[str, Sequence[int]] | None = None,
) -> list[JobGpuUsage]:
    """Per-job per-GPU rows for `reading` (split rule in the module docstring).

    `allocations` (job id -> GPU indices Slurm gave it) adds a zero row for every
    allocated GPU where the job runs nothing: that is how an over-allocated job shows.
    """
    rows: list[JobGpuUsage] = []
    for gpu in reading.gpus:
        if gpu.lost:
            continue
        allocated = {job for job, gpus in (allocations or {}).items() if gpu.index in gpus}
        rows.extend(_gpu_rows(gpu, pid_jobs, allocated))
    return sorted(rows, key=lambda r: (r.gpu_index, r.job_id))


def _gpu_rows(gpu: GpuReading, pid_jobs: Mapping[int, str | None], allocated: set[str]) -> list[JobGpuUsage]:
    weights = _process_weights(gpu.processes)
    total = sum(weights)
    by_job: dict[str, list[int]] = {}
    for position, process in enumerate(gpu.processes):
        job = pid_jobs.get(process.pid)
        if job is not None:
            by_job.setdefault(job, []).append(position)
    jobs = set(by_job) | allocated
    shared = len(jobs) > 1
    rows = []
    for job in sorted(jobs):
        positions = by_job.get(job, [])
        share = sum(weights[p] for p in positions) / total if total > 0 else 0.0
        util = None if gpu.sm_util_pct is None else round(gpu.sm_util_pct * share, 3)
        memory = sum(gpu.processes[p].used_memory_mib or 0.0 for p in positions)
        pids = tuple(gpu.processes[p].pid for p in positions)
        rows.append(JobGpuUsage(job, gpu.index, util, memory, shared, pids))
    return rows


def _process_weights(processes: Sequence[GpuProcess]) -> list[float]:
    """Per-process weights: own SM util if known for all, else memory, else equal."""
    if not processes:
        return []
    utils = [p.sm_util_pct for p in processes]
    if all(u is not None for u in utils) and sum(u or 0.0 for u in utils) > 0:
        return [float(u or 0.0) for u in utils]
    memory = [p.used_memory_mib or 0.0 for p in processes]
    if sum(memory) > 0:
        return memory
    return [1.0] * len(processes)
