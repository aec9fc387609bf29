"""Retention on SQLite, MariaDB and (opt-in) PostgreSQL: rolled-up hours give the reports the same totals as raw rows."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, func, insert, make_url, select
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import (
    GPU_SAMPLES_COVERING_INDEX,
    GpuSample,
    JobGpuRollup,
    JobGpuSample,
    NodePublication,
    RetentionState,
    open_database,
    transaction,
)
from slurm_aigc.errors import DatabaseError
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.report.retention import (
    BUCKET_S,
    DEFAULT_RAW_RETENTION_HOURS,
    FIRST_RUN_LOOKBACK_S,
    Retention,
    RetentionResult,
    RetentionSchedule,
    rolled_until,
)
from slurm_aigc.report.samples import SampleStore
from slurm_aigc.telemetry.store import Publication, TelemetryStore
from tests.unit.db_plans import Plan, plan, sent
from tests.unit.old_sqlite import sqlite_with_999_parameters

T0 = datetime(2026, 11, 30, 0, tzinfo=UTC).timestamp()
HOURS = 6
NOW = T0 + HOURS * 3600 + 48 * 3600 + 1800  # every seeded hour is older than 48 h


class SteppingClock:
    """A monotonic clock on which every look costs a second: budgets run out after a known number
    of transactions, without sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def factory(db_url: str) -> sessionmaker[Session]:
    factory = open_database(db_url)
    seed(factory)
    polled(factory, NOW)
    return factory


def polled(factory: sessionmaker[Session], ts: float) -> None:
    """An idle GPU's sample at `ts`. Agents sample every GPU each poll, so the newest sample says
    what time it is: retention keeps the raw rows of `raw_retention_hours` before it, whatever
    the controller's clock says."""
    with transaction(factory) as session:
        session.add(GpuSample(ts=ts, node="t4-01", gpu_index=0, sm_util_pct=0.0))


def seed(factory: sessionmaker[Session]) -> None:
    """Six hours of three jobs' samples, and the GPUs' (all on a100-01)."""
    samples: list[dict[str, object]] = []
    for job, gpus, start_h, end_h in (("41", 2, 0, 6), ("42", 1, 1, 4), ("43", 4, 2, 6)):
        for gpu in range(gpus):
            for i in range(int((end_h - start_h) * 360)):
                util = None if i % 37 == 5 else float((i * 7 + gpu * 13 + int(job)) % 101)
                samples.append({"ts": T0 + start_h * 3600 + 10 * i + 0.25 * gpu, "node": "a100-01", "job_id": job,
                                "gpu_index": gpu, "sm_util_pct": util, "memory_used_mib": 1000.0 + i % 50,
                                "memory_total_mib": 81920.0})
    with transaction(factory) as session:
        session.execute(insert(JobGpuSample), samples)
        session.execute(insert(GpuSample), [{k: row[k] for k in ("ts", "node", "gpu_index", "sm_util_pct")}
                                            for row in samples])


def totals(factory: sessionmaker[Session], since: float, until: float) -> dict[str, tuple[float, float, float]]:
    """Per job: used GPU-seconds, seconds with known utilization, peak memory (what reports sum)."""
    used: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for piece in SampleStore(factory).job_slices(since, until):
        acc = used[piece.job_id]
        if piece.used_gpu_s is not None:
            acc[0] += piece.used_gpu_s
            acc[1] += piece.duration_s
        acc[2] = max(acc[2], piece.memory_used_mib or 0.0)
    return {job: (round(a, 6), round(b, 6), c) for job, (a, b, c) in used.items()}


def count(factory: sessionmaker[Session],
          model: type[JobGpuSample] | type[GpuSample] | type[JobGpuRollup] | type[NodePublication]) -> int:
    with transaction(factory) as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def test_report_totals_over_rolled_up_hours_equal_the_raw_totals(factory: sessionmaker[Session]) -> None:
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    assert set(before) == {"41", "42", "43"} and before["41"][0] > 0
    result = Retention(factory, raw_retention_hours=48.0, batch_rows=700, budget_s=math.inf).run(NOW)
    assert result.hours_rolled == HOURS and result.rollup_rows == 2 * 6 + 1 * 3 + 4 * 4
    # job_gpu_samples' highest id stays; in gpu_samples it is the idle GPU's sample at NOW
    assert count(factory, JobGpuSample) == 1 and count(factory, GpuSample) == 1
    raw_rows = 2 * 6 * 360 + 1 * 3 * 360 + 4 * 4 * 360
    assert result.deleted == {"job_gpu_samples": raw_rows - 1, "gpu_samples": raw_rows, "process_samples": 0,
                              "node_publications": 0}
    assert totals(factory, *window) == before


