"""The comparison figures of a replay run, computed from its records (pure: data in, data out).

Inputs are typed rows the runner collects (from sacct and the samples database):
`JobOutcome` per job, `UsageSample` per GPU per poll, the cluster's GPU count and the GPU-hours
the reclaim audit trail says were recovered. Definitions (docs/replay.md):

- window: from the first submit to the last end (jobs that never ended extend it to `now_ts`
  when given); makespan = its length;
- GPU allocation ratio = allocated GPU-seconds / (capacity GPUs x makespan);
- effective utilization = used GPU-seconds / (capacity GPUs x makespan), where used
  GPU-seconds integrate each GPU's SM utilization over time (a sample holds until that GPU's
  next sample, at most `max_sample_gap_s`), capped at 100 % per GPU;
- queue wait = first start - submit, mean and p95 (nearest rank) per class and overall;
- jobs finished per hour = jobs ending COMPLETED / makespan hours;
- jobs harmed = requeued then ended in a failure state, or lost (never reached an end state);
- useful utilization = the effective figure counting only SM time that is work: a sample
  that is idle or fake-busy (the reclaim detector's thresholds, `report.figures.UsefulRule`)
  adds nothing.

A backlogged run (`BacklogFigures`, `backlog_figures`) is judged over [start, start + D] only.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from slurm_aigc.report.figures import DEFAULT_USEFUL_RULE, UsefulRule
from slurm_aigc.stats import mean, percentile

FAILED_STATES = frozenset({"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"})
END_STATES = FAILED_STATES | {"COMPLETED"}


@dataclass(frozen=True)
class JobOutcome:
    """One job of a run, as sacct saw it at the end.

    `gpus`: GPU equivalents held while running (a shard job holds shards / shards-per-GPU).
    `start_ts`: first start (None: never started). `allocated_gpu_s`: when the runner knows
    the exact allocation across requeued runs; None computes `gpus x (end - start)`.
    """

    job_id: str
    job_class: str
    gpus: float
    submit_ts: float
    start_ts: float | None
    end_ts: float | None
    state: str
    requeues: int = 0
    allocated_gpu_s: float | None = None
    # From the workload (backlogged figures): the job's busy GPU-seconds when it runs as written,
    # its profile's length, whether it hangs, whether it ran on shards of a GPU, its last run's start.
    work_gpu_s: float = 0.0
    nominal_s: float | None = None
    hangs: bool = False
    shared: bool = False
    last_start_ts: float | None = None
    # Resubmitted after its first attempt FAILED (out of GPU memory); that attempt was on shards, or
    # on a whole GPU its job fits (a shard job Slurm 22.05 left there took the memory): harmed.
    retried: bool = False
    failed_shared: bool = False
    # Every spell in the queue: (submit, start or None), one per sacct record (a requeue resets the
    # submit time) and per resubmission; empty: (submit_ts, start_ts) alone.
    queued: tuple[tuple[float, float | None], ...] = ()
    # From the workload: when the job's work is done before its run ends (an idle tail), seconds from
    # its first run's start; None: at the end of its run. `first_end_ts`: that first run's end.
    work_end_s: float | None = None
    first_end_ts: float | None = None


@dataclass(frozen=True)
class UsageSample:
    """One GPU's SM utilization at one poll (`job_gpu_samples`/`gpu_samples`)."""

    ts: float
    node: str
    gpu_index: int
    sm_util_pct: float
    power_draw_w: float | None = None  # None: no reading (never judged fake-busy, like the detector)
    power_limit_w: float | None = None
    # The SM of jobs that were hung at this poll by their workload profile (`hung_spans`). On a
    # GPU shared with a working job the power is the working job's, so the rule cannot see it.
    hung_pct: float = 0.0

    def useful_pct(self, rule: UsefulRule) -> float:
        working = max(0.0, self.sm_util_pct - self.hung_pct)
        return rule.useful_pct(working, self.power_draw_w, self.power_limit_w) or 0.0


@dataclass(frozen=True)
class ClassWait:
    job_class: str
    jobs: int
    started: int
    mean_wait_s: float | None
    p95_wait_s: float | None


