"""Reading what the GPUs did (`job_gpu_samples`) and what slurm-aigc did (`actions`).

The record types and the slicing rule live in `report/records.py` (pure), so figures and
renderers need not import this store. Samples older than the raw retention are read from their
hourly rollups (`report/retention.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import groupby

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import ActionRecord, JobGpuRollup, JobGpuSample
from slurm_aigc.report.records import DEFAULT_INTERVAL_S, ActionEvent, SampleSlice, slices
from slurm_aigc.report.retention import BUCKET_S, rolled_until, rollup_slices

_BATCH = 5000


class SampleStore:
    """Reads `job_gpu_samples` and `actions` through the database boundary."""

    def __init__(self, factory: sessionmaker[Session], default_interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._factory = factory
        self._interval_s = default_interval_s

    def job_slices(self, since_ts: float, until_ts: float, job_ids: Sequence[str] = ()) -> Iterator[SampleSlice]:
        """Every sample in [since, until), one GPU series at a time (memory: one series).

        Hours older than the retention mark come from `job_gpu_rollups`, newer ones from the raw
        rows; never both for the same hour. An hour only partly in the window counts that part of
        its sums (`_clipped`): a rollup is an hourly sum, so this assumes its samples spread evenly.
        """
        with self._factory() as session:
            mark = rolled_until(session)
            if mark is not None and since_ts < mark:
                yield from self._rollup_slices(session, since_ts, min(until_ts, mark), job_ids)
                since_ts = max(since_ts, mark)
            if since_ts >= until_ts:
                return
            query = select(
                JobGpuSample.job_id, JobGpuSample.node, JobGpuSample.gpu_index, JobGpuSample.ts,
                JobGpuSample.sm_util_pct, JobGpuSample.memory_used_mib, JobGpuSample.memory_total_mib,
                JobGpuSample.power_draw_w, JobGpuSample.power_limit_w,
            ).where(JobGpuSample.ts >= since_ts, JobGpuSample.ts < until_ts)
            if job_ids:
                query = query.where(JobGpuSample.job_id.in_(list(job_ids)))
            query = query.order_by(JobGpuSample.job_id, JobGpuSample.node, JobGpuSample.gpu_index, JobGpuSample.ts)
            rows = session.execute(query.execution_options(yield_per=_BATCH))
            for _, series in groupby(rows, key=lambda row: (row[0], row[1], row[2])):
                yield from slices([tuple(row) for row in series], self._interval_s)  # type: ignore[misc]

    @staticmethod
    def _rollup_slices(session: Session, since_ts: float, until_ts: float, job_ids: Sequence[str]) -> Iterator[SampleSlice]:
        query = select(JobGpuRollup).where(JobGpuRollup.bucket_ts > since_ts - BUCKET_S, JobGpuRollup.bucket_ts < until_ts)
        if job_ids:
            query = query.where(JobGpuRollup.job_id.in_(list(job_ids)))
        query = query.order_by(JobGpuRollup.job_id, JobGpuRollup.node, JobGpuRollup.gpu_index, JobGpuRollup.bucket_ts)
        for row in session.scalars(query.execution_options(yield_per=_BATCH)):
            for piece in rollup_slices(row):
                yield _clipped(piece, row.bucket_ts, since_ts, until_ts)

    def actions(self, since_ts: float, until_ts: float, job_ids: Sequence[str] = ()) -> list[ActionEvent]:
        """Audit rows whose intent falls in [since, until) (or of the given jobs, any time)."""
        query = select(ActionRecord)
        if job_ids:
            query = query.where(ActionRecord.job_id.in_(list(job_ids)))
        else:
            query = query.where(ActionRecord.ts_intent >= since_ts, ActionRecord.ts_intent < until_ts)
        with self._factory() as session:
            return [_event(row) for row in session.scalars(query.order_by(ActionRecord.ts_intent))]


def _clipped(piece: SampleSlice, bucket_ts: float, since_ts: float, until_ts: float) -> SampleSlice:
    """A rollup slice of an hour the window only partly covers: scaled to the covered part, placed inside it.

    The allocation is clipped to the exact window edge; taking or dropping the whole hour would
    not match it. The utilization (a mean over the hour) is kept.
    """
    low, high = max(bucket_ts, since_ts), min(bucket_ts + BUCKET_S, until_ts)
    if low <= bucket_ts and high >= bucket_ts + BUCKET_S:
        return piece
    duration_s = piece.duration_s * max(0.0, high - low) / BUCKET_S
    return replace(piece, ts=max(low, min(piece.ts, high - duration_s)), duration_s=duration_s)


def _event(row: ActionRecord) -> ActionEvent:
    return ActionEvent(
        job_id=row.job_id, ts=row.ts_outcome or row.ts_intent, verdict=row.verdict, action=row.action,
        state=row.state, dry_run=bool(row.dry_run), detail=row.detail or "", gpus_before=row.gpus_before,
        gpus_after=row.gpus_after, gpu_hours_recovered=row.gpu_hours_recovered,
    )