def test_hours_within_the_retention_stay_raw_and_a_window_across_the_mark_adds_up(factory: sessionmaker[Session]) -> None:
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    hour_2 = totals(factory, T0 + 2 * 3600, T0 + 3 * 3600)
    now = T0 + 3 * 3600 + 48 * 3600  # hours 0-2 are older than 48 h, 3-5 are not
    result = Retention(factory, raw_retention_hours=48.0, budget_s=math.inf).run(now)
    assert result.hours_rolled == 3
    with transaction(factory) as session:
        assert (session.scalar(select(func.min(JobGpuSample.ts))) or 0.0) >= T0 + 3 * 3600
    assert totals(factory, *window) == before
    assert totals(factory, T0 + 2 * 3600, T0 + 3 * 3600) == hour_2


def test_a_second_run_changes_nothing(factory: sessionmaker[Session]) -> None:
    retention = Retention(factory, raw_retention_hours=48.0, budget_s=math.inf)
    retention.run(NOW)
    rollups = count(factory, JobGpuRollup)
    again = retention.run(NOW)
    assert (again.hours_rolled, again.rollup_rows, sum(again.deleted.values())) == (0, 0, 0)
    assert count(factory, JobGpuRollup) == rollups


def test_rolled_up_but_not_yet_deleted_hours_are_not_counted_twice(factory: sessionmaker[Session]) -> None:
    # A controller stopped between the rollup and the deletion: readers take rollups before the mark only.
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    Retention(factory, raw_retention_hours=48.0)._roll_up(T0 + 3600, math.inf, RetentionResult())  # hour 0 only
    assert count(factory, JobGpuSample) > 0 and count(factory, JobGpuRollup) == 2
    assert totals(factory, *window) == before


def test_deletes_go_in_bounded_batches(factory: sessionmaker[Session]) -> None:
    batches: list[int] = []

    def listener(_conn: object, _cursor: object, statement: str, parameters: Sequence[object], *_rest: object) -> None:
        if statement.startswith("DELETE FROM job_gpu_samples"):
            batches.append(len(parameters))
    with factory() as session:
        engine = session.get_bind().engine
    event.listen(engine, "before_cursor_execute", listener)
    try:
        result = Retention(factory, raw_retention_hours=48.0, batch_rows=800, budget_s=math.inf).run(NOW)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    # 11,160 rows but the highest id, 800 a transaction
    assert len(batches) == 14 and max(batches) == 800 and sum(batches) == result.deleted["job_gpu_samples"] == 11159



def test_the_highest_id_stays_so_that_new_samples_get_higher_ids(db_url: str) -> None:
    # SQLite (no AUTOINCREMENT) gave an emptied table's next row id 1: the controller, which reads
    # the rows after the highest id it has seen, missed every new sample.
    factory = open_database(db_url)
    with transaction(factory) as session:  # a job ran two hours; nothing since
        session.execute(insert(JobGpuSample), [{"ts": T0 + 10 * i, "node": "a100-01", "job_id": "100", "gpu_index": 0,
                                                "sm_util_pct": 0.0} for i in range(720)])
    store = ReclaimStore(factory)
    watermark = max(row.id for row in store.samples(["100"], 0.0))  # what the running controller remembers
    polled(factory, NOW)
    result = Retention(factory, 48.0, budget_s=math.inf).run(NOW)
    assert result.deleted["job_gpu_samples"] == 719
    with transaction(factory) as session:
        assert list(session.scalars(select(JobGpuSample.id))) == [watermark]
    with transaction(factory) as session:  # a new job's first polls
        session.execute(insert(JobGpuSample), [{"ts": NOW + 10 * i, "node": "a100-01", "job_id": "200", "gpu_index": 0,
                                                "sm_util_pct": 0.0} for i in range(6)])
    assert len(store.samples_after(["200"], watermark)) == 6


