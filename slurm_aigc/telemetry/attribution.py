"""GPU process -> Slurm job, job -> GPUs, and per-job per-GPU usage from one node reading.

Pure: every read of the node goes through a `ProcView` (`procfs.ProcFs` in production) or a
callable handed in, so this module does no I/O and tests hand in fakes.

pid -> job, in order: the pid's cgroup path (`/proc/<pid>/cgroup`, written by Slurm's cgroup
plugin, what Princeton's jobstats relies on); then the pid's ancestry, as
`proctrack/linuxproc` itself tracks jobs: the nearest root-owned `slurmstepd` ancestor
names its step in its command line (`slurmstepd: [123.batch]`); then Slurm's own
lookup (`scontrol pidinfo <pid>`, which asks the slurmd of this host, not slurmctld, and
so fails when several slurmd share a host, as on the local cluster). Results are cached
per (pid, process start time) for `ttl_s`, so a reused pid is never mistaken for the old
process; a failed `scontrol pidinfo` (an error, not an answer) only for `retry_s`.
A process's own `SLURM_JOB_ID` is not used: a process can rewrite its environment.

job -> GPU indices (`JobAllocations`), in order: the record the shipped Prolog wrote for
the job on this node (root-owned, see `daemon/slurm-aigc-jobrecord`); else one lookup per
new job (`SlurmCli.job(ID)`, the only slurmctld RPC an agent makes for a job);
else, while that lookup fails, `SLURM_JOB_GPUS` from the job's processes' environment
(a hint: a process can rewrite its environment, so it is never preferred to Slurm).
A record whose `gpus` is null (Slurm gave the Prolog no GPU list) counts as no record for a
job with processes on a GPU, and, with `look_up_unlisted` (Slurm 23.02+), for every job:
Slurm 24.11's Prolog gets no GPU list after `scontrol reconfigure`, for GPU jobs too.

Splitting a shared GPU (shards, MPS, or several jobs on one GPU) between jobs:
each job's memory is the sum of its processes' memory. The GPU's SM utilization (the
authority: per-process samples cover different windows) is split in proportion to
each process's own SM utilization when NVML gave one for any process on that GPU (a
process without a sample counts 0: NVML keeps none for a process idle since the last
read), else in proportion to used memory, else evenly per process. Processes that belong
to no job keep their share (it is not handed to the jobs). `shared` is true when more than
one job has processes on (or is allocated) the GPU.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_aigc.errors import AigcError
from slurm_aigc.telemetry.procstat import parent_pid_of, start_ticks_of, stat_fields
from slurm_aigc.telemetry.records import GpuProcess, GpuReading, NodeReading

LOG = logging.getLogger(__name__)

# cgroup v1: /slurm/uid_1000/job_123/step_0/task_0 (or /slurm_<node>/... with multiple slurmd)
# cgroup v2: /system.slice/slurmstepd.scope/job_123/step_batch/user/task_0
#            (or /system.slice/<node>_slurmstepd.scope/... with multiple slurmd)
# Anchored at the hierarchy's root, where only root creates cgroups: a user may create any
# path under a cgroup delegated to them (user@UID.service, a container), e.g.
# /user.slice/.../app.slice/slurm-x.service/job_777, and must not charge a neighbour's job.
_SLURM_JOB_RE = re.compile(r"^/(?:slurm(?:_[^/]+)?/uid_\d+|system\.slice/(?:[^/]+_)?slurmstepd\.scope)/job_(\d+)(?:/|$)")


class ProcView(Protocol):
    """What attribution reads of `/proc/<pid>/...` (`procfs.ProcFs`); None when the pid is gone."""

    def stat(self, pid: int) -> str | None: ...

    def status(self, pid: int) -> str | None: ...

    def cmdline(self, pid: int) -> str | None: ...

    def cgroup(self, pid: int) -> str | None: ...

    def environ(self, pid: int) -> str | None: ...


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


def uid_of(status: str | None) -> int | None:
    """The real uid from `/proc/<pid>/status` (`Uid:` line), None if unknown."""
    for line in (status or "").splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return None


def job_from_ancestry(proc: ProcView, pid: int, max_depth: int = 64) -> str | None:
    """Walk parent pids up to the nearest `slurmstepd` owned by root; its step names the job.

    Requiring uid 0 keeps a user's process renamed to `slurmstepd` from claiming a job.
    """
    current = pid
    for _ in range(max_depth):
        stat = proc.stat(current)
        if stat is None or current <= 1:
            return None
        if stat_fields(stat)[0] == "slurmstepd" and uid_of(proc.status(current)) == 0:
            return job_from_stepd_cmdline(proc.cmdline(current) or "")
        parent = parent_pid_of(stat)
        if parent is None:
            return None
        current = parent
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
        proc: ProcView,
        ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = 60.0,
    ) -> None:
        self.slurm = slurm
        self.proc = proc
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self.clock = clock
        self._cache: dict[int, _Entry] = {}

    def job_of(self, pid: int) -> str | None:
        """The Slurm job id of `pid`, or None when it is in no job (or is gone)."""
        now = self.clock()
        ticks = start_ticks_of(self.proc.stat(pid))
        entry = self._cache.get(pid)
        if entry is not None and entry.expires_s > now and entry.start_ticks == ticks:
            return entry.job_id
        job_id, answered = self._lookup(pid)
        # A failed lookup is not "no job": kept for `ttl_s`, the job's own work would read as a
        # stranger's for minutes. Kept `retry_s`, so a hung slurmd costs one timeout per pid per
        # `retry_s`, not per poll.
        self._cache[pid] = _Entry(job_id, ticks, now + (self.ttl_s if answered else self.retry_s))
        return job_id

    def jobs_of(self, pids: Iterable[int]) -> dict[int, str | None]:
        """`job_of` for many pids; drops cache entries that expired."""
        now = self.clock()
        self._cache = {pid: e for pid, e in self._cache.items() if e.expires_s > now}
        return {pid: self.job_of(pid) for pid in pids}

    def _lookup(self, pid: int) -> tuple[str | None, bool]:
        """(job id or None, whether that is an answer rather than a failed `scontrol pidinfo`)."""
        job_id = job_from_cgroup(self.proc.cgroup(pid) or "")
        if job_id is None:
            job_id = job_from_ancestry(self.proc, pid)
        if job_id is not None or self.slurm is None:
            return job_id, True
        try:
            return self.slurm.job_of_pid(pid), True
        except AigcError as error:
            LOG.warning("scontrol pidinfo %d failed (asking again in %.0fs): %s", pid, self.retry_s, error)
            return None, False


# --------------------------------------------------------------------------- job -> GPUs


@dataclass(frozen=True)
class JobRecord:
    """What the Prolog recorded of a job on this node (`daemon/slurm-aigc-jobrecord`)."""

    job_id: str
    node: str
    gpus: frozenset[int] | None  # None: Slurm gave the Prolog no GPU list (no GPUs, or 24.11 after reconfigure)
    user: str | None = None
    account: str | None = None
    admin_comment: str | None = None


def parse_job_record(text: str, job_id: str, node: str) -> JobRecord:
    """A Prolog record's JSON; raises AigcError naming what is wrong (wrong job, node, GPUs)."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise AigcError(f"job record {job_id}: not JSON ({error})") from error
    if not isinstance(document, dict):
        raise AigcError(f"job record {job_id}: not a JSON object")
    if str(document.get("job_id")) != job_id or document.get("node") != node:
        raise AigcError(f"job record {job_id}: names job {document.get('job_id')!r} on node "
                        f"{document.get('node')!r}, expected {job_id} on {node}")
    gpus = document.get("gpus")
    if gpus is not None and (not isinstance(gpus, list)
                             or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)):
        raise AigcError(f"job record {job_id}: gpus must be null or a list of GPU indices, got {gpus!r}")
    listed = None if gpus is None else frozenset(gpus)
    return JobRecord(job_id, node, listed, *(_text(document, k) for k in ("user", "account", "admin_comment")))


