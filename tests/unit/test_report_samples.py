"""GPU-hours used from `job_gpu_samples` and the audit trail, on SQLite and MariaDB (`db_url`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import groupby
from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import ActionRecord, GpuSample, JobGpuRollup, JobGpuSample, RetentionState, open_database, transaction
from slurm_aigc.errors import DatabaseError
from slurm_aigc.report.figures import ReportParams, build_report
from slurm_aigc.report.records import slices
from slurm_aigc.report.sacct import parse_sacct_output
from slurm_aigc.report.samples import SampleStore
from tests.unit.sacct_json import DELIMITER, FIELDS, text_to_json

T0 = datetime(2026, 11, 30, 10, tzinfo=UTC).timestamp()


@pytest.fixture
def db(db_url: str) -> sessionmaker[Session]:
    return open_database(db_url)


def add_series(db: sessionmaker[Session], job: str, gpu: int, times: list[float], utils: list[float | None]) -> None:
    with transaction(db) as session:
        for t, util in zip(times, utils, strict=True):
            session.add(JobGpuSample(ts=t, node="a100-01", job_id=job, gpu_index=gpu, sm_util_pct=util,
                                     memory_used_mib=2048.0, memory_total_mib=81920.0))


def test_used_gpu_hours_are_util_times_interval(db: sessionmaker[Session]) -> None:
    times = [T0 + 10 * i for i in range(360)]  # one hour at the agent's 10 s
    add_series(db, "41", 0, times, [50.0] * 360)
    add_series(db, "41", 1, times, [100.0 if i < 180 else 0.0 for i in range(360)])
    store = SampleStore(db)
    pieces = list(store.job_slices(T0, T0 + 3600))
    assert len(pieces) == 720
    assert [p.gpu_index for p in pieces[:360]] == [0] * 360 and pieces[0].ts < pieces[1].ts
    used_gpu_h = sum(p.used_gpu_s or 0.0 for p in pieces) / 3600
    assert used_gpu_h == pytest.approx(0.5 + 0.5)



@contextmanager
def parameters_bound(db: sessionmaker[Session], marker: str) -> Iterator[list[int]]:
    """How many parameters each statement containing `marker` bound while the block ran."""
    bound: list[int] = []

    def listener(_conn: object, _cursor: object, statement: str, parameters: Sequence[object], *_rest: object) -> None:
        if marker in statement:
            bound.append(len(parameters))
    with db() as session:
        engine = session.get_bind().engine
    event.listen(engine, "before_cursor_execute", listener)
    try:
        yield bound
    finally:
        event.remove(engine, "before_cursor_execute", listener)


def test_many_job_ids_are_read_a_few_hundred_a_query(db: sessionmaker[Session]) -> None:
    # `replay --from-sacct` asked for every job of its window in one IN list (twice, once retention
    # has run): PostgreSQL refuses 65,535 parameters, an old SQLite (EL8's) 999.
    with transaction(db) as session:
        session.add_all(JobGpuSample(ts=T0 + 10 * i, node="a100-01", job_id=str(job), gpu_index=0, sm_util_pct=50.0)
                        for job in range(300) for i in range(2))
        session.add(RetentionState(id=1, rolled_until=T0 - 3600))  # rollups and raw rows: two IN lists
    with parameters_bound(db, "job_gpu_samples") as bound:
        pieces = list(SampleStore(db, ids_per_query=40).job_slices(T0 - 7200, T0 + 3600, [str(j) for j in range(300)] * 2))
    assert len(bound) == 8 and max(bound) <= 2 * 40 + 4  # 300 ids, 40 a query, each bound twice
    assert len(pieces) == 600 and len({p.job_id for p in pieces}) == 300
    jobs_in_order = [job for job, _ in groupby(p.job_id for p in pieces)]
    assert len(jobs_in_order) == 300  # each job's slices together


def test_many_jobs_actions_are_read_a_few_hundred_ids_a_query_in_intent_order(db: sessionmaker[Session]) -> None:
    # `report job` asks for a job and its sacct rows' ids (an array job's can be thousands).
    with transaction(db) as session:
        session.add_all(ActionRecord(observation_key=f"k{job}", ts_intent=T0 - job, job_id=str(job), verdict="idle",
                                     action="notify", step=0, dry_run=False, state="done") for job in range(100))
    with parameters_bound(db, "FROM actions") as bound:
        events = SampleStore(db, ids_per_query=30).actions(0.0, 0.0, [str(j) for j in range(100)])
    assert len(bound) == 4 and max(bound) <= 30
    assert [e.job_id for e in events] == [str(j) for j in reversed(range(100))]  # by intent time


def test_a_database_error_is_a_database_error(tmp_path: Path) -> None:
    # The store's sessions let SQLAlchemy's own errors out, past `replay --from-sacct`'s handling
    # of DatabaseError (a missing or unreachable database means a workload without samples).
    db = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    with transaction(db) as session:
        session.execute(text("DROP TABLE job_gpu_samples"))
        session.execute(text("DROP TABLE actions"))
    store = SampleStore(db)
    with pytest.raises(DatabaseError):
        list(store.job_slices(T0, T0 + 3600, ["1"]))
    with pytest.raises(DatabaseError):
        store.actions(T0, T0 + 3600)

def test_window_and_job_filters(db: sessionmaker[Session]) -> None:
    add_series(db, "1", 0, [T0 - 10, T0, T0 + 10], [10.0, 20.0, 30.0])
    add_series(db, "2", 0, [T0], [90.0])
    store = SampleStore(db)
    assert [p.sm_util_pct for p in store.job_slices(T0, T0 + 3600, ["1"])] == [20.0, 30.0]
    assert {p.job_id for p in store.job_slices(T0, T0 + 3600)} == {"1", "2"}


def test_gaps_and_missing_utilization() -> None:
    rows = [("1", "n", 0, T0 + t, u, None, None) for t, u in [(0, 100.0), (10, 100.0), (20, None), (30, 100.0), (500, 100.0)]]
    pieces = slices(rows)
    # Median interval 10 s; the 470 s gap (agent down) counts one interval, the last sample too.
    assert [p.duration_s for p in pieces] == [10.0, 10.0, 10.0, 10.0, 10.0]
    assert [p.used_gpu_s for p in pieces] == [10.0, 10.0, None, 10.0, 10.0]
    single = slices([("1", "n", 0, T0, 40.0, None, None)], default_interval_s=30.0)
    assert single[0].duration_s == 30.0 and single[0].used_gpu_s == pytest.approx(12.0)


def test_actions_read_back(db: sessionmaker[Session]) -> None:
    with transaction(db) as session:
        session.add(ActionRecord(observation_key="a", ts_intent=T0, ts_outcome=T0 + 5, job_id="41", verdict="idle",
                                 action="requeue", state="done", dry_run=False, gpu_hours_recovered=2.5))
        session.add(ActionRecord(observation_key="b", ts_intent=T0 + 7200, job_id="42", verdict="over_allocated",
                                 action="shrink", state="intent", dry_run=True))
    store = SampleStore(db)
    events = store.actions(T0, T0 + 3600)
    assert [(e.job_id, e.action, e.effective, e.ts) for e in events] == [("41", "requeue", True, T0 + 5)]
    assert [e.job_id for e in store.actions(0, 1, ["42"])] == ["42"]
    assert not store.actions(0, 1, ["42"])[0].effective


def test_report_joins_sacct_and_samples(db: sessionmaker[Session]) -> None:
    def row(job: str, tres: str) -> str:
        values = dict.fromkeys(FIELDS, "")
        values.update(JobID=job, JobIDRaw=job, State="COMPLETED", Submit="2026-11-30T10:00:00", Start="2026-11-30T10:00:00",
                      End="2026-11-30T11:00:00", AllocTRES=tres, NodeList="a100-01", Comment="aigc:type=train", ElapsedRaw="3600")
        return DELIMITER.join(values[f] for f in FIELDS)

    text = "\n".join([DELIMITER.join(FIELDS), row("41", "gres/gpu:a100=2,gres/gpu=2"), row("43", "gres/gpu:a100=1,gres/gpu=1")])
    times = [T0 + 10 * i for i in range(360)]
    add_series(db, "41", 0, times, [80.0] * 360)
    add_series(db, "41", 1, times, [20.0] * 360)
    store = SampleStore(db)
    params = ReportParams(T0 - 3600, T0 + 7200, (), tz=UTC)
    report = build_report(params, parse_sacct_output(text_to_json(text), tz=UTC), store.job_slices(params.since_ts, params.until_ts))
    total = report.total
    assert total.gpu_hours_allocated == pytest.approx(3.0)
    assert total.gpu_hours_used == pytest.approx(1.0)
    assert total.gpu_hours_sampled == pytest.approx(2.0)
    assert total.efficiency == pytest.approx(0.5)
    assert total.jobs_without_samples == 1 and total.gpu_hours_unsampled == pytest.approx(1.0)


def test_rolled_up_hours_at_the_window_edges_count_the_part_inside(db: sessionmaker[Session]) -> None:
    """Audit 5: mark at 12:00, window 10:30..13:00, one GPU at 100 %: allocated 2.5 GPU-h, used 2.5, not 2.0."""
    with transaction(db) as session:
        for hour in (0, 1):  # 10:00 and 11:00, rolled up: 360 polls at 100 %
            session.add(JobGpuRollup(bucket_ts=T0 + 3600 * hour, job_id="51", node="a100-01", gpu_index=0, first_ts=T0 + 3600 * hour,
                                     samples=360, duration_s=3600.0, known_s=3600.0, used_gpu_s=3600.0,
                                     memory_used_mib_max=2048.0, memory_total_mib=81920.0))
        session.add(RetentionState(id=1, rolled_until=T0 + 7200))
    add_series(db, "51", 0, [T0 + 7200 + 10 * i for i in range(360)], [100.0] * 360)
    values = dict.fromkeys(FIELDS, "")
    values.update(JobID="51", JobIDRaw="51", State="COMPLETED", Submit="2026-11-30T10:00:00", Start="2026-11-30T10:00:00",
                  End="2026-11-30T13:00:00", AllocTRES="gres/gpu:a100=1,gres/gpu=1", NodeList="a100-01", ElapsedRaw="10800")
    text = DELIMITER.join(FIELDS) + "\n" + DELIMITER.join(values[f] for f in FIELDS)
    params = ReportParams(T0 + 1800, T0 + 3 * 3600, (), tz=UTC)
    pieces = list(SampleStore(db).job_slices(params.since_ts, params.until_ts))
    assert min(p.ts for p in pieces) >= params.since_ts
    total = build_report(params, parse_sacct_output(text_to_json(text), tz=UTC), pieces).total
    assert total.gpu_hours_allocated == pytest.approx(2.5)
    assert (total.gpu_hours_used, total.gpu_hours_sampled, total.efficiency) == (pytest.approx(2.5), pytest.approx(2.5), pytest.approx(1.0))
    # The other edge: a window ending at 11:15 counts a quarter of the 11:00 hour.
    early = list(SampleStore(db).job_slices(T0 + 1800, T0 + 4500))
    assert sum(p.used_gpu_s or 0.0 for p in early) == pytest.approx(1800 + 900)


def test_retention_between_reading_the_mark_and_the_rows_loses_no_hour(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Retention runs in the controller on another host, whenever it likes: here it moves the mark
    # over three hours and deletes their raw rows right after the report has read the mark.
    # On SQLite the controller's retention is another process on the same file.
    from slurm_aigc.report import samples as samples_module
    from slurm_aigc.report.retention import Retention, rolled_until

    db = open_database(db_url)
    times = [T0 + 10 * i for i in range(6 * 360)]  # six hours at 50 %
    add_series(db, "41", 0, times, [50.0] * len(times))
    expected = sum(p.used_gpu_s or 0.0 for p in SampleStore(db).job_slices(T0, T0 + 6 * 3600))
    now = T0 + 3 * 3600 + 48 * 3600
    with transaction(db) as session:  # the agents' poll at that time: retention goes by the newest sample
        session.add(GpuSample(ts=now, node="t4-01", gpu_index=0, sm_util_pct=0.0))
    moved: list[float | None] = []

    def mark_then_retention(session: Session) -> float | None:
        mark = rolled_until(session)
        Retention(db, raw_retention_hours=48.0).run(now)
        with transaction(db) as after:
            moved.append(rolled_until(after))
        return mark

    monkeypatch.setattr(samples_module, "rolled_until", mark_then_retention)
    read = sum(p.used_gpu_s or 0.0 for p in SampleStore(db).job_slices(T0, T0 + 6 * 3600))
    assert moved == [T0 + 3 * 3600]  # retention did roll the three hours up in between
    assert read == pytest.approx(expected) and expected == pytest.approx(6 * 3600 * 0.5)