def test_no_statement_binds_more_than_an_old_sqlite_allows(tmp_path: Path) -> None:
    # SQLite before 3.32 (EL8) takes 999 parameters a statement: a delete batch of 5,000 ids, and
    # the rollup of an hour of more than 999 jobs, went into one IN list each.
    factory = sqlite_with_999_parameters(tmp_path / "old.db")
    with transaction(factory) as session:  # an hour of 1,000 short jobs, three polls each
        session.execute(insert(JobGpuSample), [{"ts": T0 + 10 * i, "node": "a100-01", "job_id": str(job), "gpu_index": 0,
                                                "sm_util_pct": 50.0} for job in range(1000) for i in range(3)])
    polled(factory, NOW)
    result = Retention(factory, 48.0, budget_s=math.inf).run(NOW)  # one batch of DEFAULT_BATCH_ROWS
    assert result.rollup_rows == 1000 and result.deleted["job_gpu_samples"] == 2999

def test_gpu_samples_are_pruned_before_any_job_has_a_sample(db_url: str) -> None:
    # A rollout: agents sample idle GPUs for days before a GPU job runs (no job_gpu_samples yet).
    factory = open_database(db_url)
    with transaction(factory) as session:
        session.execute(insert(GpuSample), [{"ts": T0 + 10 * i, "node": "t4-01", "gpu_index": 0, "sm_util_pct": 0.0}
                                            for i in range(HOURS * 360)])
    polled(factory, NOW)
    result = Retention(factory, 48.0, budget_s=math.inf).run(NOW)
    assert result.deleted["gpu_samples"] == HOURS * 360 and count(factory, GpuSample) == 1  # the sample at NOW
    assert result.hours_rolled == HOURS and count(factory, JobGpuRollup) == 0


def test_old_publisher_records_go_but_each_nodes_newest_written_weight_stays(db_url: str) -> None:
    factory = open_database(db_url)
    store = TelemetryStore(factory)
    old, recent = T0, NOW - 3600.0
    store.record_publications([
        Publication(old, "a100-01", None, None, 10, 20, "weight", False),
        Publication(old + 60, "a100-01", None, None, 20, 30, "weight", False),  # its newest written weight
        Publication(old + 120, "a100-01", ("a100",), ("a100", "nvfree8"), None, None, "features", False),
        Publication(old + 180, "a100-01", None, None, 30, 40, "weight", True),  # dry-run: not written
        Publication(old, "t4-01", None, None, 5, 6, "weight", False),
        Publication(recent, "t4-01", None, None, 6, 7, "weight", False),  # within the retention
    ])
    deleted = Retention(factory, 48.0, batch_rows=1, budget_s=math.inf).run(NOW).deleted["node_publications"]
    assert deleted == 4
    assert [(p.node, p.ts, p.weight_after) for p in store.publications()] == [("a100-01", old + 60, 30),
                                                                             ("t4-01", recent, 7)]
    assert store.last_published_weights() == {"a100-01": 30, "t4-01": 7}
    assert count(factory, NodePublication) == 2


def test_bucket_is_an_hour() -> None:
    assert BUCKET_S == 3600.0
    with pytest.raises(ValueError, match="raw_retention_hours and budget_s must be > 0"):
        Retention(sessionmaker(), raw_retention_hours=0)
    with pytest.raises(ValueError, match="raw_retention_hours and budget_s must be > 0"):
        Retention(sessionmaker(), budget_s=0)


def test_the_controller_schedule_runs_retention_hourly(factory: sessionmaker[Session]) -> None:
    clock = [0.0]
    logged: list[str] = []
    schedule = RetentionSchedule(Retention(factory, 48.0, budget_s=math.inf, clock=lambda: NOW), monotonic=lambda: clock[0],
                                 log=logged.append)
    first = schedule()
    assert first is not None and first.hours_rolled == HOURS and logged[0].startswith("retention: 6 hour(s) rolled up")
    clock[0] = 3599.0
    assert schedule() is None
    clock[0] = 3600.0
    assert schedule() is not None and len(logged) == 1  # nothing left to do: nothing logged


