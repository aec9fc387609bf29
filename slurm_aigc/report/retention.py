"""Retention: raw samples older than `storage.raw_retention_hours` become hourly per-job, per-GPU
rollups (`job_gpu_rollups`), then are deleted in bounded batches; the publisher's records
(`node_publications`) older than that are deleted too, but for each node's newest written weight.

A rollup holds the sums `report` needs (used GPU-seconds, sampled seconds, peak memory), computed
with the same slicing rule as the raw rows (`records.slices`), so a report over rolled-up hours
gives the same totals. Each hour is rolled up in one transaction that also moves the mark
(`retention_state.rolled_until`); only rows older than the mark are deleted, `batch_rows` per
transaction, so a crash at any point neither loses nor double-counts an hour, and no
transaction holds locks for long. Readers take raw rows at or after the mark and rollups before it.

One `run` works for at most `budget_s` (it runs in the controller's tick): it stops between two
transactions and the next run resumes from the mark. The first run on a database (no mark yet)
starts at most `FIRST_RUN_LOOKBACK_S` before the retention window; older raw rows (a node whose
clock said 2000) are deleted without a rollup, and logged.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import groupby

from sqlalchemy import ColumnElement, and_, delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import (
    GpuSample,
    JobGpuRollup,
    JobGpuSample,
    NodePublication,
    ProcessSample,
    RetentionState,
    transaction,
)
from slurm_aigc.report.records import DEFAULT_INTERVAL_S, GAP_FACTOR, SampleSlice, slices

BUCKET_S = 3600.0
DEFAULT_BATCH_ROWS = 5000
DEFAULT_RAW_RETENTION_HOURS = 48.0  # the policy's `storage.raw_retention_hours` default
# Seconds one `run` may work before it stops between two transactions. The unit it cannot split
# is one hour's rollup (docs/deploy.md, "Retention", gives its cost at 1,000 nodes).
DEFAULT_BUDGET_S = 5.0
# The first run rolls up at most this much before the retention window: a week of history that
# predates retention is kept, while one sample from a year-2000 clock costs no 230,000 hours.
FIRST_RUN_LOOKBACK_S = 7 * 24 * BUCKET_S
LOG = logging.getLogger(__name__)
_Pruned = type[JobGpuSample] | type[GpuSample] | type[ProcessSample] | type[NodePublication]
_READ_BATCH = 5000
# Rows read past an hour's end: each series' last sample in the hour needs its successor for its
# duration (`slices`), which counts gaps up to GAP_FACTOR poll intervals (here polls up to 200 s).
_LOOKAHEAD_S = 200.0 * GAP_FACTOR


@dataclass
class RetentionResult:
    """What one `Retention.run` did."""

    hours_rolled: int = 0
    rollup_rows: int = 0
    raw_rows_read: int = 0
    deleted: dict[str, int] = field(default_factory=dict)
    rollup_s: float = 0.0
    delete_s: float = 0.0
    finished: bool = True  # False: the budget ran out; the next run goes on from the mark


def rolled_until(session: Session) -> float | None:
    """The retention mark: raw rows before it are rolled up (and may be gone)."""
    value = session.scalar(select(RetentionState.rolled_until).where(RetentionState.id == 1))
    return None if value is None else float(value)


class Retention:
    """Rolls up and prunes raw samples; run by the controller (or `benchmarks/bench_retention.py`)."""

    def __init__(self, factory: sessionmaker[Session], raw_retention_hours: float = DEFAULT_RAW_RETENTION_HOURS, *,
                 batch_rows: int = DEFAULT_BATCH_ROWS, default_interval_s: float = DEFAULT_INTERVAL_S,
                 budget_s: float = DEFAULT_BUDGET_S, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not raw_retention_hours > 0 or batch_rows < 1 or not budget_s > 0:
            raise ValueError("raw_retention_hours and budget_s must be > 0 and batch_rows >= 1")
        self._factory = factory
        self._retention_s = raw_retention_hours * 3600.0
        self._batch = batch_rows
        self._interval_s = default_interval_s
        self._budget_s = budget_s
        self._clock = clock
        self._monotonic = monotonic

    def run(self, now_ts: float | None = None) -> RetentionResult:
        """Roll up every whole hour older than the retention, then delete what is rolled up, for at
        most `budget_s` (then `finished` is False and the next run goes on)."""
        result = RetentionResult()
        deadline = self._monotonic() + self._budget_s
        cutoff = math.floor(((now_ts if now_ts is not None else self._clock()) - self._retention_s) / BUCKET_S) * BUCKET_S
        self._roll_up(cutoff, deadline, result)
        self._prune(cutoff, deadline, result)
        return result

    def _roll_up(self, cutoff: float, deadline: float, result: RetentionResult) -> None:
        started = self._monotonic()
        bucket = self._first_bucket(cutoff)
        while bucket is not None and bucket < cutoff:
            if result.hours_rolled and self._monotonic() >= deadline:  # one hour at least: progress
                result.finished = False
                break
            self._roll_bucket(bucket, result)
            bucket += BUCKET_S
        result.rollup_s = self._monotonic() - started

    def _prune(self, cutoff: float, deadline: float, result: RetentionResult) -> None:
        started = self._monotonic()
        with transaction(self._factory) as session:
            mark = rolled_until(session)
        targets: list[tuple[_Pruned, ColumnElement[bool]]] = [] if mark is None else [
            (model, model.ts < mark) for model in (JobGpuSample, GpuSample, ProcessSample)]
        targets.append((NodePublication, _old_publications(cutoff)))
        for model, condition in targets:
            deleted, done = self._delete_batched(model, condition, deadline)
            result.deleted[model.__tablename__] = deleted
            result.finished = result.finished and done
        result.delete_s = self._monotonic() - started

    def _first_bucket(self, cutoff: float) -> float | None:
        """The mark, else the hour of the oldest raw row of any table (a node whose GPUs have not
        run a job yet still fills `gpu_samples`, which must not wait for a first job's sample), but
        no earlier than `FIRST_RUN_LOOKBACK_S` before `cutoff`: the mark is then set there, so the
        older rows are deleted without a rollup."""
        with transaction(self._factory) as session:
            mark = rolled_until(session)
            if mark is not None:
                return mark
            found = [session.scalar(select(func.min(model.ts))) for model in (JobGpuSample, GpuSample, ProcessSample)]
        oldest = [float(ts) for ts in found if ts is not None]
        if not oldest:
            return None
        start = math.floor(min(oldest) / BUCKET_S) * BUCKET_S
        earliest = cutoff - FIRST_RUN_LOOKBACK_S
        if start >= earliest:
            return start
        LOG.warning("retention: raw samples go back to %s, more than %g days before the retention window "
                    "(a node's clock?); those before %s are deleted without a rollup", _iso(min(oldest)),
                    FIRST_RUN_LOOKBACK_S / 86400, _iso(earliest))
        with transaction(self._factory) as session:
            _set_mark(session, earliest)
        return earliest

    def _roll_bucket(self, bucket: float, result: RetentionResult) -> None:
        query = select(
            JobGpuSample.job_id, JobGpuSample.node, JobGpuSample.gpu_index, JobGpuSample.ts,
            JobGpuSample.sm_util_pct, JobGpuSample.memory_used_mib, JobGpuSample.memory_total_mib,
        ).where(JobGpuSample.ts >= bucket, JobGpuSample.ts < bucket + BUCKET_S + _LOOKAHEAD_S)
        query = query.order_by(JobGpuSample.job_id, JobGpuSample.node, JobGpuSample.gpu_index, JobGpuSample.ts)
        with transaction(self._factory) as session:
            rows: list[JobGpuRollup] = []
            stream = session.execute(query.execution_options(yield_per=_READ_BATCH))
            for _, series in groupby(stream, key=lambda row: (row[0], row[1], row[2])):
                raw = [tuple(row) for row in series]
                result.raw_rows_read += len(raw)
                pieces = [p for p in slices(raw, self._interval_s) if p.ts < bucket + BUCKET_S]  # type: ignore[arg-type]
                if pieces:
                    rows.append(rollup(bucket, pieces))
            session.execute(delete(JobGpuRollup).where(JobGpuRollup.bucket_ts == bucket))
            session.add_all(rows)
            _set_mark(session, bucket + BUCKET_S)
        result.hours_rolled += 1
        result.rollup_rows += len(rows)

    def _delete_batched(self, model: _Pruned, condition: ColumnElement[bool], deadline: float) -> tuple[int, bool]:
        """Delete the rows `condition` selects, `batch_rows` per transaction (short locks; agents keep
        inserting), until none is left (True) or `deadline` has passed (False).

        Oldest first, through the ts index: in id order the server walked the primary key over
        rows too new to delete, and the last, short batch read the whole table.
        """
        deleted = 0
        while True:
            with transaction(self._factory) as session:
                ids = list(session.scalars(select(model.id).where(condition).order_by(model.ts).limit(self._batch)))
                if ids:
                    session.execute(delete(model).where(model.id.in_(ids)))
            deleted += len(ids)
            if len(ids) < self._batch:
                return deleted, True
            if self._monotonic() >= deadline:
                return deleted, False



def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _old_publications(cutoff: float) -> ColumnElement[bool]:
    """Publisher records older than `cutoff`, but each node's newest written weight: a restarted
    publisher reads it to tell whether Slurm lost it."""
    newest = (select(func.max(NodePublication.id))
              .where(NodePublication.dry_run.is_(False), NodePublication.weight_after.is_not(None))
              .group_by(NodePublication.node))
    return and_(NodePublication.ts < cutoff, NodePublication.id.not_in(newest))


def rollup(bucket: float, pieces: Iterable[SampleSlice]) -> JobGpuRollup:
    """One series' slices within one hour, summed."""
    pieces = list(pieces)
    known = [p for p in pieces if p.used_gpu_s is not None]
    memory = [p.memory_used_mib for p in pieces if p.memory_used_mib is not None]
    totals = [p.memory_total_mib for p in pieces if p.memory_total_mib is not None]
    first = pieces[0]
    return JobGpuRollup(
        bucket_ts=bucket, job_id=first.job_id, node=first.node, gpu_index=first.gpu_index, first_ts=first.ts,
        samples=len(pieces), duration_s=sum(p.duration_s for p in pieces), known_s=sum(p.duration_s for p in known),
        used_gpu_s=sum(p.used_gpu_s or 0.0 for p in known), memory_used_mib_max=max(memory) if memory else None,
        memory_total_mib=max(totals) if totals else None,
    )


def rollup_slices(row: JobGpuRollup) -> list[SampleSlice]:
    """A rollup as the slices reports read: its known part at the mean utilization, the rest unknown."""
    result: list[SampleSlice] = []
    if row.known_s > 0:
        util = 100.0 * row.used_gpu_s / row.known_s
        result.append(SampleSlice(row.job_id, row.node, row.gpu_index, row.first_ts, row.known_s, util,
                                  row.memory_used_mib_max, row.memory_total_mib))
    if row.duration_s - row.known_s > 1e-9:
        result.append(SampleSlice(row.job_id, row.node, row.gpu_index, row.first_ts, row.duration_s - row.known_s,
                                  None, row.memory_used_mib_max, row.memory_total_mib))
    return result


def _set_mark(session: Session, mark: float) -> None:
    state = session.get(RetentionState, 1)
    if state is None:
        session.add(RetentionState(id=1, rolled_until=mark))
    else:
        state.rolled_until = max(state.rolled_until, mark)


class RetentionSchedule:
    """Runs retention from a daemon's tick at most once per `every_s` (the controller: hourly), and
    at every tick while a run left work for the next (its budget ran out)."""

    def __init__(self, retention: Retention, every_s: float = BUCKET_S,
                 monotonic: Callable[[], float] = time.monotonic, log: Callable[[str], None] = print) -> None:
        self._retention = retention
        self._every_s = every_s
        self._monotonic = monotonic
        self._log = log
        self._last: float | None = None
        self._unfinished = False

    def __call__(self) -> RetentionResult | None:
        """Run when due (the first call always is); a database error propagates to the tick."""
        now = self._monotonic()
        if self._last is not None and now - self._last < self._every_s and not self._unfinished:
            return None
        if not self._unfinished:
            self._last = now
        result = self._retention.run()
        self._unfinished = not result.finished
        if result.hours_rolled or any(result.deleted.values()):
            more = "" if result.finished else " (budget spent: more at the next tick)"
            self._log(f"retention: {result.hours_rolled} hour(s) rolled up into {result.rollup_rows} row(s) in "
                      f"{result.rollup_s:.1f} s; deleted {sum(result.deleted.values())} raw row(s) in "
                      f"{result.delete_s:.1f} s{more}")
        return result
