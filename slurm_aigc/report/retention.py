"""Retention: raw samples older than `storage.raw_retention_hours` become hourly per-job, per-GPU
rollups (`job_gpu_rollups`), then are deleted in bounded batches; the publisher's records
(`node_publications`) older than that are deleted too, but for each node's newest written weight.

A rollup holds the sums `report` needs (used GPU-seconds, sampled seconds, peak memory), computed
with the same slicing rule as the raw rows (`records.slices`), so a report over rolled-up hours
gives the same totals. Readers take raw rows at or after the mark (`retention_state.rolled_until`)
and rollups before it. The hour at the mark is rolled up in short transactions (`_Hour`): its raw
rows are read in time order, `batch_rows` a transaction, into compact per-GPU series in memory;
then the series are rolled up in key order, about `batch_rows` raw rows a transaction, each
replacing its series' rollups of the hour (delete, then insert); the transaction of the last one
also moves the mark. Until then the hour's rollups are invisible (not before the mark) and its raw
rows stay, so a crash at any point neither loses nor double-counts anything: a restart redoes the
hour, replacing what an earlier attempt wrote. Only rows older than the mark are deleted,
`batch_rows` per transaction, so no transaction holds locks for long.

One `run` works for at most `budget_s` (it runs in the controller's tick): it stops between two
transactions, inside an hour too; the next run of the same `Retention` goes on where it stopped.
The first run on a database (no mark yet) starts at most `FIRST_RUN_LOOKBACK_S` before the
retention window; older raw rows (a node whose clock said 2000) are deleted without a rollup, and
logged.

The retention window ends at the controller's clock or at the newest raw sample, whichever is
earlier (`_cutoff`): a controller clock days ahead (until chrony steps it back) must not roll up
and delete the window's rows, nor move the mark past the rows the agents write meanwhile.
"""

from __future__ import annotations

import logging
import math
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

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
# Seconds one `run` may work before it stops between two transactions: the controller's tick
# waits for it. A transaction reads or rolls up about `batch_rows` raw rows (well under 1 s).
DEFAULT_BUDGET_S = 5.0
# The first run rolls up at most this much before the retention window: a week of history that
# predates retention is kept, while one sample from a year-2000 clock costs no 230,000 hours.
FIRST_RUN_LOOKBACK_S = 7 * 24 * BUCKET_S
LOG = logging.getLogger(__name__)
# Keys per `IN (...)`: SQLite before 3.32 (EL8's) allows 999 bound parameters a statement.
_IN_LIST_MAX = 900
_Pruned = type[JobGpuSample] | type[GpuSample] | type[ProcessSample] | type[NodePublication]
# Rows read past an hour's end: each series' last sample in the hour needs its successor for its
# duration (`slices`), which counts gaps up to GAP_FACTOR poll intervals (here polls up to 200 s).
_LOOKAHEAD_S = 200.0 * GAP_FACTOR
_Key = tuple[str, str, int]  # job_id, node, gpu_index: one GPU series
_SAMPLE_MODELS = (JobGpuSample, GpuSample, ProcessSample)
# Agents sample every GPU each poll (10 s), busy or idle: a controller clock further than this
# ahead of the newest sample is wrong, or every agent is down; either is worth a warning, as is a
# mark this far past the cutoff. Less (a clock stepped back a little) is not.
_AHEAD_WARN_S = 3 * BUCKET_S


@dataclass
class RetentionResult:
    """What one `Retention.run` did."""

    hours_rolled: int = 0
    rollup_rows: int = 0
    raw_rows_read: int = 0
    deleted: dict[str, int] = field(default_factory=dict)
    rollup_s: float = 0.0
    delete_s: float = 0.0
    finished: bool = True  # False: the budget ran out; the next run goes on
    partial_hour: bool = False  # it ran out inside an hour: the mark stays until the hour is done


def rolled_until(session: Session) -> float | None:
    """The retention mark: raw rows before it are rolled up (and may be gone)."""
    value = session.scalar(select(RetentionState.rolled_until).where(RetentionState.id == 1))
    return None if value is None else float(value)