@dataclass(frozen=True)
class RunMetrics:
    """Every figure `replay compare` prints for one run."""

    jobs: int
    completed: int
    window_start_ts: float | None
    window_end_ts: float | None
    makespan_s: float
    capacity_gpus: float
    allocated_gpu_s: float
    used_gpu_s: float
    allocation_ratio: float
    effective_utilization: float
    useful_gpu_s: float
    useful_utilization: float
    mean_wait_s: float | None
    p95_wait_s: float | None
    waits: tuple[ClassWait, ...]
    jobs_per_hour: float
    gpu_hours_reclaimed: float
    jobs_harmed: int
    jobs_lost: int
    jobs_requeued: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compute(
    outcomes: Sequence[JobOutcome],
    samples: Iterable[UsageSample],
    capacity_gpus: float,
    gpu_hours_reclaimed: float = 0.0,
    *,
    now_ts: float | None = None,
    max_sample_gap_s: float = 60.0,
    useful: UsefulRule = DEFAULT_USEFUL_RULE,
) -> RunMetrics:
    """All figures of one run; `now_ts` closes the window for jobs still running."""
    if capacity_gpus <= 0:
        raise ValueError(f"capacity_gpus must be > 0, got {capacity_gpus}")
    start, end = window(outcomes, now_ts)
    makespan = (end - start) if start is not None and end is not None else 0.0
    capacity_s = capacity_gpus * makespan
    allocated = sum(allocated_gpu_s(o, end) for o in outcomes)
    samples = list(samples)
    used = used_gpu_s(samples, start, end, max_sample_gap_s) if start is not None and end is not None else 0.0
    useful_s = used_gpu_s(samples, start, end, max_sample_gap_s, useful) if start is not None and end is not None else 0.0
    all_waits = [w for w in (queue_wait_s(o) for o in outcomes) if w is not None]
    completed = sum(1 for o in outcomes if o.state == "COMPLETED")
    lost = sum(1 for o in outcomes if is_lost(o))
    return RunMetrics(
        jobs=len(outcomes),
        completed=completed,
        window_start_ts=start,
        window_end_ts=end,
        makespan_s=makespan,
        capacity_gpus=capacity_gpus,
        allocated_gpu_s=allocated,
        used_gpu_s=used,
        allocation_ratio=allocated / capacity_s if capacity_s else 0.0,
        effective_utilization=used / capacity_s if capacity_s else 0.0,
        useful_gpu_s=useful_s,
        useful_utilization=useful_s / capacity_s if capacity_s else 0.0,
        mean_wait_s=mean(all_waits),
        p95_wait_s=percentile(all_waits, 95),
        waits=class_waits(outcomes),
        jobs_per_hour=completed / (makespan / 3600) if makespan else 0.0,
        gpu_hours_reclaimed=gpu_hours_reclaimed,
        jobs_harmed=sum(1 for o in outcomes if is_harmed(o)),
        jobs_lost=lost,
        jobs_requeued=sum(1 for o in outcomes if o.requeues > 0),
    )


def window(outcomes: Sequence[JobOutcome], now_ts: float | None = None) -> tuple[float | None, float | None]:
    """(first submit, last end); a job without an end counts as ending at `now_ts` if given,
    unless it never reached Slurm's records (refused, lost): it held nothing until then."""
    if not outcomes:
        return None, None
    start = min(o.submit_ts for o in outcomes)
    ends = [o.end_ts for o in outcomes if o.end_ts is not None]
    if now_ts is not None and any(o.end_ts is None and _state(o) not in NEVER_QUEUED for o in outcomes):
        ends.append(now_ts)
    end = max(ends, default=start)
    return start, max(end, start)


def allocated_gpu_s(outcome: JobOutcome, window_end: float | None) -> float:
    """GPU-seconds a job held: given by the runner, else gpus x (end or window end - start)."""
    if outcome.allocated_gpu_s is not None:
        return outcome.allocated_gpu_s
    if outcome.start_ts is None:
        return 0.0
    end = outcome.end_ts if outcome.end_ts is not None else window_end
    if end is None:
        return 0.0
    return outcome.gpus * max(0.0, end - outcome.start_ts)


