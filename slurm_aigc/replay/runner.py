"""Runs a workload on a cluster, as stock Slurm or with slurm-aigc, and collects its records.

The one place with replay side effects: installs the hook (or a pass-through one), starts
one agent per node and (for slurm-aigc) the controller as subprocesses, submits each job at
its offset with `sbatch`, waits until every job has ended, then reads what happened from
sacct and the samples database. In backlogged mode (`RunSettings.backlog`) it instead keeps
that many jobs of the stream pending for `duration_s`, then cancels what is left. Agents run in both modes (observing only in stock mode),
so both runs' utilization is measured the same way.

A job that FAILED (in the simulator: a CUDA out-of-memory, the job larger than its GPU or than
what its neighbours left) is resubmitted once, as its user would after reading the error,
asking for the cluster's largest GPU type (`retry_args`); the two attempts are one job in the
figures (`merge_retry`): its wait runs from the first submit to the retry's start.

The cluster is a `ReplayCluster` handed in by the CLI (the local dev cluster satisfies it),
and what the daemons recorded is read through the telemetry and reclaim stores.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import yaml

from slurm_aigc.children import spawn_logged, stop_all
from slurm_aigc.db import DB_LONG_TIMEOUT_S, open_database
from slurm_aigc.errors import AigcError, SlurmCommandError
from slurm_aigc.policy.install import install_hook
from slurm_aigc.profiles import Phase, format_phases, total_seconds
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.replay.metrics import END_STATES, JobOutcome, UsageSample
from slurm_aigc.replay.timescale import replay_policy, workload_compression
from slurm_aigc.replay.workload import Workload, WorkloadJob
from slurm_aigc.report.sacct import JobRecord, SacctQuery, SacctReader, SkippedRow
from slurm_aigc.report.tres import gpu_equivalents, holds_shared_fraction, shares_a_gpu
from slurm_aigc.slurm import SlurmCli
from slurm_aigc.telemetry.gres import expand_nodes
from slurm_aigc.telemetry.simgpu import SIM_GPU_MODELS
from slurm_aigc.telemetry.store import TelemetryStore
from slurm_aigc.units import MIB_PER_GIB

Progress = Callable[[str], None]
MODES = ("stock", "aigc")
SLURM_AIGC_BIN = str(Path(sys.executable).with_name("slurm-aigc"))


class ClusterGpuModel(Protocol):
    @property
    def gres_type(self) -> str: ...
    @property
    def memory_gib(self) -> int: ...


class ClusterNode(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def gpu(self) -> ClusterGpuModel: ...
    @property
    def shards_per_gpu(self) -> int: ...


class ClusterShape(Protocol):
    @property
    def nodes(self) -> Sequence[ClusterNode]: ...
    @property
    def total_gpus(self) -> int: ...


class ReplayCluster(Protocol):
    """What a replay needs of a cluster (`slurm_aigc.localcluster.manager.LocalCluster` has it)."""

    slurm: SlurmCli
    simgpu_dir: Path

    @property
    def etc_dir(self) -> Path: ...
    def job_command(self) -> list[str]: ...
    def shape(self) -> ClusterShape: ...


@dataclass(frozen=True)
class RunSettings:
    """How one replay run is driven; `policy` is the slurm-aigc policy file for mode aigc.

    `users` submit the jobs (and have their leftovers cancelled); `passthrough_hook` is the
    job_submit.lua installed for stock mode.
    """

    mode: str
    policy: Path
    out_dir: Path
    users: tuple[str, ...]
    passthrough_hook: str
    agent_interval_s: float = 2.0
    controller_interval_s: float = 3.0
    timeout_s: float = 1800.0
    progress_every_s: float = 10.0
    backlog: int = 0  # > 0: backlogged mode, keep this many jobs pending for `duration_s`
    duration_s: float = 0.0
    backlog_tick_s: float = 1.0
    # The daemons' database (URL or URL file), kept as it is: a run on top of an earlier run's
    # history (a warm learned table). None: a fresh, empty database for each run.
    db: str | None = None


@dataclass(frozen=True)
class RunRecord:
    """What a run produced: per-job outcomes, GPU samples, reclaimed GPU-hours, skipped sacct rows."""

    mode: str
    outcomes: tuple[JobOutcome, ...]
    samples: tuple[UsageSample, ...]
    capacity_gpus: int
    gpu_hours_reclaimed: float
    skipped: tuple[SkippedRow, ...] = ()
    job_ids: dict[str, str] = field(default_factory=dict)
    end_ts: float = 0.0
    start_ts: float = 0.0
    backlog: int = 0  # > 0: a backlogged run, judged over [start_ts, start_ts + duration_s]
    duration_s: float = 0.0
    stream_exhausted: bool = False


# ---------------------------------------------------------------- pure parts

class ListedJob(Protocol):
    """What the backlog count needs of one `SlurmCli.jobs()` entry."""

    @property
    def job_id(self) -> str: ...
    @property
    def state(self) -> str: ...


def pending_count(listing: Iterable[ListedJob], ours: Collection[str]) -> int:
    """Our jobs that are PENDING in one listing (a requeued job pending again counts)."""
    return sum(1 for job in listing if job.job_id in ours and job.state.split()[0] == "PENDING")


@dataclass(frozen=True)
class Backlog:
    """Backlogged mode: keep `size` jobs pending from `start_ts` for `duration_s`, then stop."""

    size: int
    duration_s: float
    start_ts: float

    def __post_init__(self) -> None:
        if self.size < 1 or self.duration_s <= 0:
            raise ValueError(f"a backlog needs size >= 1 and duration_s > 0, got {self.size}, {self.duration_s}")

    @property
    def end_ts(self) -> float:
        return self.start_ts + self.duration_s

    def over(self, now: float) -> bool:
        return now >= self.end_ts

    def to_submit(self, now: float, pending: int, remaining: int) -> int:
        """How many of the stream's next jobs to submit now: the shortfall, never past the end or the stream."""
        if self.over(now):
            return 0
        return max(0, min(self.size - pending, remaining))


