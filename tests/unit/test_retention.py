"""Retention on SQLite and MariaDB: rolled-up hours give the reports the same totals as raw rows."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from sqlalchemy import event, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import GpuSample, JobGpuRollup, JobGpuSample, NodePublication, open_database, transaction
from slurm_aigc.report.retention import BUCKET_S, Retention, RetentionResult, RetentionSchedule
from slurm_aigc.report.samples import SampleStore
from slurm_aigc.telemetry.store import Publication, TelemetryStore

T0 = datetime(2026, 11, 30, 0, tzinfo=UTC).timestamp()
HOURS = 6
NOW = T0 + HOURS * 3600 + 48 * 3600 + 1800  # every seeded hour is older than 48 h


@pytest.fixture
def factory(db_url: str) -> sessionmaker[Session]:
    factory = open_database(db_url)
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
    return factory


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
    result = Retention(factory, raw_retention_hours=48.0, batch_rows=700).run(NOW)
    assert result.hours_rolled == HOURS and result.rollup_rows == 2 * 6 + 1 * 3 + 4 * 4
    assert count(factory, JobGpuSample) == 0 and count(factory, GpuSample) == 0
    raw_rows = 2 * 6 * 360 + 1 * 3 * 360 + 4 * 4 * 360
    assert result.deleted == {"job_gpu_samples": raw_rows, "gpu_samples": raw_rows, "process_samples": 0,
                              "node_publications": 0}
    assert totals(factory, *window) == before


def test_hours_within_the_retention_stay_raw_and_a_window_across_the_mark_adds_up(factory: sessionmaker[Session]) -> None:
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    hour_2 = totals(factory, T0 + 2 * 3600, T0 + 3 * 3600)
    now = T0 + 3 * 3600 + 48 * 3600  # hours 0-2 are older than 48 h, 3-5 are not
    result = Retention(factory, raw_retention_hours=48.0).run(now)
    assert result.hours_rolled == 3
    with transaction(factory) as session:
        assert (session.scalar(select(func.min(JobGpuSample.ts))) or 0.0) >= T0 + 3 * 3600
    assert totals(factory, *window) == before
    assert totals(factory, T0 + 2 * 3600, T0 + 3 * 3600) == hour_2


def test_a_second_run_changes_nothing(factory: sessionmaker[Session]) -> None:
    retention = Retention(factory, raw_retention_hours=48.0)
    retention.run(NOW)
    rollups = count(factory, JobGpuRollup)
    again = retention.run(NOW)
    assert (again.hours_rolled, again.rollup_rows, sum(again.deleted.values())) == (0, 0, 0)
    assert count(factory, JobGpuRollup) == rollups


def test_rolled_up_but_not_yet_deleted_hours_are_not_counted_twice(factory: sessionmaker[Session]) -> None:
    # A controller stopped between the rollup and the deletion: readers take rollups before the mark only.
    window = (T0, T0 + HOURS * 3600)
    before = totals(factory, *window)
    Retention(factory, raw_retention_hours=48.0)._roll_bucket(T0, RetentionResult())
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
        result = Retention(factory, raw_retention_hours=48.0, batch_rows=1000).run(NOW)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert len(batches) == 12 and max(batches) == 1000 and sum(batches) == result.deleted["job_gpu_samples"] == 11160


def test_gpu_samples_are_pruned_before_any_job_has_a_sample(db_url: str) -> None:
    # A rollout: agents sample idle GPUs for days before a GPU job runs (no job_gpu_samples yet).
    factory = open_database(db_url)
    with transaction(factory) as session:
        session.execute(insert(GpuSample), [{"ts": T0 + 10 * i, "node": "t4-01", "gpu_index": 0, "sm_util_pct": 0.0}
                                            for i in range(HOURS * 360)])
    result = Retention(factory, 48.0).run(NOW)
    assert result.deleted["gpu_samples"] == HOURS * 360 and count(factory, GpuSample) == 0
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
    deleted = Retention(factory, 48.0, batch_rows=1).run(NOW).deleted["node_publications"]
    assert deleted == 4
    assert [(p.node, p.ts, p.weight_after) for p in store.publications()] == [("a100-01", old + 60, 30),
                                                                             ("t4-01", recent, 7)]
    assert store.last_published_weights() == {"a100-01": 30, "t4-01": 7}
    assert count(factory, NodePublication) == 2


def test_bucket_is_an_hour() -> None:
    assert BUCKET_S == 3600.0
    with pytest.raises(ValueError, match="raw_retention_hours must be > 0"):
        Retention(sessionmaker(), raw_retention_hours=0)


def test_the_controller_schedule_runs_retention_hourly(factory: sessionmaker[Session]) -> None:
    clock = [0.0]
    logged: list[str] = []
    schedule = RetentionSchedule(Retention(factory, 48.0, clock=lambda: NOW), monotonic=lambda: clock[0],
                                 log=logged.append)
    first = schedule()
    assert first is not None and first.hours_rolled == HOURS and logged[0].startswith("retention: 6 hour(s) rolled up")
    clock[0] = 3599.0
    assert schedule() is None
    clock[0] = 3600.0
    assert schedule() is not None and len(logged) == 1  # nothing left to do: nothing logged