def used_gpu_s(samples: Iterable[UsageSample], start: float, end: float, max_gap_s: float = 60.0,
               useful: UsefulRule | None = None) -> float:
    """Integrate per-GPU utilization over [start, end]; with `useful`, only the SM time that is work.

    A step function: each sample holds until that GPU's next sample, at most `max_gap_s`
    (a longer gap means the agent was away: unknown, not used); the last sample holds for
    the GPU's median poll interval. Samples of one GPU at the same time (jobs sharing it
    through shards) add up, capped at 100 %. With `useful`, an idle or fake-busy sample
    (`UsefulRule`) counts 0.
    """
    total = 0.0
    for series in _per_gpu(samples, useful).values():
        times = [ts for ts, _ in series]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        last_hold = min(statistics.median(gaps), max_gap_s) if gaps else max_gap_s
        ends = [*times[1:], times[-1] + last_hold]
        for (ts, util), next_ts in zip(series, ends):
            hold_end = min(next_ts, ts + max_gap_s, end)
            hold_start = max(ts, start)
            if hold_end > hold_start:
                total += min(util, 100.0) / 100.0 * (hold_end - hold_start)
    return total


def _per_gpu(samples: Iterable[UsageSample], useful: UsefulRule | None) -> dict[tuple[str, int], list[tuple[float, float]]]:
    summed: dict[tuple[str, int], dict[float, float]] = {}
    for sample in samples:
        by_ts = summed.setdefault((sample.node, sample.gpu_index), {})
        value = sample.sm_util_pct if useful is None else sample.useful_pct(useful)
        by_ts[sample.ts] = by_ts.get(sample.ts, 0.0) + max(0.0, value)
    return {gpu: sorted(by_ts.items()) for gpu, by_ts in summed.items()}


def utilization_timeline(
    samples: Iterable[UsageSample], capacity_gpus: float, start: float, end: float, bin_s: float = 10.0,
    useful: UsefulRule | None = None,
) -> list[tuple[float, float]]:
    """(seconds since start, used (or, with `useful`, useful) fraction of capacity) per `bin_s` bin, for the plot."""
    if end <= start or bin_s <= 0 or capacity_gpus <= 0:
        return []
    bins = math.ceil((end - start) / bin_s)
    series = list(samples)
    points = []
    for index in range(bins):
        low = start + index * bin_s
        high = min(end, low + bin_s)
        used = used_gpu_s(series, low, high, useful=useful)
        points.append((index * bin_s, used / (capacity_gpus * (high - low))))
    return points


def queue_wait_s(outcome: JobOutcome) -> float | None:
    if outcome.start_ts is None:
        return None
    return max(0.0, outcome.start_ts - outcome.submit_ts)


def class_waits(outcomes: Sequence[JobOutcome]) -> tuple[ClassWait, ...]:
    by_class: dict[str, list[JobOutcome]] = {}
    for outcome in outcomes:
        by_class.setdefault(outcome.job_class, []).append(outcome)
    rows = []
    for name, group in sorted(by_class.items()):
        waits = [w for w in (queue_wait_s(o) for o in group) if w is not None]
        rows.append(ClassWait(name, len(group), len(waits), mean(waits), percentile(waits, 95)))
    return tuple(rows)


def is_lost(outcome: JobOutcome) -> bool:
    """Never reached an end state (vanished, or still pending/running when the run ended)."""
    return outcome.state.split()[0] not in END_STATES if outcome.state else True


def is_harmed(outcome: JobOutcome) -> bool:
    """Requeued and then failed, lost, or failed once while sharing a GPU (as `harmed_by`)."""
    state = outcome.state.split()[0] if outcome.state else ""
    return is_lost(outcome) or outcome.failed_shared or (outcome.requeues > 0 and state in FAILED_STATES)



# ---------------------------------------------------------------- backlogged runs (issue 14.1)


