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
- jobs harmed = requeued then ended in a failure state, or lost (never reached an end state).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

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


@dataclass(frozen=True)
class UsageSample:
    """One GPU's SM utilization at one poll (`job_gpu_samples`/`gpu_samples`)."""

    ts: float
    node: str
    gpu_index: int
    sm_util_pct: float


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
) -> RunMetrics:
    """All figures of one run; `now_ts` closes the window for jobs still running."""
    if capacity_gpus <= 0:
        raise ValueError(f"capacity_gpus must be > 0, got {capacity_gpus}")
    start, end = window(outcomes, now_ts)
    makespan = (end - start) if start is not None and end is not None else 0.0
    capacity_s = capacity_gpus * makespan
    allocated = sum(allocated_gpu_s(o, end) for o in outcomes)
    used = used_gpu_s(samples, start, end, max_sample_gap_s) if start is not None and end is not None else 0.0
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
    """(first submit, last end); a job without an end counts as ending at `now_ts` if given."""
    if not outcomes:
        return None, None
    start = min(o.submit_ts for o in outcomes)
    ends = [o.end_ts for o in outcomes if o.end_ts is not None]
    if now_ts is not None and any(o.end_ts is None for o in outcomes):
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


def used_gpu_s(samples: Iterable[UsageSample], start: float, end: float, max_gap_s: float = 60.0) -> float:
    """Integrate per-GPU utilization over [start, end].

    A step function: each sample holds until that GPU's next sample, at most `max_gap_s`
    (a longer gap means the agent was away: unknown, not used); the last sample holds for
    the GPU's median poll interval. Samples of one GPU at the same time (jobs sharing it
    through shards) add up, capped at 100 %.
    """
    total = 0.0
    for series in _per_gpu(samples).values():
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


def _per_gpu(samples: Iterable[UsageSample]) -> dict[tuple[str, int], list[tuple[float, float]]]:
    summed: dict[tuple[str, int], dict[float, float]] = {}
    for sample in samples:
        by_ts = summed.setdefault((sample.node, sample.gpu_index), {})
        by_ts[sample.ts] = by_ts.get(sample.ts, 0.0) + max(0.0, sample.sm_util_pct)
    return {gpu: sorted(by_ts.items()) for gpu, by_ts in summed.items()}


def utilization_timeline(
    samples: Iterable[UsageSample], capacity_gpus: float, start: float, end: float, bin_s: float = 10.0
) -> list[tuple[float, float]]:
    """(seconds since start, used fraction of capacity) per `bin_s` bin, for the plot."""
    if end <= start or bin_s <= 0 or capacity_gpus <= 0:
        return []
    bins = math.ceil((end - start) / bin_s)
    series = list(samples)
    points = []
    for index in range(bins):
        low = start + index * bin_s
        high = min(end, low + bin_s)
        used = used_gpu_s(series, low, high)
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
    """Requeued and then failed, or lost."""
    state = outcome.state.split()[0] if outcome.state else ""
    return is_lost(outcome) or (outcome.requeues > 0 and state in FAILED_STATES)