@dataclass
class _Series:
    """One GPU series' raw rows of the hour being rolled up, 16 bytes a row (8,000 GPUs at 10 s:
    about 55 MB for the hour), kept between runs."""

    ts: array[float] = field(default_factory=lambda: array("d"))
    util: array[float] = field(default_factory=lambda: array("d"))  # NaN: unknown
    # Over the hour's own rows, not those read past its end (what `rollup` takes from the slices).
    memory_used_mib_max: float | None = None
    memory_total_mib: float | None = None

    def add(self, ts: float, util: float | None, used: float | None, total: float | None, in_hour: bool) -> None:
        self.ts.append(ts)
        self.util.append(math.nan if util is None else util)
        if in_hour:
            self.memory_used_mib_max = _max(self.memory_used_mib_max, used)
            self.memory_total_mib = _max(self.memory_total_mib, total)

    def rollup(self, key: _Key, bucket: float, interval_s: float) -> JobGpuRollup:
        """The row `rollup` makes of the series' slices; the memory maxima are kept as the rows came."""
        raw = [(*key, ts, None if math.isnan(util) else util, None, None) for ts, util in zip(self.ts, self.util, strict=True)]
        row = rollup(bucket, [p for p in slices(raw, interval_s) if p.ts < bucket + BUCKET_S])
        row.memory_used_mib_max, row.memory_total_mib = self.memory_used_mib_max, self.memory_total_mib
        return row