def _text(document: Mapping[str, object], key: str) -> str | None:
    value = document.get(key)
    return value if isinstance(value, str) and value else None


def parse_index_env(value: str | None) -> frozenset[int] | None:
    """`0,2-3` -> {0, 2, 3}; None when unset or not an index list (Slurm's `SLURM_JOB_GPUS` form)."""
    if not value:
        return None
    found: set[int] = set()
    for part in value.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        found.update(range(int(first), int(last or first) + 1))
    return frozenset(found)


def environ_value(environ: str | None, name: str) -> str | None:
    """One variable of a NUL-separated `/proc/<pid>/environ`."""
    prefix = name + "="
    for entry in (environ or "").split("\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):]
    return None


# job id -> the GPU indices Slurm gave it on this node (one slurmctld RPC).
AllocationLookup = Callable[[str], frozenset[int]]


@dataclass(frozen=True)
class _Known:
    gpus: frozenset[int]
    retry_at: float | None  # set when Slurm could not be asked: only an environment hint so far


class JobAllocations:
    """job -> GPU indices on one node (an agent `AllocationSource`); rule in the module docstring.

    A job is looked up at most once while it runs (again `retry_s` after a failed lookup),
    and only when the Prolog left no record or one without a GPU list (that one only while
    the job runs on a GPU, unless `look_up_unlisted`): in steady state this asks slurmctld nothing.
    """

    def __init__(
        self,
        node: str,
        records: Callable[[], Mapping[str, str]] | None,
        lookup: AllocationLookup | None,
        proc: ProcView | None,
        *,
        look_up_unlisted: bool = False,
        retry_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self._look_up_unlisted = look_up_unlisted
        self._records = records
        self._lookup = lookup
        self._proc = proc
        self._retry_s = retry_s
        self._clock = clock
        self._known: dict[str, _Known] = {}
        self._recorded: dict[str, frozenset[int]] = {}
        self._bad: set[str] = set()
        self.lookups = 0  # slurmctld lookups made (the benchmark and tests read it)

    def __call__(self, pid_jobs: Mapping[int, str | None]) -> Mapping[str, Sequence[int]]:
        """The GPUs of every job that has a record or a process on this node now."""
        running = {job for job in pid_jobs.values() if job is not None}
        recorded, unlisted = self._read_records()
        # A record the Epilog just removed still holds while the job's processes exit.
        ending = {job: gpus for job, gpus in self._recorded.items() if job in running and job not in recorded}
        self._recorded = {**ending, **recorded}
        ask = (running | (unlisted if self._look_up_unlisted else set())) - set(self._recorded)
        self._known = {job: known for job, known in self._known.items() if job in ask}
        for job in sorted(ask):
            self._known[job] = self._learn(job, pid_jobs)
        found = {job: known.gpus for job, known in self._known.items()} | self._recorded
        return {job: sorted(gpus) for job, gpus in found.items() if gpus}

    def _read_records(self) -> tuple[dict[str, frozenset[int]], set[str]]:
        """(job -> GPUs of the records that list them, jobs whose record lists none)."""
        recorded: dict[str, frozenset[int]] = {}
        unlisted: set[str] = set()
        for job, text in (self._records() if self._records is not None else {}).items():
            try:
                gpus = parse_job_record(text, job, self.node).gpus
            except AigcError as error:
                if job not in self._bad:
                    self._bad.add(job)
                    LOG.warning("ignoring a job record: %s", error)
                continue
            if gpus is None:
                unlisted.add(job)
            else:
                recorded[job] = gpus
        return recorded, unlisted

    def _learn(self, job: str, pid_jobs: Mapping[int, str | None]) -> _Known:
        known = self._known.get(job)
        if known is not None and (known.retry_at is None or self._clock() < known.retry_at):
            return known
        if self._lookup is not None:
            self.lookups += 1
            try:
                return _Known(self._lookup(job), None)
            except AigcError as error:
                LOG.warning("cannot look up the GPUs of job %s (retrying in %.0fs): %s", job, self._retry_s, error)
        hint = self._environ_gpus([pid for pid, owner in pid_jobs.items() if owner == job])
        return _Known(hint, self._clock() + self._retry_s)

    def _environ_gpus(self, pids: Sequence[int]) -> frozenset[int]:
        if self._proc is None:
            return frozenset()
        for pid in sorted(pids):
            gpus = parse_index_env(environ_value(self._proc.environ(pid), "SLURM_JOB_GPUS"))
            if gpus is not None:
                return gpus
        return frozenset()


# --------------------------------------------------------------------------- per-job rows


@dataclass(frozen=True)
class JobGpuUsage:
    """One job's share of one GPU in one reading (what `job_gpu_samples` stores)."""

    job_id: str
    gpu_index: int
    sm_util_pct: float | None
    memory_used_mib: float | None  # None: unknown (work on the GPU that NVML shows under no job)
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
    # Work NVML shows under no job (no process list at all, MPS clients, another container's
    # pids, a pid whose job lookup failed) may be an allocated job's: it must never read as that
    # job's idleness, which reclaim would act on. A GPU Slurm gave one job alone is that job's
    # whole; among several, a job with nothing attributed is unknown, not idle. Its memory is
    # unknown either way: that work may be a stranger's (a user's process outside any job, a
    # finished job's stray), and charging it to the job would get the memory guard to requeue
    # the innocent job and leave the hog running.
    unexplained = any(pid_jobs.get(p.pid) is None for p in gpu.processes) or (
        not gpu.processes and (gpu.sm_util_pct or 0.0) > 0.0)
    rows = []
    for job in sorted(jobs):
        positions = by_job.get(job, [])
        if not positions and unexplained:
            alone = len(jobs) == 1
            util = gpu.sm_util_pct if alone else None
            rows.append(JobGpuUsage(job, gpu.index, util, None, shared, ()))
            continue
        share = sum(weights[p] for p in positions) / total if total > 0 else 0.0
        util = None if gpu.sm_util_pct is None else round(gpu.sm_util_pct * share, 3)
        memory = sum(gpu.processes[p].used_memory_mib or 0.0 for p in positions)
        pids = tuple(gpu.processes[p].pid for p in positions)
        rows.append(JobGpuUsage(job, gpu.index, util, memory, shared, pids))
    return rows


def _process_weights(processes: Sequence[GpuProcess]) -> list[float]:
    """Per-process weights: own SM util if known for any (a process without a sample counts 0),
    else memory, else equal."""
    if not processes:
        return []
    # NVML keeps no sample for a process idle since the last read: weighing all by memory then
    # would hand an idle process holding much memory the busy one's work, and reclaim its job.
    utils = [p.sm_util_pct or 0.0 for p in processes]
    if sum(utils) > 0:
        return utils
    memory = [p.used_memory_mib or 0.0 for p in processes]
    if sum(memory) > 0:
        return memory
    return [1.0] * len(processes)