def nominal_work_gpu_s(job: WorkloadJob) -> float:
    """Busy GPU-seconds the job does when it runs as written: its busy phases on the GPUs it loads.

    A hung job's work goes on in its requeue profile (the rest of it); other requeue profiles
    redo or finish work already counted.
    """
    phases = [*job.profile, *(job.requeue_profile if any(p.kind == "hung" for p in job.profile) else ())]
    return job.effective_gpus_used * sum(p.seconds for p in phases if p.kind == "busy")


def largest_gpu_type(shape: ClusterShape) -> str | None:
    """The GPU type with the most memory (a user whose job ran out of GPU memory asks for it)."""
    models = [node.gpu for node in shape.nodes]
    return max(models, key=lambda m: (m.memory_gib, m.gres_type)).gres_type if models else None


def retry_args(job: WorkloadJob, gpu_type: str | None) -> list[str]:
    """`sbatch_args` of a resubmission after an out-of-memory failure: the same job on `gpu_type`."""
    typed = f"--gres=gpu:{gpu_type}:{job.gpus}" if gpu_type else f"--gres=gpu:{job.gpus}"
    return [typed if arg.startswith("--gres=") else arg for arg in sbatch_args(job)]


def merge_retry(first: JobOutcome, retry: JobOutcome, failed_where_it_fits: bool = False) -> JobOutcome:
    """One outcome for a job and its resubmission: the retry's run, with both attempts' spells in the
    queue (its wait) and both attempts' GPU time (allocated).

    A first attempt that failed on shards of a shared GPU is marked: a neighbour took the memory,
    so sharing harmed the job. So is one that failed on a whole GPU its job fits
    (`failed_where_it_fits`): only a shard job Slurm 22.05 left on that GPU can have taken it.
    """
    allocated = (first.allocated_gpu_s or 0.0) + (retry.allocated_gpu_s or 0.0)
    spells = (first.queued or ((first.submit_ts, first.start_ts),)) + (retry.queued or ((retry.submit_ts, retry.start_ts),))
    return replace(retry, job_id=first.job_id, submit_ts=first.submit_ts, allocated_gpu_s=allocated,
                   requeues=first.requeues + retry.requeues, retried=True,
                   failed_shared=first.shared or failed_where_it_fits, queued=spells)


