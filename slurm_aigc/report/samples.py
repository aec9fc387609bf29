"""Reading what the GPUs did (`job_gpu_samples`) and what slurm-aigc did (`actions`).

The record types and the slicing rule live in `report/records.py` (pure), so figures and
renderers need not import this store. Samples older than the raw retention are read from their
hourly rollups (`report/retention.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import groupby
from typing import Any

from sqlalchemy import ColumnElement, Row, Select, and_, literal_column, select, union_all
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import ActionRecord, JobGpuRollup, JobGpuSample, transaction
from slurm_aigc.report.records import DEFAULT_INTERVAL_S, ActionEvent, SampleSlice, slices
from slurm_aigc.report.retention import BUCKET_S, rolled_until, rollup_slices

_BATCH = 5000
# Job ids per query of `job_slices` (a longer list takes several): the query binds each twice
# (rollups and raw rows), and SQLite before 3.32 (EL8's) takes 999 parameters a statement,
# PostgreSQL 65,535 (`replay --from-sacct` of a busy month asks for 100,000 jobs).
JOB_IDS_PER_QUERY = 400
# Which table a row of the one query comes from; rollups sort first, as their hours are older.
_ROLLUP, _RAW = 0, 1


class SampleStore:
    """Reads `job_gpu_samples` and `actions` through the database boundary."""

    def __init__(self, factory: sessionmaker[Session], default_interval_s: float = DEFAULT_INTERVAL_S, *,
                 ids_per_query: int = JOB_IDS_PER_QUERY) -> None:
        self._factory = factory
        self._interval_s = default_interval_s
        self._ids_per_query = ids_per_query

    def job_slices(self, since_ts: float, until_ts: float, job_ids: Sequence[str] = ()) -> Iterator[SampleSlice]:
        """Every sample in [since, until), one job at a time, one GPU series at a time (memory: one series).

        Hours older than the retention mark come from `job_gpu_rollups`, newer ones from the raw
        rows; never both for the same hour. An hour only partly in the window counts that part of
        its sums (`_clipped`): a rollup is an hourly sum, so this assumes its samples spread evenly.
        One query reads both, ordered by job, so a job's slices come together (its rollups, then
        its raw rows): the report caps a job's hours once the stream has passed the job, and the
        last rollup's slice can reach past the mark into the hour the raw rows start, which must
        be capped as one.

        Many job ids are read `ids_per_query` at a time (each job in one query, so its slices
        still come together), in the one snapshot. A database error is a DatabaseError.
        """
        keys = sorted(set(job_ids))
        batches = [keys[start:start + self._ids_per_query] for start in range(0, len(keys), self._ids_per_query)]
        # The session's own errors were raw SQLAlchemy errors, which callers (`replay --from-sacct`)
        # that handle DatabaseError let escape.
        with transaction(self._factory) as session:
            _one_snapshot(session)
            mark = rolled_until(session)
            rolled_to = since_ts if mark is None else min(max(since_ts, mark), until_ts)
            for batch in batches or [[]]:  # no ids: every job, in one query
                parts: list[Select[*tuple[Any, ...]]] = []
                if rolled_to > since_ts:
                    parts.append(_rollup_rows(since_ts, rolled_to, batch))
                if until_ts > rolled_to:
                    parts.append(_raw_rows(rolled_to, until_ts, batch))
                if not parts:
                    return
                both = union_all(*parts).subquery()
                query = select(both).order_by(both.c.job_id, both.c.part, both.c.node, both.c.gpu_index, both.c.ts)
                rows = session.execute(query.execution_options(yield_per=_BATCH))
                for (_, part, _, _), series in groupby(rows, key=lambda row: (row[1], row[0], row[2], row[3])):
                    if part == _ROLLUP:
                        for row in series:
                            yield from (_clipped(piece, row[4], since_ts, rolled_to)
                                        for piece in rollup_slices(_rollup(row)))
                    else:
                        yield from slices([tuple(row[1:10]) for row in series], self._interval_s)

    def actions(self, since_ts: float, until_ts: float, job_ids: Sequence[str] = ()) -> list[ActionEvent]:
        """Audit rows whose intent falls in [since, until) (or of the given jobs, any time), by intent
        time; many job ids are read `ids_per_query` at a time, as in `job_slices`."""
        keys = sorted(set(job_ids))
        window = and_(ActionRecord.ts_intent >= since_ts, ActionRecord.ts_intent < until_ts)
        conditions: list[ColumnElement[bool]] = [ActionRecord.job_id.in_(keys[start:start + self._ids_per_query])
                                                 for start in range(0, len(keys), self._ids_per_query)] or [window]
        with transaction(self._factory) as session:  # errors as DatabaseError, as `job_slices`
            rows = [row for where in conditions for row in session.scalars(select(ActionRecord).where(where))]
        return [_event(row) for row in sorted(rows, key=lambda row: (row.ts_intent, row.id))]


def _one_snapshot(session: Session) -> None:
    """Read the retention mark and the rows in one snapshot (server databases).

    The engines run READ COMMITTED (db.py), where each statement sees the newest commit: had
    retention moved the mark and deleted the raw rows behind it between our reading the mark and
    the rows, that hour would come from neither table. REPEATABLE READ keeps the first read's
    snapshot for the session's transaction; a report only reads, so it takes no locks the
    agents' inserts would wait for. SQLite: its driver begins no transaction for a SELECT, so each
    statement read the newest commit too (the controller's retention runs in another process on
    the same file); an explicit BEGIN holds one WAL snapshot from the first read, and writers go on.
    """
    if session.get_bind().dialect.name == "sqlite":
        session.connection().exec_driver_sql("BEGIN")
    else:
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def _rollup_rows(since_ts: float, until_ts: float, job_ids: Sequence[str]) -> Select[*tuple[Any, ...]]:
    """Rollups of hours reaching into [since, until), in `_raw_rows`' columns (see `_rollup`)."""
    query: Select[*tuple[Any, ...]] = select(
        literal_column(str(_ROLLUP)).label("part"), JobGpuRollup.job_id, JobGpuRollup.node, JobGpuRollup.gpu_index,
        JobGpuRollup.bucket_ts.label("ts"), JobGpuRollup.first_ts, JobGpuRollup.duration_s, JobGpuRollup.known_s,
        JobGpuRollup.used_gpu_s, JobGpuRollup.memory_used_mib_max, JobGpuRollup.memory_total_mib,
    ).where(JobGpuRollup.bucket_ts > since_ts - BUCKET_S, JobGpuRollup.bucket_ts < until_ts)
    return query.where(JobGpuRollup.job_id.in_(list(job_ids))) if job_ids else query