@dataclass(frozen=True)
class BacklogFigures:
    """Every figure of a backlogged run, over [start, start + duration] only (docs/replay.md).

    Both runs keep the same number of jobs pending for the same time, so more work done in
    the window is more throughput, not a shorter tail.
    """

    duration_s: float
    backlog: int
    capacity_gpus: float
    submitted: int
    completed: int
    work_completed_gpu_s: float
    used_gpu_s: float
    useful_gpu_s: float
    effective_utilization: float
    useful_utilization: float
    mean_wait_s: float | None
    p95_wait_s: float | None
    waits: tuple[ClassWait, ...]
    shared_completed: int
    shared_slowdown_median: float | None
    shared_slowdown_p95: float | None
    shared_timeouts: int
    jobs_harmed: int
    jobs_requeued: int
    gpu_hours_reclaimed: float
    stream_exhausted: bool
    jobs_retried: int = 0  # resubmitted after running out of GPU memory (see runner.merge_retry)
    # Which jobs the misses were (`job id STATE`), so a report can say what happened to each.
    harmed_jobs: tuple[str, ...] = ()
    sharing_timeout_jobs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def backlog_figures(
    outcomes: Sequence[JobOutcome],
    samples: Iterable[UsageSample],
    capacity_gpus: float,
    start_ts: float,
    duration_s: float,
    backlog: int,
    *,
    gpu_hours_reclaimed: float = 0.0,
    stream_exhausted: bool = False,
    useful: UsefulRule = DEFAULT_USEFUL_RULE,
) -> BacklogFigures:
    """The figures of a run that kept `backlog` jobs pending from `start_ts` for `duration_s`."""
    if capacity_gpus <= 0 or duration_s <= 0:
        raise ValueError(f"capacity_gpus and duration_s must be > 0, got {capacity_gpus}, {duration_s}")
    end = start_ts + duration_s
    series = list(samples)
    used = used_gpu_s(series, start_ts, end)
    useful_s = used_gpu_s(series, start_ts, end, useful=useful)
    done = [o for o in outcomes if completed_by(o, end)]
    worked = [o for o in outcomes if work_done_by(o, end)]
    waits = [w for w in (censored_wait_s(o, end) for o in outcomes) if w is not None]
    slowdowns = [x for x in (shared_slowdown(o) for o in done) if x is not None]
    capacity_s = capacity_gpus * duration_s
    return BacklogFigures(
        duration_s=duration_s, backlog=backlog, capacity_gpus=capacity_gpus, submitted=len(outcomes),
        completed=len(worked), work_completed_gpu_s=sum(o.work_gpu_s for o in worked),
        used_gpu_s=used, useful_gpu_s=useful_s,
        effective_utilization=used / capacity_s, useful_utilization=useful_s / capacity_s,
        mean_wait_s=mean(waits), p95_wait_s=percentile(waits, 95), waits=censored_class_waits(outcomes, end),
        shared_completed=sum(1 for o in done if o.shared),
        shared_slowdown_median=statistics.median(slowdowns) if slowdowns else None,
        shared_slowdown_p95=percentile(slowdowns, 95),
        shared_timeouts=sum(1 for o in outcomes if is_sharing_timeout(o, end)),
        jobs_harmed=sum(1 for o in outcomes if harmed_by(o, end)),
        jobs_requeued=sum(1 for o in outcomes if o.requeues > 0),
        gpu_hours_reclaimed=gpu_hours_reclaimed, stream_exhausted=stream_exhausted,
        jobs_retried=sum(1 for o in outcomes if o.retried),
        harmed_jobs=tuple(f"{o.job_id} {_state(o) or 'no record'}" for o in outcomes if harmed_by(o, end)),
        sharing_timeout_jobs=tuple(o.job_id for o in outcomes if is_sharing_timeout(o, end)),
    )


# Outcomes the runner makes for jobs Slurm never recorded (no sacct record).
NEVER_QUEUED = frozenset({"REFUSED", "LOST"})


def _state(outcome: JobOutcome) -> str:
    return outcome.state.split()[0] if outcome.state else ""


def completed_by(outcome: JobOutcome, end_ts: float) -> bool:
    """Ended COMPLETED no later than the window's end (a job cancelled at the end never counts)."""
    return _state(outcome) == "COMPLETED" and outcome.end_ts is not None and outcome.end_ts <= end_ts