def user_for(job: WorkloadJob, index: int, users: Sequence[str]) -> str:
    """The workload's user when it is one of ours, else spread over the test users."""
    return job.user if job.user in users else users[index % len(users)]


def sbatch_args(job: WorkloadJob) -> list[str]:
    """The sbatch options a user would type for this job (the hook may narrow them)."""
    args = [
        f"--job-name={job.name}",
        f"--gres=gpu:{job.gpus}",
        f"--time={max(1, -(-job.time_limit_s // 60))}",
        "--chdir=/tmp",
        "--output=/dev/null",
        "--requeue" if job.requeue else "--no-requeue",
    ]
    if job.tags:
        args.append(f"--comment={job.tags}")
    return args


def job_script(job: WorkloadJob, slurm_aigc_cmd: Sequence[str] = (SLURM_AIGC_BIN,)) -> str:
    """The batch script: `slurm-aigc gpu-load` playing the job's profile on the GPUs it got.

    After a requeue (SLURM_RESTART_COUNT > 0) it plays `requeue_profile`, or exits at once
    when that is empty (the work was done, e.g. an idle tail); an over-allocated job loads
    only the first `gpus_used` of its GPUs. Busy phases are work-conserving: a job packed
    onto a crowded GPU runs longer instead of losing the work the GPU could not do.
    """
    only_used = 0 < job.gpus_used < job.gpus
    first = _gpu_load(slurm_aigc_cmd, job, job.profile, only_used)
    again = _gpu_load(slurm_aigc_cmd, job, job.requeue_profile, only_used) if job.requeue_profile else "true"
    select_gpus = (f'GPUS=$(echo "${{SLURM_JOB_GPUS:-${{CUDA_VISIBLE_DEVICES}}}}" | cut -d, -f1-{job.gpus_used})\n'
                   if only_used else "")
    return (
        "#!/bin/bash\n"
        f"# slurm-aigc replay job {job.name} ({job.job_class})\n"
        f"{select_gpus}"
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then\n'
        f"    exec {again}\n"
        "fi\n"
        f"exec {first}\n"
    )


def _gpu_load(slurm_aigc_cmd: Sequence[str], job: WorkloadJob, phases: Sequence[Phase], only_used: bool) -> str:
    argv = [*slurm_aigc_cmd, "gpu-load", "--seconds", f"{total_seconds(phases):g}", "--util", f"{job.util_pct or 85:g}",
            "--mem", f"{max(job.mem_used_gib_per_gpu, 0.1):g}G", "--profile-spec", format_phases(phases),
            "--work-conserving"]
    return shlex.join(argv) + (' --gpus "$GPUS"' if only_used else "")


def records_by_job(records: Iterable[JobRecord]) -> dict[str, list[JobRecord]]:
    """sacct's records per job id, in their order (a requeued job has one per run)."""
    by_job: dict[str, list[JobRecord]] = {}
    for record in records:
        by_job.setdefault(record.job_id_raw, []).append(record)
    return by_job


def hung_spans(records: Sequence[JobRecord], jobs: Mapping[str, WorkloadJob]) -> dict[str, list[tuple[float, float]]]:
    """Per job id, the spans its workload profile has it hung (spinning at high SM, no work).

    Each run plays `profile` from its start, a run after a requeue `requeue_profile`
    (`job_script`). The spans are nominal: a busy phase stretched by a crowded GPU
    (`--work-conserving`) moves the hang later, so a span may cover a little of the work before
    it, which is then not counted useful: the error goes against the sharing that stretched it.
    """
    spans: dict[str, list[tuple[float, float]]] = {}
    for job_id, rows in records_by_job(records).items():
        job = jobs.get(job_id)
        if job is None:
            continue
        started = sorted((r for r in rows if r.start_ts is not None), key=lambda r: r.start_ts or 0.0)
        for number, run in enumerate(started):
            assert run.start_ts is not None
            offset = run.start_ts
            for phase in job.profile if number == 0 else job.requeue_profile:
                if phase.kind == "hung":
                    end = offset + phase.seconds if run.end_ts is None else min(offset + phase.seconds, run.end_ts)
                    if end > offset:
                        spans.setdefault(job_id, []).append((offset, end))
                offset += phase.seconds
    return spans