def _raw_rows(since_ts: float, until_ts: float, job_ids: Sequence[str]) -> Select[*tuple[Any, ...]]:
    """Raw samples in [since, until): the row `records.slices` reads, then `ts` again (the union's width)."""
    query: Select[*tuple[Any, ...]] = select(
        literal_column(str(_RAW)).label("part"), JobGpuSample.job_id, JobGpuSample.node, JobGpuSample.gpu_index,
        JobGpuSample.ts, JobGpuSample.sm_util_pct, JobGpuSample.memory_used_mib, JobGpuSample.memory_total_mib,
        JobGpuSample.power_draw_w, JobGpuSample.power_limit_w, JobGpuSample.ts.label("ts_again"),
    ).where(JobGpuSample.ts >= since_ts, JobGpuSample.ts < until_ts)
    return query.where(JobGpuSample.job_id.in_(list(job_ids))) if job_ids else query


def _rollup(row: Row[*tuple[Any, ...]]) -> JobGpuRollup:
    """A `_rollup_rows` row as the record `rollup_slices` reads (not added to any session)."""
    return JobGpuRollup(bucket_ts=row[4], job_id=row[1], node=row[2], gpu_index=row[3], first_ts=row[5], duration_s=row[6],
                        known_s=row[7], used_gpu_s=row[8], memory_used_mib_max=row[9], memory_total_mib=row[10])


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