@dataclass
class _Hour:
    """The hour at the mark, rolled up one transaction at a time across runs (`Retention._step`).

    Its raw rows are read in time order, through the ts index (no sort): a query in series order
    makes the server sort the whole hour before the first row (7 s for 8,000 GPUs on MariaDB),
    and without a (job, ts) index each chunk of series would scan the hour again.
    """

    bucket: float
    read_from: float  # the next raw row's ts; reading is done at `end`
    series: dict[_Key, _Series] = field(default_factory=dict)
    keys: list[_Key] | None = None  # once every row is read: the series in the order they are written
    written: int = 0  # how many of `keys` are rolled up

    @property
    def end(self) -> float:
        return self.bucket + BUCKET_S + _LOOKAHEAD_S


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
        self._hour: _Hour | None = None  # the hour a run stopped inside; a restart starts it again
        # Warned of, until it clears: a warning an hour while it lasts would bury the first.
        self._clock_ahead = self._mark_ahead = False

    def run(self, now_ts: float | None = None) -> RetentionResult:
        """Roll up every whole hour older than the retention, then delete what is rolled up, for at
        most `budget_s` (then `finished` is False and the next run goes on)."""
        result = RetentionResult()
        deadline = self._monotonic() + self._budget_s
        cutoff = self._cutoff(now_ts if now_ts is not None else self._clock())
        self._roll_up(cutoff, deadline, result)
        self._prune(cutoff, deadline, result)
        return result

    def _cutoff(self, now: float) -> float:
        """The hour `raw_retention_hours` before `now` or before the newest raw sample, whichever
        is earlier. The samples carry the agents' clocks: a controller clock ahead of them would
        roll up and delete the rows of the retention window and leave the mark in the future,
        where every row written after the clock is set right lies before the mark, so it is in
        no rollup and deleted. A node clock ahead is bounded by `now`. One MAX a table, read
        from the end of its ts index."""
        with transaction(self._factory) as session:
            found = [session.scalar(select(func.max(model.ts))) for model in _SAMPLE_MODELS]
        newest = max((float(ts) for ts in found if ts is not None), default=None)
        if newest is None:  # no raw row to keep: the publisher's records follow the clock
            return math.floor((now - self._retention_s) / BUCKET_S) * BUCKET_S
        self._warn_clock_ahead(now, newest)
        return math.floor((min(now, newest) - self._retention_s) / BUCKET_S) * BUCKET_S

    def _warn_clock_ahead(self, now: float, newest: float) -> None:
        ahead = now - newest > _AHEAD_WARN_S
        if ahead and not self._clock_ahead:
            LOG.warning("retention: this host's clock (%s) is %.1f h past the newest raw sample (%s): its clock "
                        "ahead, or no agent writing? raw samples are kept %g h back from the newest", _iso(now),
                        (now - newest) / 3600, _iso(newest), self._retention_s / 3600)
        self._clock_ahead = ahead

    def _roll_up(self, cutoff: float, deadline: float, result: RetentionResult) -> None:
        started = self._monotonic()
        bucket = self._first_bucket(cutoff)
        steps = 0
        while bucket is not None and bucket < cutoff:
            if steps and self._monotonic() >= deadline:  # one transaction at least: progress
                result.finished = False
                result.partial_hour = self._hour is not None
                break
            if self._hour is None or self._hour.bucket != bucket:  # new, or the mark moved elsewhere
                self._hour = _Hour(bucket, read_from=bucket)
            steps += 1
            if self._step(self._hour, result):
                self._hour = None
                result.hours_rolled += 1
                bucket += BUCKET_S
        result.rollup_s = self._monotonic() - started

    def _prune(self, cutoff: float, deadline: float, result: RetentionResult) -> None:
        started = self._monotonic()
        with transaction(self._factory) as session:
            mark = rolled_until(session)
        targets: list[tuple[_Pruned, ColumnElement[bool]]] = []
        if mark is not None:  # rolled up and out of the window (a mark past the cutoff: see the warning)
            self._warn_mark_ahead(mark, cutoff)
            targets = [(model, model.ts < min(mark, cutoff)) for model in _SAMPLE_MODELS]
        targets.append((NodePublication, _old_publications(cutoff)))
        for model, condition in targets:
            deleted, done = self._delete_batched(model, condition, deadline)
            result.deleted[model.__tablename__] = deleted
            result.finished = result.finished and done
        result.delete_s = self._monotonic() - started

    def _warn_mark_ahead(self, mark: float, cutoff: float) -> None:
        """A mark past the cutoff: left by a version that took the cutoff from a clock ahead, or
        `raw_retention_hours` raised since. The mark never moves back (`_set_mark`) and reports
        read rollups before it, so the raw rows between the cutoff and the mark are kept but read
        by no report, and deleted without a rollup once out of the window."""
        ahead = mark - cutoff > _AHEAD_WARN_S
        if ahead and not self._mark_ahead:
            LOG.warning("retention: the mark (%s) is past the retention window's start (%s): a run with the clock "
                        "ahead, or raw_retention_hours raised since? raw rows before the mark are in no report "
                        "and kept only until they leave the window", _iso(mark), _iso(cutoff))
        self._mark_ahead = ahead

    def _first_bucket(self, cutoff: float) -> float | None:
        """The mark, else the hour of the oldest raw row of any table (a node whose GPUs have not
        run a job yet still fills `gpu_samples`, which must not wait for a first job's sample), but
        no earlier than `FIRST_RUN_LOOKBACK_S` before `cutoff`: the older rows are deleted without
        a rollup. The mark is set there before the first hour is rolled up, so a restart inside
        that hour goes on from it (the lookback bound has moved by then)."""
        with transaction(self._factory) as session:
            mark = rolled_until(session)
            if mark is not None:
                return mark
            found = [session.scalar(select(func.min(model.ts))) for model in _SAMPLE_MODELS]
            oldest = [float(ts) for ts in found if ts is not None]
            if not oldest:
                return None
            start = math.floor(min(oldest) / BUCKET_S) * BUCKET_S
            earliest = cutoff - FIRST_RUN_LOOKBACK_S
            if start < earliest:
                LOG.warning("retention: raw samples go back to %s, more than %g days before the retention window "
                            "(a node's clock?); those before %s are deleted without a rollup", _iso(min(oldest)),
                            FIRST_RUN_LOOKBACK_S / 86400, _iso(earliest))
                start = earliest
            if start < cutoff:
                _set_mark(session, start)
        return start

    def _step(self, hour: _Hour, result: RetentionResult) -> bool:
        """One transaction of `hour`'s rollup: read raw rows, or roll up series; True once the hour
        is done (the mark moved past it)."""
        if hour.keys is None:
            self._read(hour, result)
            return False
        return self._write(hour, result)

    def _read(self, hour: _Hour, result: RetentionResult) -> None:
        """The next `batch_rows` raw rows of the hour (and of `_LOOKAHEAD_S` past it), oldest first."""
        query = select(
            JobGpuSample.job_id, JobGpuSample.node, JobGpuSample.gpu_index, JobGpuSample.ts,
            JobGpuSample.sm_util_pct, JobGpuSample.memory_used_mib, JobGpuSample.memory_total_mib,
        ).where(JobGpuSample.ts >= hour.read_from, JobGpuSample.ts < hour.end).order_by(JobGpuSample.ts)
        with transaction(self._factory) as session:
            rows = list(session.execute(query.limit(self._batch)).all())
            read_from = hour.end
            if len(rows) == self._batch:  # the last instant's rows may go on past the limit: read it next
                read_from = rows[-1][3]
                rows = [row for row in rows if row[3] < read_from]
                if not rows:  # more than `batch_rows` rows at one instant: all of them at once
                    rows = list(session.execute(query.where(JobGpuSample.ts == read_from)).all())
                    read_from = math.nextafter(read_from, math.inf)
        hour_end = hour.bucket + BUCKET_S
        for job_id, node, gpu_index, ts, util, used, total in rows:
            series = hour.series.get((job_id, node, gpu_index))
            if series is None and ts < hour_end:  # a series only past the hour's end has no rollup here
                series = hour.series[(job_id, node, gpu_index)] = _Series()
            if series is not None:
                series.add(ts, util, used, total, ts < hour_end)
        result.raw_rows_read += len(rows)
        hour.read_from = read_from
        if read_from >= hour.end:
            hour.keys = sorted(hour.series)

    def _write(self, hour: _Hour, result: RetentionResult) -> bool:
        """Roll up the next series, about `batch_rows` raw rows (one series at least), replacing
        their rollups of the hour; with the last, move the mark."""
        assert hour.keys is not None
        stop, size = hour.written, 0
        while stop < len(hour.keys) and size < self._batch:
            size += len(hour.series[hour.keys[stop]].ts)
            stop += 1
        chunk = hour.keys[hour.written:stop]
        rows = [hour.series[key].rollup(key, hour.bucket, self._interval_s) for key in chunk]
        with transaction(self._factory) as session:
            _replace(session, hour.bucket, rows)
            if stop == len(hour.keys):
                _set_mark(session, hour.bucket + BUCKET_S)
        for key in chunk:
            del hour.series[key]
        hour.written = stop
        result.rollup_rows += len(rows)
        return stop == len(hour.keys)

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
                # The table's highest id stays: without AUTOINCREMENT, SQLite gives an emptied table's
                # next row id 1, and the controller, which reads the samples after the highest id it
                # has seen, would miss every new one. Left out here rather than in the query, whose
                # plan (the ts index, no sort) stays as it was.
                newest = session.scalar(select(func.max(model.id)))
                doomed = [row_id for row_id in ids if row_id != newest]
                for start in range(0, len(doomed), _IN_LIST_MAX):
                    session.execute(delete(model).where(model.id.in_(doomed[start:start + _IN_LIST_MAX])))
            deleted += len(doomed)
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