def hung_sm(rows: Iterable[tuple[float, str, int, str, float | None]],
            spans: Mapping[str, Sequence[tuple[float, float]]]) -> dict[tuple[float, str, int], float]:
    """(ts, node, gpu) -> SM % drawn there by jobs inside one of their hung spans."""
    found: dict[tuple[float, str, int], float] = {}
    for ts, node, index, job_id, util in rows:
        if util and any(start <= ts < end for start, end in spans.get(job_id, ())):
            found[(ts, node, index)] = found.get((ts, node, index), 0.0) + util
    return found


def outcomes_from_records(records: Sequence[JobRecord], classes: dict[str, str],
                          shards_per_gpu: dict[str, int], jobs: Mapping[str, WorkloadJob] | None = None) -> list[JobOutcome]:
    """One JobOutcome per job from its sacct records (a requeued job has several); `jobs` (by job id)
    adds what the workload says each job should do."""
    outcomes = [_outcome(job_id, rows, classes.get(job_id, rows[-1].aigc_class), shards_per_gpu)
                for job_id, rows in sorted(records_by_job(records).items(), key=lambda item: int(item[0]))]
    return [with_workload(o, (jobs or {}).get(o.job_id)) for o in outcomes]


def merge_retries(outcomes: Sequence[JobOutcome], retries: Mapping[str, str],
                  failed_where_it_fits: Collection[str] = ()) -> list[JobOutcome]:
    """`outcomes` with each resubmission merged into its first attempt (`merge_retry`), in the first's
    place; `failed_where_it_fits`: first attempts that failed on GPUs their job fits (`fit_failures`)."""
    by_id = {o.job_id: o for o in outcomes}
    retry_ids = set(retries.values())
    merged = []
    for outcome in outcomes:
        if outcome.job_id in retry_ids:
            continue
        retry = by_id.get(retries.get(outcome.job_id, ""))
        merged.append(merge_retry(outcome, retry, outcome.job_id in failed_where_it_fits) if retry is not None else outcome)
    return merged


def simulated_memory_gib(shape: ClusterShape) -> dict[str, float]:
    """GiB each node's simulated GPUs hold, as gpu-load checks a job's memory against them: a t4
    holds 15 GiB, not the 16 it is sold as (a 15.6 GiB job fails there alone)."""
    return {n.name: SIM_GPU_MODELS[n.gpu.gres_type].memory_total_mib / MIB_PER_GIB for n in shape.nodes}


def fit_failures(records: Iterable[JobRecord], retries: Mapping[str, str], jobs: Mapping[str, WorkloadJob],
                 memory_gib_by_node: Mapping[str, float], shards_per_gpu: Mapping[str, int]) -> set[str]:
    """First attempts that FAILED on whole GPUs whose memory holds what their job uses: the memory
    was another job's (on Slurm 22.05 a shard job still on a GPU Slurm handed out whole)."""
    found = set()
    for job_id, rows in records_by_job(records).items():
        job = jobs.get(job_id)
        failed = [r for r in rows if r.state.split()[0] == "FAILED" and r.start_ts is not None]
        if job_id not in retries or job is None or not failed:
            continue
        last = failed[-1]
        memory = [memory_gib_by_node.get(node) for node in expand_nodes(last.node_list)] if last.node_list else []
        if not shares_a_gpu(last.tres, shards_per_gpu, last.node_list) and memory and all(m is not None and job.mem_used_gib_per_gpu <= m for m in memory):
            found.add(job_id)
    return found


def with_workload(outcome: JobOutcome, job: WorkloadJob | None) -> JobOutcome:
    if job is None:
        return outcome
    return replace(outcome, work_gpu_s=nominal_work_gpu_s(job), nominal_s=total_seconds(job.profile),
                   hangs=any(p.kind == "hung" for p in job.profile), work_end_s=work_end_s(job))