def test_a_sample_from_a_wrong_clock_is_deleted_without_rolling_up_every_hour_since(
        factory: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    # Before: the first run started at the oldest raw row, one transaction per hour from there
    # (a node whose clock said 2000: 230,000 of them); here 30 days back, 726 hours.
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    wrong = T0 - 30 * 86400.0
    with transaction(factory) as session:
        session.add(JobGpuSample(ts=wrong, node="a100-09", job_id="7", gpu_index=0, sm_util_pct=50.0))
        session.add(GpuSample(ts=wrong, node="a100-09", gpu_index=0))
    caplog.set_level(logging.WARNING, logger="slurm_aigc.report.retention")
    result = Retention(factory, 48.0, budget_s=math.inf).run(NOW)
    lookback_hours = int(FIRST_RUN_LOOKBACK_S / BUCKET_S)
    assert result.hours_rolled == lookback_hours  # from the bound to the retention window, not from the wrong row
    assert result.rollup_rows == 2 * 6 + 1 * 3 + 4 * 4 and count(factory, JobGpuSample) == 1
    assert count(factory, GpuSample) == 2  # the highest id (the wrong one) and the sample at NOW
    with transaction(factory) as session:
        assert session.scalar(select(func.min(JobGpuRollup.bucket_ts))) == T0  # job 7's wrong hour: never rolled up
    assert totals(factory, *window) == before
    assert "raw samples go back to 2026-10-31T00:00:00+00:00" in caplog.text and "deleted without a rollup" in caplog.text


def test_a_run_stops_at_its_budget_and_the_next_goes_on_from_the_mark(factory: sessionmaker[Session]) -> None:
    # The controller runs retention in its tick: one run must not hold it for minutes.
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    monotonic = SteppingClock()
    retention = Retention(factory, 48.0, batch_rows=2000, budget_s=4.0, monotonic=monotonic)
    runs: list[RetentionResult] = []
    while not runs or not runs[-1].finished:
        started = monotonic.now
        runs.append(retention.run(NOW))
        assert totals(factory, *window) == before  # readers see the same at every stop
        assert monotonic.now - started < 16  # a few transactions a run, not all of them
        assert len(runs) < 30
    assert len(runs) > 3 and not runs[0].finished
    assert sum(r.hours_rolled for r in runs) == HOURS and sum(r.rollup_rows for r in runs) == 2 * 6 + 1 * 3 + 4 * 4
    assert count(factory, JobGpuSample) == count(factory, GpuSample) == 1  # each table's highest id stays


def test_the_schedule_runs_again_at_the_next_tick_while_a_run_left_work(factory: sessionmaker[Session]) -> None:
    monotonic = SteppingClock()
    logged: list[str] = []
    schedule = RetentionSchedule(Retention(factory, 48.0, budget_s=2.0, clock=lambda: NOW, monotonic=monotonic),
                                 monotonic=lambda: 0.0, log=logged.append)
    results = [schedule() for _ in range(40)]
    done = [r for r in results if r is not None]
    assert len(done) > 3 and done[-1].finished and not done[0].finished
    assert results[len(done):] == [None] * (40 - len(done))  # then hourly again
    assert "budget spent: more at the next tick" in logged[0]
    assert count(factory, JobGpuSample) == 1  # the highest id stays


def test_after_an_error_the_schedule_waits_for_the_next_hour_even_inside_unfinished_work(
        factory: sessionmaker[Session]) -> None:
    # Retried at every tick, a lasting database error failed every controller tick, and the
    # loop's backoff stretched reclaim and the publisher to minutes.
    clock = [0.0]
    monotonic = SteppingClock()
    retention = Retention(factory, 48.0, budget_s=2.0, clock=lambda: NOW, monotonic=monotonic)
    schedule = RetentionSchedule(retention, monotonic=lambda: clock[0], log=lambda _: None)
    first = schedule()
    assert first is not None and not first.finished  # work left for the next tick
    failing = [0]

    def broken(now_ts: float | None = None) -> RetentionResult:
        failing[0] += 1
        raise DatabaseError("the server went away")
    retention.run = broken  # type: ignore[method-assign]
    with pytest.raises(DatabaseError):
        schedule()
    clock[0] = 10.0
    assert schedule() is None and failing[0] == 1  # not at every tick
    clock[0] = 3600.0
    with pytest.raises(DatabaseError):
        schedule()
    assert failing[0] == 2
    # Unfinished work that fails long after its first run waits an hour from the failure too.
    retention.run = lambda now_ts=None: RetentionResult(finished=False)  # type: ignore[method-assign]
    clock[0] = 7200.0
    assert schedule() is not None  # hourly: due, and leaves work
    clock[0] = 7200.0 + 2 * 3600
    retention.run = broken  # type: ignore[method-assign]
    with pytest.raises(DatabaseError):
        schedule()
    clock[0] += 10.0
    assert schedule() is None and failing[0] == 3


def test_batched_deletes_take_the_oldest_rows_through_the_ts_index(factory: sessionmaker[Session]) -> None:
    # In id order the server walked the primary key over rows too new to delete (the last, short
    # batch read the whole table), or sorted every old row for each batch of 1,000.
    with factory() as session:
        engine = session.get_bind().engine
    batches = sent(engine, lambda statement: statement.startswith("SELECT") and " LIMIT " in statement,
                   lambda: Retention(factory, 48.0, batch_rows=1000, budget_s=math.inf).run(NOW))
    # The deletes' batches, not the rollup's reads of one hour (a range PostgreSQL may scan).
    first = {table: next(b for b in batches if b[0].startswith(f"SELECT {table}.id ")) for table in ("job_gpu_samples", "gpu_samples")}
    seed(factory)  # plans of the tables as they were, every row there
    for table, index in (("job_gpu_samples", "ix_job_gpu_samples_ts"), ("gpu_samples", GPU_SAMPLES_COVERING_INDEX)):
        statement, parameters = first[table]
        assert plan(engine, statement, parameters, table) == Plan(frozenset({index}), sorts=False), statement


def test_an_hour_is_read_whole_where_the_server_prints_floats_rounded(db_url: str) -> None:
    # PostgreSQL prints float8 to 15 significant digits where extra_float_digits = 0 (a site's or
    # a role's setting): a ts of 1.7e9 s to the microsecond came back rounded, and paging the hour
    # by the last ts read skipped the rows between the true and the printed value.
    if make_url(db_url).get_backend_name() == "postgresql":
        admin = create_engine(db_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.exec_driver_sql(f"ALTER DATABASE {make_url(db_url).database} SET extra_float_digits = 0")
        admin.dispose()  # the setting applies to new sessions
        with admin.connect() as connection:
            assert connection.exec_driver_sql("SELECT 1764460900.123456::float8").scalar() == 1764460900.12346
        admin.dispose()
    factory = open_database(db_url)
    first = T0 + 100.123456
    stamps = [first + k * 1e-6 for k in range(5)]
    with transaction(factory) as session:
        session.execute(insert(JobGpuSample), [{"ts": ts, "node": "a100-01", "job_id": "51", "gpu_index": 0,
                                                "sm_util_pct": 50.0, "memory_used_mib": 1.0, "memory_total_mib": 2.0}
                                               for ts in stamps])
    with transaction(factory) as session:
        assert sorted(session.scalars(select(JobGpuSample.ts))) == stamps
    polled(factory, NOW)
    result = Retention(factory, 48.0, batch_rows=2, budget_s=math.inf).run(NOW)
    assert result.raw_rows_read == 5 and result.rollup_rows == 1


def mark(factory: sessionmaker[Session]) -> float | None:
    with transaction(factory) as session:
        return rolled_until(session)


def test_one_big_hour_is_split_by_the_budget_and_readers_see_the_raw_totals_meanwhile(
        factory: sessionmaker[Session]) -> None:
    # At 8,000 GPUs one hour is 2.9 M raw rows (80 s): the controller's tick must not wait for it.
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    monotonic = SteppingClock()
    now = T0 + 3600 + 48 * 3600  # hour 0 only: 720 rows (job 41's 2 GPUs), 180 more read past its end
    retention = Retention(factory, 48.0, batch_rows=100, budget_s=2.0, monotonic=monotonic)
    runs: list[RetentionResult] = []
    half_written = False
    while not runs or not runs[-1].finished:
        started = monotonic.now
        runs.append(retention.run(now))
        assert monotonic.now - started < 12  # a few transactions a run, not the hour
        if mark(factory) == T0:  # the hour is not done: the mark stays
            assert runs[-1].partial_hour and runs[-1].hours_rolled == 0 and not runs[-1].finished
            half_written = half_written or count(factory, JobGpuRollup) == 1  # one GPU's rollup, not yet visible
        assert totals(factory, *window) == before  # readers see the exact raw totals at every stop
        assert len(runs) < 30
    assert len(runs) > 4 and half_written and not runs[0].finished
    assert sum(r.hours_rolled for r in runs) == 1 and sum(r.rollup_rows for r in runs) == count(factory, JobGpuRollup) == 2
    assert sum(r.raw_rows_read for r in runs) == 720 + 180 and mark(factory) == T0 + 3600
    assert count(factory, JobGpuSample) == 11160 - 720  # hour 0 deleted, the rest raw


def test_a_restart_inside_an_hour_redoes_it_without_duplicates(factory: sessionmaker[Session]) -> None:
    # The controller restarts after some of an hour's rollups are written: the new process starts
    # the hour again (its Retention is fresh), replacing what the first one wrote.
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    monotonic = SteppingClock()
    first = Retention(factory, 48.0, batch_rows=300, budget_s=1.0, monotonic=monotonic)
    for _ in range(10):  # until the first of hour 0's two series is written
        result = first.run(NOW)
        if count(factory, JobGpuRollup):
            break
    assert result.partial_hour and count(factory, JobGpuRollup) == 1 and mark(factory) == T0
    assert totals(factory, *window) == before
    again = Retention(factory, 48.0, budget_s=math.inf).run(NOW)
    assert again.finished and not again.partial_hour and again.hours_rolled == HOURS
    with transaction(factory) as session:
        keys = session.execute(select(JobGpuRollup.bucket_ts, JobGpuRollup.job_id, JobGpuRollup.gpu_index)).all()
    assert len(keys) == len(set(keys)) == 2 * 6 + 1 * 3 + 4 * 4
    assert totals(factory, *window) == before
    assert first.run(NOW).hours_rolled == 0 and count(factory, JobGpuRollup) == len(keys)  # its old hour: done


def test_a_first_run_stopped_inside_an_hour_goes_on_from_it_after_the_lookback_has_moved(
        factory: sessionmaker[Session]) -> None:
    # No mark yet: the first run sets it at the hour it starts, so a restart days later does not
    # jump to the new lookback bound past the half-written hour (its rollups would then be read).
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    monotonic = SteppingClock()
    first = Retention(factory, 48.0, batch_rows=300, budget_s=1.0, monotonic=monotonic)
    while not count(factory, JobGpuRollup):
        assert first.run(NOW).partial_hour
    later = NOW + FIRST_RUN_LOOKBACK_S + 86400  # the lookback bound is now past every seeded hour
    polled(factory, later)
    result = Retention(factory, 48.0, budget_s=math.inf).run(later)
    assert result.hours_rolled > HOURS and result.rollup_rows == 2 * 6 + 1 * 3 + 4 * 4
    assert totals(factory, *window) == before


@pytest.mark.parametrize("batch_rows", [4, 7])
def test_an_instant_with_more_rows_than_a_batch_is_read_whole(db_url: str, batch_rows: int) -> None:
    # One agent writes a node's GPUs with one ts: a batch cut inside an instant must neither drop
    # nor repeat its rows (4: every batch is one instant of 6 rows; 7: one instant and one row).
    factory = open_database(db_url)
    with transaction(factory) as session:
        session.execute(insert(JobGpuSample), [
            {"ts": T0 + 10 * i, "node": "h100-01", "job_id": "51", "gpu_index": gpu,
             "sm_util_pct": float((i + gpu) % 100), "memory_used_mib": float(i % 7), "memory_total_mib": 81920.0}
            for i in range(360 + 30) for gpu in range(6)])
    before = totals(factory, T0, T0 + 3600)
    polled(factory, T0 + 3600 + 48 * 3600)
    result = Retention(factory, 48.0, batch_rows=batch_rows, budget_s=math.inf).run(T0 + 3600 + 48 * 3600)
    assert result.hours_rolled == 1 and result.rollup_rows == 6 and result.raw_rows_read == (360 + 30) * 6
    assert totals(factory, T0, T0 + 3600) == before
    with transaction(factory) as session:
        rows = session.scalars(select(JobGpuRollup).order_by(JobGpuRollup.gpu_index)).all()
        assert [(r.samples, r.duration_s, r.memory_used_mib_max) for r in rows] == [(360, 3600.0, 6.0)] * 6


def poll_job(factory: sessionmaker[Session], since: float, until: float) -> None:
    """A job's GPU polled every 60 s over [since, until): its job and GPU samples."""
    rows = [{"ts": since + 60 * i, "node": "a100-01", "job_id": "61", "gpu_index": 0, "sm_util_pct": float(i % 101)}
            for i in range(int((until - since) / 60))]
    with transaction(factory) as session:
        session.execute(insert(JobGpuSample), rows)
        session.execute(insert(GpuSample), [{k: row[k] for k in ("ts", "node", "gpu_index", "sm_util_pct")} for row in rows])


def raw_since(factory: sessionmaker[Session], since: float) -> tuple[int, int]:
    with transaction(factory) as session:
        return (int(session.scalar(select(func.count()).where(JobGpuSample.ts >= since)) or 0),
                int(session.scalar(select(func.count()).where(GpuSample.ts >= since)) or 0))


def test_a_controller_clock_days_ahead_deletes_neither_the_window_nor_the_rows_written_after_it_is_set_right(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # The cutoff came from the controller's clock alone: 5 days ahead (until chrony stepped it
    # back), a run rolled up and deleted the last 48 h of 60 h of samples and left the mark 72 h
    # ahead; after the step every run deleted the new rows, in no rollup, until time reached it.
    factory = open_database(db_url)
    now, retention_s = T0 + 60 * 3600, DEFAULT_RAW_RETENTION_HOURS * 3600
    poll_job(factory, T0, now)
    window, before = raw_since(factory, now - retention_s), totals(factory, T0, now)
    clock = [now + 5 * 86400.0]
    caplog.set_level(logging.WARNING, logger="slurm_aigc.report.retention")
    retention = Retention(factory, budget_s=math.inf, clock=lambda: clock[0])
    assert retention.run().hours_rolled > 0  # the hours before the window are rolled up as ever
    assert raw_since(factory, now - retention_s) == window == (48 * 60, 48 * 60)
    assert (mark(factory) or math.inf) <= now - retention_s and totals(factory, T0, now) == before
    assert "past the newest raw sample" in caplog.text
    clock[0] = now + 3600  # set right; the agents went on
    poll_job(factory, now, now + 3600)
    before = totals(factory, T0, now + 3600)
    retention.run()
    assert raw_since(factory, now) == (60, 60) and raw_since(factory, now + 3600 - retention_s) == (48 * 60, 48 * 60)
    assert totals(factory, T0, now + 3600) == before


def test_a_mark_left_ahead_by_a_clock_ahead_deletes_no_row_within_the_window(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # A version that took the cutoff from the clock alone left the mark 72 h ahead: every run
    # deleted the rows written since, within the retention window, because they lay before it.
    factory = open_database(db_url)
    now = T0 + 60 * 3600
    poll_job(factory, now - 3600, now)
    with transaction(factory) as session:
        session.add(RetentionState(id=1, rolled_until=now + 72 * 3600))
    caplog.set_level(logging.WARNING, logger="slurm_aigc.report.retention")
    result = Retention(factory, budget_s=math.inf, clock=lambda: now).run()
    assert result.deleted == {"job_gpu_samples": 0, "gpu_samples": 0, "process_samples": 0, "node_publications": 0}
    assert raw_since(factory, now - 3600) == (60, 60) and mark(factory) == now + 72 * 3600  # the mark never moves back
    assert "the mark (2026-12-05T12:00:00+00:00) is past the retention window's start" in caplog.text


def test_the_newest_sample_is_read_from_the_end_of_each_ts_index(factory: sessionmaker[Session]) -> None:
    # Every run reads each sample table's newest ts (the window's end): without the index, a scan
    # of the 400 million raw rows a 48 h window holds at 1,000 nodes.
    with factory() as session:
        engine = session.get_bind().engine
    newest = sent(engine, lambda statement: statement.startswith("SELECT max(") and ".ts)" in statement,
                  lambda: Retention(factory, 48.0, budget_s=math.inf).run(NOW))
    seed(factory)  # plans of the tables as they were, every row there
    indexes = {"job_gpu_samples": "ix_job_gpu_samples_ts", "gpu_samples": GPU_SAMPLES_COVERING_INDEX,
               "process_samples": "ix_process_samples_ts"}
    assert sorted(statement.split("(", 2)[1].split(".")[0] for statement, _ in newest) == sorted(indexes)
    for statement, parameters in newest:
        table = statement.split("(", 2)[1].split(".")[0]
        # MariaDB answers from the index's end before the plan: "Select tables optimized away".
        assert plan(engine, statement, parameters, table) in (Plan(frozenset({indexes[table]}), sorts=False),
                                                              Plan(frozenset(), sorts=False)), statement