def work_done_by(outcome: JobOutcome, end_ts: float) -> bool:
    """Its work was done by the window's end: it ended COMPLETED by then, or (an idle-tail job)
    its first run got past its last busy phase by then and only held its GPUs idle after it.

    Counting only the jobs that ended would credit a shorter idle tail as more work: at D stock
    Slurm holds more finished-but-idle jobs than a run whose reclaim ends their tails. A first run
    that ended before its work was done (requeued in its busy phase: the rerun plays nothing) did
    not do it. The work end is nominal: a shared job's busy phases may stretch (slowdown), so it
    reads a few seconds early for those.
    """
    if outcome.work_end_s is None or outcome.start_ts is None:
        return completed_by(outcome, end_ts)
    done_at = outcome.start_ts + outcome.work_end_s
    if outcome.first_end_ts is not None and outcome.first_end_ts < done_at:
        return False
    return done_at <= end_ts and _state(outcome) not in NEVER_QUEUED


def censored_wait_s(outcome: JobOutcome, end_ts: float) -> float | None:
    """Time a job submitted in the window spent pending, every spell of it: to its first start, and
    again from each requeue (or resubmission) to the next start; a spell not ended by the window's
    end counts to the end (a lower bound, so a run that starves jobs cannot look better by leaving
    them out). Every pending second is charged: both runs keep the same number of jobs pending, a
    requeued job pending again among them. A job sbatch refused never waited in the queue: it is
    harmed, not waiting."""
    if outcome.submit_ts > end_ts or _state(outcome) == "REFUSED":
        return None
    spells = outcome.queued or ((outcome.submit_ts, outcome.start_ts),)
    waited = 0.0
    for submitted, started in spells:
        if submitted <= end_ts:
            waited += max(0.0, (started if started is not None and started <= end_ts else end_ts) - submitted)
    return waited


def censored_class_waits(outcomes: Sequence[JobOutcome], end_ts: float) -> tuple[ClassWait, ...]:
    by_class: dict[str, list[JobOutcome]] = {}
    for outcome in outcomes:
        by_class.setdefault(outcome.job_class, []).append(outcome)
    rows = []
    for name, group in sorted(by_class.items()):
        waits = [w for w in (censored_wait_s(o, end_ts) for o in group) if w is not None]
        started = sum(1 for o in group if o.start_ts is not None and o.start_ts <= end_ts)
        rows.append(ClassWait(name, len(group), started, mean(waits), percentile(waits, 95)))
    return tuple(rows)


def shared_slowdown(outcome: JobOutcome) -> float | None:
    """Last run's time / the profile's length, for a completed job that ran on shards of a GPU.

    A requeued job's last run plays a different (requeue) profile, so it is left out.
    """
    if not outcome.shared or outcome.requeues or outcome.nominal_s is None or outcome.nominal_s <= 0:
        return None
    start = outcome.last_start_ts if outcome.last_start_ts is not None else outcome.start_ts
    if start is None or outcome.end_ts is None or _state(outcome) != "COMPLETED":
        return None
    return (outcome.end_ts - start) / outcome.nominal_s


def is_sharing_timeout(outcome: JobOutcome, end_ts: float) -> bool:
    """A shared job that hit its time limit in the window though its profile never hangs."""
    ended = outcome.end_ts is not None and outcome.end_ts <= end_ts
    return outcome.shared and not outcome.hangs and ended and _state(outcome) == "TIMEOUT"


# sacct keeps whole seconds: the runner's own `scancel` at the window's end can read up to this
# much before it (a requeued idle-tail job, pending again, was counted as harmed that way).
RUNNER_CANCEL_SLACK_S = 1.0


def harmed_by(outcome: JobOutcome, end_ts: float) -> bool:
    """Requeued, then ended in a failure state within the window, lost (no record at all), or
    failed once while sharing a GPU (a neighbour took the memory it needed).

    A job cancelled at the window's end is the runner's doing, not harm.
    """
    state = _state(outcome)
    if state in {"LOST", "REFUSED"} or not outcome.state or outcome.failed_shared:
        return True
    if outcome.end_ts is None or outcome.requeues == 0 or state not in FAILED_STATES:
        return False
    if state == "CANCELLED":
        return outcome.end_ts < end_ts - RUNNER_CANCEL_SLACK_S
    return outcome.end_ts <= end_ts