def work_end_s(job: WorkloadJob) -> float | None:
    """When an idle-tail job's work is done, from its run's start (its profile less the final idle
    phase; a requeued run has nothing left to do); None for a job that works to its end."""
    if job.requeue_profile or not job.profile or job.profile[-1].kind != "idle":
        return None
    return total_seconds(job.profile) - job.profile[-1].seconds


def _outcome(job_id: str, rows: list[JobRecord], job_class: str, shards_per_gpu: dict[str, int]) -> JobOutcome:
    rows = sorted(rows, key=lambda r: (r.start_ts or r.submit_ts or 0.0))
    last = rows[-1]
    whole, fraction, resolved = gpu_equivalents(last.tres, shards_per_gpu, last.node_list)
    allocated = 0.0
    for row in rows:
        if row.start_ts is not None:
            row_whole, row_fraction, _ = gpu_equivalents(row.tres, shards_per_gpu, row.node_list)
            allocated += (row_whole + row_fraction) * ((row.end_ts or time.time()) - row.start_ts)
    submit = min(r.submit_ts for r in rows if r.submit_ts is not None) if any(r.submit_ts for r in rows) else 0.0
    starts = [r.start_ts for r in rows if r.start_ts is not None]
    ran = [r for r in rows if r.start_ts is not None]
    return JobOutcome(
        job_id=job_id, job_class=job_class, gpus=whole + fraction, submit_ts=submit,
        start_ts=min(starts) if starts else None, end_ts=last.end_ts, state=last.state.split()[0],
        requeues=sum(1 for r in rows if r.requeued), allocated_gpu_s=allocated,
        shared=holds_shared_fraction(last.tres, fraction, resolved), last_start_ts=last.start_ts,
        queued=tuple((r.submit_ts, r.start_ts) for r in rows if r.submit_ts is not None),
        first_end_ts=ran[0].end_ts if ran else None,
    )


# ---------------------------------------------------------------- the run

