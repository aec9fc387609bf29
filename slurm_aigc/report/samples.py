"""Reading what the GPUs did (`job_gpu_samples`) and what slurm-aigc did (`actions`).

The agents write one `job_gpu_samples` row per job, GPU and poll. A sample stands for the
time until the next poll of that GPU; a gap longer than `GAP_FACTOR` poll intervals (the
agent was down) counts as unknown, never as used or idle time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import ActionRecord, JobGpuSample

DEFAULT_INTERVAL_S = 10.0  # the agent's default poll interval (telemetry `agent.interval_s`)
GAP_FACTOR = 3.0
_BATCH = 5000


@dataclass(frozen=True)
class SampleSlice:
    """One sample of one job's GPU and the seconds it stands for."""

    job_id: str
    node: str
    gpu_index: int
    ts: float
    duration_s: float
    sm_util_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None

    @property
    def used_gpu_s(self) -> float | None:
        """GPU-seconds of work: utilization × duration (None when utilization is unknown)."""
        return None if self.sm_util_pct is None else self.sm_util_pct / 100.0 * self.duration_s


@dataclass(frozen=True)
class ActionEvent:
    """One row of the `actions` audit table, as reports show it."""

    job_id: str
    ts: float
    verdict: str
    action: str
    state: str
    dry_run: bool
    detail: str
    gpus_before: int | None
    gpus_after: int | None
    gpu_hours_recovered: float | None

    @property
    def effective(self) -> bool:
        """Counted in figures: it happened (done) and was not a dry run."""
        return self.state == "done" and not self.dry_run


def slices(raw: Sequence[tuple[str, str, int, float, float | None, float | None, float | None]],
           default_interval_s: float = DEFAULT_INTERVAL_S) -> list[SampleSlice]:
    """Turn one GPU's samples of one job, sorted by time, into slices with durations."""
    times = [row[3] for row in raw]
    gaps = [b - a for a, b in pairwise(times) if b > a]
    interval_s = statistics.median(gaps) if gaps else default_interval_s
    result: list[SampleSlice] = []
    for index, (job_id, node, gpu_index, ts, util, mem_used, mem_total) in enumerate(raw):
        gap = times[index + 1] - ts if index + 1 < len(times) else interval_s
        duration_s = gap if 0 <= gap <= GAP_FACTOR * interval_s else interval_s
        result.append(SampleSlice(job_id, node, gpu_index, ts, duration_s, util, mem_used, mem_total))
    return result


class SampleStore:
    """Reads `job_gpu_samples` and `actions` through the database boundary."""

    def __init__(self, factory: sessionmaker[Session], default_interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._factory = factory
        self._interval_s = default_interval_s

    def job_slices(self, since_ts: float, until_ts: float, job_ids: Sequence[str] = ()) -> Iterator[SampleSlice]:
        """Every sample in [since, until), one GPU series at a time (memory: one series)."""
        query = select(
            JobGpuSample.job_id, JobGpuSample.node, JobGpuSample.gpu_index, JobGpuSample.ts,
            JobGpuSample.sm_util_pct, JobGpuSample.memory_used_mib, JobGpuSample.memory_total_mib,
        ).where(JobGpuSample.ts >= since_ts, JobGpuSample.ts < until_ts)
        if job_ids:
            query = query.where(JobGpuSample.job_id.in_(list(job_ids)))
        query = query.order_by(JobGpuSample.job_id, JobGpuSample.node, JobGpuSample.gpu_index, JobGpuSample.ts)
        with self._factory() as session:
            rows = session.execute(query.execution_options(yield_per=_BATCH))
            for _, series in groupby(rows, key=lambda row: (row[0], row[1], row[2])):
                yield from slices([tuple(row) for row in series], self._interval_s)  # type: ignore[misc]

    def actions(self, since_ts: float, until_ts: float, job_ids: Sequence[str] = ()) -> list[ActionEvent]:
        """Audit rows whose intent falls in [since, until) (or of the given jobs, any time)."""
        query = select(ActionRecord)
        if job_ids:
            query = query.where(ActionRecord.job_id.in_(list(job_ids)))
        else:
            query = query.where(ActionRecord.ts_intent >= since_ts, ActionRecord.ts_intent < until_ts)
        with self._factory() as session:
            return [_event(row) for row in session.scalars(query.order_by(ActionRecord.ts_intent))]


def _event(row: ActionRecord) -> ActionEvent:
    return ActionEvent(
        job_id=row.job_id, ts=row.ts_outcome or row.ts_intent, verdict=row.verdict, action=row.action,
        state=row.state, dry_run=bool(row.dry_run), detail=row.detail or "", gpus_before=row.gpus_before,
        gpus_after=row.gpus_after, gpu_hours_recovered=row.gpu_hours_recovered,
    )