def _replace(session: Session, bucket: float, rows: list[JobGpuRollup]) -> None:
    """Delete the rollups of `bucket` of these rows' series, then insert the rows: a chunk written
    again (a retry after a commit whose answer was lost, a restart that redoes the hour) leaves one
    row per series. An earlier attempt's series are all in the redo: the hour's raw rows (at or
    after the mark) are never deleted, and any series of them has its rows read by every attempt.
    Through the unique (bucket_ts, job_id, ...) index, never the other hours' rollups."""
    if not rows:
        return
    keys = {(row.job_id, row.node, row.gpu_index) for row in rows}
    job_ids = sorted({k[0] for k in keys})
    ids: list[int] = []
    for start in range(0, len(job_ids), _IN_LIST_MAX):  # a chunk may hold thousands of jobs' series
        old = session.execute(select(JobGpuRollup.id, JobGpuRollup.job_id, JobGpuRollup.node, JobGpuRollup.gpu_index)
                              .where(JobGpuRollup.bucket_ts == bucket,
                                     JobGpuRollup.job_id.in_(job_ids[start:start + _IN_LIST_MAX])))
        ids.extend(row_id for row_id, *key in old if tuple(key) in keys)
    for start in range(0, len(ids), _IN_LIST_MAX):
        session.execute(delete(JobGpuRollup).where(JobGpuRollup.id.in_(ids[start:start + _IN_LIST_MAX])))
    session.add_all(rows)


def _max(old: float | None, new: float | None) -> float | None:
    return old if new is None else new if old is None else max(old, new)


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
        """Run when due (the first call always is); a database error propagates to the tick, and
        the next try waits for the next hour: retried at every tick, a lasting error would fail
        every tick and the daemon loop's backoff would slow reclaim and the publisher to minutes."""
        now = self._monotonic()
        if self._last is not None and now - self._last < self._every_s and not self._unfinished:
            return None
        if not self._unfinished:
            self._last = now
        self._unfinished = False
        try:
            result = self._retention.run()
        except Exception:
            self._last = now  # an hour from this failure, also when it ended unfinished work
            raise
        self._unfinished = not result.finished
        if result.hours_rolled or any(result.deleted.values()):
            more = "" if result.finished else " (budget spent: more at the next tick)"
            self._log(f"retention: {result.hours_rolled} hour(s) rolled up into {result.rollup_rows} row(s) in "
                      f"{result.rollup_s:.1f} s; deleted {sum(result.deleted.values())} raw row(s) in "
                      f"{result.delete_s:.1f} s{more}")
        return result