class ReplayRun:
    """One run of a workload in one mode on the local cluster."""

    def __init__(self, workload: Workload, settings: RunSettings, cluster: ReplayCluster, progress: Progress) -> None:
        if settings.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {settings.mode!r}")
        self.workload = workload
        self.settings = settings
        self.cluster = cluster
        self.slurm: SlurmCli = cluster.slurm
        self.progress = progress
        self.db_url = f"sqlite:///{settings.out_dir.resolve()}/{settings.mode}.db"
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.job_ids: dict[str, str] = {}
        self.refused: dict[str, float] = {}  # job name -> when sbatch refused it
        self.submitted: dict[str, float] = {}  # job id -> when sbatch took it
        self.timed_out: set[str] = set()  # open-loop: ids still not ended at --timeout (then cancelled)
        self.retries: dict[str, str] = {}  # id of a job that FAILED -> id of its resubmission
        self.users_by_name: dict[str, str] = {}
        self.stream_exhausted = False
        self.scaled_policy: dict[str, Any] = {}
        self.job_command = cluster.job_command()

    def _fresh_database(self) -> str:
        """This run's own empty database: on the cluster's MariaDB when it has one (the multi-host
        path; `LocalCluster.scratch_database` returns a URL file's path), else a SQLite file;
        `settings.db` when given, not emptied."""
        if self.settings.db:
            return self.settings.db
        scratch = getattr(self.cluster, "scratch_database", None)  # not in ReplayCluster: fakes have none
        if callable(scratch):
            try:
                return str(scratch(f"replay_{self.settings.mode}"))
            except AigcError as error:
                self.progress(f"no MariaDB database for the run ({error}); using SQLite")
        path = self.settings.out_dir.resolve() / f"{self.settings.mode}.db"
        path.unlink(missing_ok=True)
        return f"sqlite:///{path}"

    def run(self) -> RunRecord:
        self.settings.out_dir.mkdir(parents=True, exist_ok=True)
        self.policy = self._write_run_policy()
        self.db_url = self._fresh_database()
        open_database(self.db_url)
        self._prepare_cluster()
        started = time.time()
        backlog: Backlog | None = None
        try:
            self._start_daemons()
            if self.settings.backlog > 0:
                backlog = Backlog(self.settings.backlog, self.settings.duration_s, time.time())
                self.stream_exhausted = self._submit_backlogged(backlog)
                self._cancel_leftovers()  # the window is over: what is left is cut, not waited for
            else:
                self._submit_all(started)
                self._wait_all_ended(started)
        finally:
            self._stop_daemons()
            self._cancel_leftovers()
        record = self._collect(started)
        if backlog is None:
            return record
        return replace(record, start_ts=backlog.start_ts, backlog=backlog.size, duration_s=backlog.duration_s,
                       stream_exhausted=self.stream_exhausted)

    # ---- steps
    def _write_run_policy(self) -> Path:
        """The policy with durations compressed like the workload; stock agents publish nothing."""
        compression = workload_compression(self.workload.meta).factor
        site = yaml.safe_load(self.settings.policy.read_text()) or {}
        scaled = replay_policy(site, compression, self.settings.agent_interval_s, publish_features=self.settings.mode == "aigc")
        self.scaled_policy = scaled
        path = self.settings.out_dir / f"{self.settings.mode}-policy.yaml"
        path.write_text(f"# {self.settings.policy} with durations divided by {compression:g} for replay\n"
                        + yaml.safe_dump(scaled, sort_keys=False))
        return path

    def _prepare_cluster(self) -> None:
        """Nothing of ours queued; the hook of this mode installed; features/weights reset."""
        self._cancel_leftovers()
        if self.settings.mode == "aigc":
            _run_cli(["policy", "install", "--policy", str(self.policy),
                      "--slurm-conf-dir", str(self.cluster.etc_dir)])
        else:
            install_hook(self.settings.passthrough_hook, self.cluster.etc_dir)
        # reconfigure also drops features/weights a previous run's publisher set; the hook must
        # then not prefer model features Slurm no longer has (Slurm rejects such a --prefer).
        self.slurm.reconfigure()
        published = (self.scaled_policy.get("scoring") or {}).get("published_features_file")
        if published and Path(published).exists():
            Path(published).write_text("")
        self.progress(f"{self.settings.mode}: hook {'installed' if self.settings.mode == 'aigc' else 'pass-through'}, cluster reset")

    def _start_daemons(self) -> None:
        log_dir = self.settings.out_dir / f"{self.settings.mode}-logs"
        log_dir.mkdir(exist_ok=True)
        env = dict(os.environ, SLURM_AIGC_SIMGPU_DIR=str(self.cluster.simgpu_dir), PYTHONUNBUFFERED="1")
        common = ["--config", str(self.policy), "--db", self.db_url]
        for node in self.cluster.shape().nodes:
            argv = ["agent", *common, "--backend", "sim", "--node", node.name, "--interval", f"{self.settings.agent_interval_s:g}"]
            self.daemons.append(_spawn(argv, log_dir / f"agent-{node.name}.log", env))
        if self.settings.mode == "aigc":
            argv = ["controller", *common, "--interval", f"{self.settings.controller_interval_s:g}", "--no-dry-run"]
            self.daemons.append(_spawn(argv, log_dir / "controller.log", env))
        self.progress(f"{self.settings.mode}: {len(self.daemons)} daemons started (logs in {log_dir})")

    def _submit_all(self, started: float) -> None:
        jobs = self.workload.jobs
        next_report = started
        for index, job in enumerate(jobs):
            delay = started + job.submit_offset_s - time.time()
            if delay > 0:
                time.sleep(delay)  # the workload's own arrival clock, not a test wait
            self._submit(index, job)
            if time.time() >= next_report:
                self.progress(f"{self.settings.mode}: submitted {index + 1}/{len(jobs)}")
                next_report = time.time() + self.settings.progress_every_s

    def _submit(self, index: int, job: WorkloadJob) -> None:
        user = self.users_by_name[job.name] = user_for(job, index, self.settings.users)
        try:
            job_id = self.job_ids[job.name] = self.slurm.submit(sbatch_args(job), job_script(job, self.job_command), user=user)
            self.submitted[job_id] = time.time()
        except SlurmCommandError as error:  # a refused job is a result (counted as lost), not a crash
            self.refused[job.name] = time.time()
            self.progress(f"{self.settings.mode}: {job.name} refused by sbatch: {error.stderr.strip().splitlines()[-1:]}")

    def _ours(self) -> set[str]:
        return {*self.job_ids.values(), *self.retries.values()}

    def _retry_failed(self, listing: Iterable[ListedJob]) -> list[str]:
        """Resubmit each first attempt that FAILED since the last look; the new job ids."""
        names = {job_id: name for name, job_id in self.job_ids.items()}
        by_name = {job.name: job for job in self.workload.jobs}
        new = []
        for listed in listing:
            name = names.get(listed.job_id)
            if name is None or listed.job_id in self.retries or listed.state.split()[0] != "FAILED":
                continue
            job = by_name[name]
            try:
                gpu_type = largest_gpu_type(self.cluster.shape())
                retry = self.slurm.submit(retry_args(job, gpu_type), job_script(job, self.job_command),
                                          user=self.users_by_name[name])
            except SlurmCommandError as error:
                self.progress(f"{self.settings.mode}: resubmitting {name} refused: {error.stderr.strip().splitlines()[-1:]}")
                retry = ""
            self.retries[listed.job_id] = retry
            if retry:
                new.append(retry)
        return new

    def _submit_backlogged(self, backlog: Backlog) -> bool:
        """Submit the stream in order, topping the pending jobs up to the backlog once per tick (one
        `squeue` listing a tick), until the window ends. True when the stream ran out first."""
        jobs = self.workload.jobs
        position = 0
        next_report = backlog.start_ts
        while not backlog.over(now := time.time()):
            listing = self.slurm.jobs() if self.job_ids else []
            self._retry_failed(listing)
            pending = pending_count(listing, self._ours())
            for _ in range(backlog.to_submit(now, pending, len(jobs) - position)):
                self._submit(position, jobs[position])
                position += 1
            if now >= next_report:
                self.progress(f"{self.settings.mode}: t={now - backlog.start_ts:4.0f}s of {backlog.duration_s:g}s  "
                              f"submitted {position}/{len(jobs)}, pending {pending}")
                next_report = now + self.settings.progress_every_s
            time.sleep(max(0.0, min(self.settings.backlog_tick_s, backlog.end_ts - time.time())))  # the tick clock
        if position >= len(jobs):
            self.progress(f"{self.settings.mode}: the job stream ran out before the window ended; the backlog was not kept")
        return position >= len(jobs)

    def _wait_all_ended(self, started: float) -> None:
        deadline = started + self.settings.timeout_s
        pending_ids = set(self.job_ids.values())
        while pending_ids and time.time() < deadline:
            listing = self.slurm.jobs()
            pending_ids.update(self._retry_failed(listing))
            live = {job.job_id: job for job in listing if job.job_id in pending_ids}
            pending_ids = {job_id for job_id, job in live.items() if job.state.split()[0] not in END_STATES}
            running = sum(1 for job in live.values() if job.state.startswith("RUNNING"))
            self.progress(f"{self.settings.mode}: t={time.time() - started:5.0f}s  "
                          f"running {running}, waiting {len(pending_ids) - running}, ended {len(self.job_ids) - len(pending_ids)}")
            if pending_ids:
                time.sleep(min(self.settings.progress_every_s, 5.0))
        if pending_ids:
            self.timed_out = set(pending_ids)  # the cleanup's cancel will end them: they are lost, not cancelled
            self.progress(f"{self.settings.mode}: timeout: {len(pending_ids)} jobs still not ended; counted as lost")

    def _stop_daemons(self) -> None:
        stop_all(self.daemons, timeout_s=20)
        self.daemons.clear()

    def _cancel_leftovers(self) -> None:
        users = self.settings.users
        for user in users:
            self.slurm.run("scancel", ["-u", user])
        deadline = time.time() + 60
        while time.time() < deadline and any(j.user in users and j.state.split()[0] not in END_STATES
                                             for j in self.slurm.jobs()):
            time.sleep(1)

    def _collect(self, started: float) -> RunRecord:
        ids = tuple(self.job_ids.values())
        retries = {first: retry for first, retry in self.retries.items() if retry}
        records, skipped = self._sacct((*ids, *retries.values()), started) if ids else ([], [])
        classes = {job_id: job.job_class for job in self.workload.jobs if (job_id := self.job_ids.get(job.name))}
        shards = {n.gpu.gres_type: n.shards_per_gpu for n in self.cluster.shape().nodes}
        by_id = {job_id: job for job in self.workload.jobs if (job_id := self.job_ids.get(job.name))}
        by_id.update({retry: by_id[first] for first, retry in retries.items() if first in by_id})
        classes.update({retry: classes[first] for first, retry in retries.items() if first in classes})
        misfits = fit_failures(records, retries, by_id, simulated_memory_gib(self.cluster.shape()), shards)
        outcomes = [replace(o, state="LOST (timeout)") if o.job_id in self.timed_out else o
                    for o in merge_retries(outcomes_from_records(records, classes, shards, by_id), retries, misfits)]
        # A job sacct never heard of was lost by the scheduler (or refused): count it.
        seen = {o.job_id for o in outcomes}
        for job_id in ids:
            if job_id not in seen:
                outcomes.append(JobOutcome(job_id, classes.get(job_id, "unknown"), 0.0, self.submitted.get(job_id, started),
                                           None, None, "LOST"))
        by_name = {job.name: job for job in self.workload.jobs}
        for name, submitted in self.refused.items():
            outcomes.append(JobOutcome(f"refused:{name}", by_name[name].job_class, 0.0, submitted, None, None, "REFUSED"))
        samples, reclaimed = self._samples(started, hung_spans(records, by_id))
        return RunRecord(self.settings.mode, tuple(outcomes), samples, self.cluster.shape().total_gpus, reclaimed,
                         tuple(skipped), dict(self.job_ids), time.time())

    def _sacct(self, ids: tuple[str, ...], started: float) -> tuple[list[JobRecord], list[SkippedRow]]:
        query = SacctQuery(since=datetime.fromtimestamp(started) - timedelta(minutes=1),
                           until=datetime.now() + timedelta(minutes=1), job_ids=ids)
        records: list[JobRecord] = []
        skipped: list[SkippedRow] = []
        deadline = time.time() + 60
        while True:  # slurmdbd records job ends asynchronously
            records, skipped = [], []
            for row in SacctReader(self.slurm).rows(query):
                (skipped if isinstance(row, SkippedRow) else records).append(row)  # type: ignore[arg-type]
            ended = {r.job_id_raw for r in records if r.end_ts is not None and not r.requeued}
            if len(ended) >= len(set(ids)) or time.time() > deadline:
                return records, skipped
            time.sleep(1)

    def _samples(self, started: float, spans: Mapping[str, Sequence[tuple[float, float]]]
                 ) -> tuple[tuple[UsageSample, ...], float]:
        factory = open_database(self.db_url, timeout_s=DB_LONG_TIMEOUT_S)  # the whole run's samples at once
        store = TelemetryStore(factory)
        rows = store.gpu_power_utilization_since(started)
        hung = hung_sm(store.job_sm_since(started), spans) if spans else {}
        samples = tuple(UsageSample(ts, node, index, util or 0.0, power, limit, hung.get((ts, node, index), 0.0))
                        for ts, node, index, util, power, limit in rows)
        return samples, ReclaimStore(factory).gpu_hours_recovered()


def _spawn(args: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return spawn_logged([SLURM_AIGC_BIN, *args], log, env)


def _run_cli(args: Sequence[str]) -> None:
    result = subprocess.run([SLURM_AIGC_BIN, *args], capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise AigcError(f"slurm-aigc {' '.join(args)} failed: {result.stderr.strip()[-600:]}")


def run_modes(workload: Workload, modes: Sequence[str], settings: RunSettings, cluster: ReplayCluster,
              progress: Progress) -> list[RunRecord]:
    """Run the same workload once per mode (`settings.mode` is replaced), one after the other, on the same cluster."""
    records = []
    for mode in modes:
        settings = replace(settings, mode=mode)
        progress(f"{mode}: replaying {len(workload.jobs)} jobs")
        records.append(ReplayRun(workload, settings, cluster, progress).run())
    return records
