"""The database boundary on SQLite, MariaDB and (opt-in) PostgreSQL: start-up races, migrations,
timeouts, credentials, masking."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, func, insert, inspect, select, text
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.schema import CreateTable

from slurm_aigc import db
from slurm_aigc.db import (
    SCHEMA_VERSION,
    GpuSample,
    JobGpuSample,
    SchemaVersion,
    StartupRetry,
    mask_url,
    open_database,
    read_url_file,
    transaction,
)
from slurm_aigc.errors import DatabaseError
from slurm_aigc.lease import RECLAIM, Leases
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.telemetry.store import TelemetryStore
from tests.unit.db_plans import plan, sent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "db"
NO_WAIT = StartupRetry(attempts=2, sleep=lambda _s: None)


# ---------------------------------------------------------------- start-up

def _open_and_write(url: str, start: multiprocessing.synchronize.Event, number: int) -> None:
    start.wait(30)
    factory = open_database(url)
    with transaction(factory) as session:
        session.add(GpuSample(ts=1.0, node=f"n{number:02d}", gpu_index=0))


def test_sixteen_daemons_starting_together_on_an_empty_database_all_come_up(db_url: str) -> None:
    # Measured on main before the fix: four agents at once, one died with
    # "UNIQUE constraint failed: schema_version.id".
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    workers = [context.Process(target=_open_and_write, args=(db_url, start, n)) for n in range(16)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(120)
    assert [worker.exitcode for worker in workers] == [0] * 16
    factory = open_database(db_url)
    with transaction(factory) as session:
        assert session.scalar(select(func.count()).select_from(GpuSample)) == 16
        assert [tuple(r) for r in session.execute(select(SchemaVersion.id, SchemaVersion.version))] == [(1, SCHEMA_VERSION)]


def test_opening_a_current_database_takes_no_lock_and_runs_no_ddl(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # An agent's role may not create tables: the second open must only read the version row.
    open_database(db_url)

    def no_lock(*_args: object) -> None:
        raise AssertionError("took the schema lock on a current database")
    monkeypatch.setattr(db, "_schema_lock", no_lock)
    open_database(db_url)


def test_a_newer_schema_is_refused_with_the_versions(db_url: str) -> None:
    factory = open_database(db_url)
    with transaction(factory) as session:
        session.get(SchemaVersion, 1).version = SCHEMA_VERSION + 1  # type: ignore[union-attr]
    with pytest.raises(DatabaseError, match=f"version {SCHEMA_VERSION + 1}, newer than this slurm-aigc"):
        open_database(db_url)



def test_a_reader_opens_no_sqlite_database_that_is_not_there(tmp_path: Path) -> None:
    # Before the fix `audit --db sqlite:////x/nodir/typo.db` made nodir/, typo.db and its lock file.
    missing = f"sqlite:///{tmp_path / 'nodir' / 'typo.db'}"
    with pytest.raises(DatabaseError, match=r"nodir/typo\.db: no such database file"):
        open_database(missing, create=False)
    assert list(tmp_path.iterdir()) == []
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_database(url)  # the writers create it
    with transaction(open_database(url, create=False)) as session:
        assert session.scalar(select(SchemaVersion.version)) == SCHEMA_VERSION
    open_database("sqlite://", create=False)  # in memory: nothing to find


# ---------------------------------------------------------------- migrations

def _create_version(url: str, version: int) -> None:
    """An empty database of an older schema, from its DDL in tests/fixtures/db."""
    dialect = next((name for name in ("sqlite", "postgresql") if url.startswith(name)), "mysql")
    lines = (FIXTURES / f"schema_v{version}.{dialect}.sql").read_text().splitlines()
    script = "\n".join(line for line in lines if not line.startswith("--"))
    statements = [s.strip() for s in script.split(";") if s.strip()]
    engine = create_engine(url)
    with engine.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))
    engine.dispose()


def _create_version_1(url: str) -> None:
    _create_version(url, 1)
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO job_gpu_samples (ts, node, job_id, gpu_index, sm_util_pct, memory_used_mib, shared) "
            "VALUES (1000.0, 'a100-01', '41', 3, 55.0, 2048.0, FALSE)"))
        connection.execute(text(
            "INSERT INTO actions (observation_key, ts_intent, job_id, verdict, action, step, dry_run, state, detail) "
            "VALUES ('41/r0/idle/0:notify', 2000.0, '41', 'idle', 'notify', 0, FALSE, 'done', '{}')"))
    engine.dispose()


def test_a_version_1_database_is_upgraded_and_its_rows_read_back(db_url: str) -> None:
    _create_version_1(db_url)
    factory = open_database(db_url)
    with transaction(factory) as session:
        assert session.scalar(select(SchemaVersion.version)) == SCHEMA_VERSION
        row = session.scalars(select(JobGpuSample)).one()
        assert (row.ts, row.node, row.job_id, row.gpu_index, row.sm_util_pct) == (1000.0, "a100-01", "41", 3, 55.0)
        assert session.scalar(select(db.ActionRecord.observation_key)) == "41/r0/idle/0:notify"
        # Version 2: a Unix time keeps its fraction (MySQL's FLOAT kept ~2 minutes of it).
        session.add(JobGpuSample(ts=1796308714.25, node="a100-01", job_id="42", gpu_index=0))
    with transaction(factory) as session:
        assert session.scalar(select(JobGpuSample.ts).where(JobGpuSample.job_id == "42")) == 1796308714.25
        assert {"job_gpu_rollups", "retention_state"} <= set(inspect(session.get_bind()).get_table_names())
    assert _gpu_sample_indexes(db_url) == {db.GPU_SAMPLES_COVERING_INDEX}


def _gpu_sample_indexes(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {index["name"] for index in inspect(engine).get_indexes("gpu_samples")}
    finally:
        engine.dispose()


def test_a_version_2_database_gets_the_covering_index_in_place_of_the_ts_and_node_ones(db_url: str) -> None:
    factory = open_database(db_url)
    with transaction(factory) as session:
        session.add(GpuSample(ts=5.0, node="a100-01", gpu_index=0, sm_util_pct=40.0))
    assert _gpu_sample_indexes(db_url) == {db.GPU_SAMPLES_COVERING_INDEX}  # as created
    engine = create_engine(db_url)
    with engine.begin() as connection:  # back to what version 2 had
        db.drop_index(connection, "gpu_samples", db.GPU_SAMPLES_COVERING_INDEX)
        connection.execute(text("CREATE INDEX ix_gpu_samples_ts ON gpu_samples (ts)"))
        connection.execute(text("CREATE INDEX ix_gpu_samples_node ON gpu_samples (node)"))
        connection.execute(text("UPDATE schema_version SET version = 2"))
    engine.dispose()
    factory = open_database(db_url)
    assert _gpu_sample_indexes(db_url) == {db.GPU_SAMPLES_COVERING_INDEX}
    with transaction(factory) as session:
        assert session.scalar(select(SchemaVersion.version)) == SCHEMA_VERSION
        assert session.scalar(select(GpuSample.sm_util_pct)) == 40.0


@pytest.mark.parametrize("dialect", [mysql.dialect(), mysql.dialect(is_mariadb=True), postgresql.dialect(),
                                     sqlite.dialect()], ids=["mysql", "mariadb", "postgresql", "sqlite"])
def test_the_tables_that_grow_have_64_bit_ids_on_server_databases(dialect: Dialect) -> None:
    # INT AUTO_INCREMENT and SERIAL stop at 2^31 - 1: about a month of one sample table at 1,000 nodes.
    # SQLite keeps INTEGER: only that spelling makes the key its (64-bit) rowid.
    expected = {"mysql": "id BIGINT NOT NULL AUTO_INCREMENT", "postgresql": "id BIGSERIAL NOT NULL",
                "sqlite": "id INTEGER NOT NULL"}[dialect.name]
    assert set(db.GROWING_TABLES) >= {"gpu_samples", "process_samples", "job_gpu_samples", "job_gpu_rollups",
                                      "node_publications", "actions"}
    for name in db.GROWING_TABLES:
        ddl = str(CreateTable(db.Base.metadata.tables[name]).compile(dialect=dialect))
        assert ddl.splitlines()[2].strip().rstrip(",") == expected, ddl


# 2^31: one more than INT AUTO_INCREMENT and SERIAL can give.
_BEYOND_INT = 2**31


def test_a_version_3_database_gets_64_bit_ids_keeping_its_rows_and_ids(db_url: str) -> None:
    _create_version(db_url, 3)
    engine = create_engine(db_url)
    with engine.begin() as connection:  # rows with a gap in their ids, as deletes leave
        for ts, row_id in ((1.0, None), (2.0, None), (3.0, 700)):
            connection.execute(insert(GpuSample).values(ts=ts, node="a100-01", gpu_index=0, lost=False,
                                                        **({} if row_id is None else {"id": row_id})))
        connection.execute(text(
            "INSERT INTO actions (observation_key, ts_intent, job_id, verdict, action, step, dry_run, state, detail) "
            "VALUES ('41/r0/idle/0:notify', 2000.0, '41', 'idle', 'notify', 0, FALSE, 'intent', '{}')"))
    engine.dispose()
    factory = open_database(db_url)
    with transaction(factory) as session:
        assert session.scalar(select(SchemaVersion.version)) == SCHEMA_VERSION
        assert [tuple(r) for r in session.execute(select(GpuSample.id, GpuSample.ts).order_by(GpuSample.id))] == [
            (1, 1.0), (2, 2.0), (700, 3.0)]
        assert session.scalar(select(db.ActionRecord.id)) == 1
        # Past 2^31 - 1, given and then counted on by the server (SQLite: past its largest rowid).
        session.add(GpuSample(id=_BEYOND_INT + 5, ts=4.0, node="a100-01", gpu_index=0))
        session.add(db.ActionRecord(id=_BEYOND_INT + 5, observation_key="k", ts_intent=1.0, job_id="41",
                                    verdict="idle", action="notify"))
    _advance_sequence(factory, "gpu_samples", _BEYOND_INT + 5)
    with transaction(factory) as session:
        session.add(GpuSample(ts=5.0, node="a100-01", gpu_index=0))
    with transaction(factory) as session:
        assert session.scalar(select(GpuSample.id).where(GpuSample.ts == 5.0)) == _BEYOND_INT + 6
    assert db.ACTIONS_STATE_INDEX in _index_names(db_url, "actions")
    if not db_url.startswith("sqlite"):
        assert _id_types(db_url) == dict.fromkeys(db.GROWING_TABLES, "BIGINT")


def test_a_version_4_database_gets_the_leases_table_keeping_its_rows(db_url: str) -> None:
    _create_version(db_url, 4)
    engine = create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO actions (observation_key, ts_intent, job_id, verdict, action, step, dry_run, state, detail) "
            "VALUES ('41/r0/idle/0:notify', 2000.0, '41', 'idle', 'notify', 0, FALSE, 'intent', '{}')"))
        assert not inspect(connection).has_table("leases")
    engine.dispose()
    factory = open_database(db_url)
    with transaction(factory) as session:
        assert session.scalar(select(SchemaVersion.version)) == SCHEMA_VERSION == 5
        assert session.scalar(select(db.ActionRecord.observation_key)) == "41/r0/idle/0:notify"
    assert Leases(factory, 60.0, name="after-upgrade").hold(RECLAIM)


def _id_types(url: str) -> dict[str, str]:
    engine = create_engine(url)
    try:
        return {name: next(str(c["type"]) for c in inspect(engine).get_columns(name) if c["name"] == "id")
                for name in db.GROWING_TABLES}
    finally:
        engine.dispose()


def _advance_sequence(factory: Any, table: str, value: int) -> None:
    """PostgreSQL: move the id sequence past explicitly given ids (MariaDB and SQLite do it themselves)."""
    with transaction(factory) as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {value})"))


def _index_names(url: str, table: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {index["name"] for index in inspect(engine).get_indexes(table)}
    finally:
        engine.dispose()


def test_the_state_index_serves_open_intents(db_url: str) -> None:
    # Every live tick asks for the open intents; without the index it read the whole audit trail.
    factory = open_database(db_url)
    with transaction(factory) as session:
        session.add_all(db.ActionRecord(observation_key=f"{n}/r0", ts_intent=float(n), job_id=str(n), verdict="idle",
                                        action="notify", state="done" if n % 50 else "intent") for n in range(2000))
    engine = factory.kw["bind"]
    [(statement, parameters)] = sent(engine, lambda statement: "FROM actions" in statement and "state" in statement,
                                     lambda: ReclaimStore(factory).open_intents())
    assert plan(engine, statement, parameters, "actions").indexes == {db.ACTIONS_STATE_INDEX}


def test_the_publishers_mean_per_node_reads_only_the_covering_index(tmp_path: Path) -> None:
    # SQLite's planner says so in words (with the node index of version 2 it scanned the whole table).
    factory = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    engine = factory.kw["bind"]
    seen: list[tuple[str, Any]] = []

    def record(_conn: object, _cursor: object, statement: str, parameters: Any, _context: object, _many: bool) -> None:
        if "avg(" in statement:
            seen.append((statement, parameters))
    event.listen(engine, "before_cursor_execute", record)
    assert TelemetryStore(factory).mean_util_by_node(0.0) == {}
    [(statement, parameters)] = seen
    with engine.connect() as connection:
        details = [row[-1] for row in connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)]
    assert any(f"COVERING INDEX {db.GPU_SAMPLES_COVERING_INDEX}" in d for d in details), details


# ---------------------------------------------------------------- timeouts

def test_connect_args_bound_connecting_and_each_read_or_statement() -> None:
    assert db.connect_args("mysql+pymysql://u:p@h/d", 60) == {"connect_timeout": 10, "read_timeout": 60,
                                                              "write_timeout": 60}
    assert db.connect_args("mariadb+pymysql://u:p@h/d", None) == {"connect_timeout": 10}
    pg = db.connect_args("postgresql+psycopg://u:p@h/d", 60)
    assert pg == {"connect_timeout": 10, "options": "-c statement_timeout=60000", "keepalives": 1,
                  "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3,
                  "prepare_threshold": None}
    assert "options" not in db.connect_args("postgresql+psycopg://u:p@h/d", None)
    assert db.connect_args("sqlite:////tmp/x.db", 60) == {"timeout": 30}


def test_connect_args_keep_what_the_url_sets() -> None:
    # SQLAlchemy lets connect_args override the URL's query: a site's search_path in `options`
    # was dropped for our statement_timeout, and the daemons created their tables in `public`.
    pg = db.connect_args("postgresql+psycopg://u:p@h/d?options=-csearch_path%3Daigc&connect_timeout=30", 60)
    assert pg["options"] == "-c statement_timeout=60000 -csearch_path=aigc"
    assert "connect_timeout" not in pg and pg["keepalives"] == 1
    assert db.connect_args("postgresql+psycopg://u:p@h/d?options=-csearch_path%3Daigc", None) == {
        "connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
        "keepalives_count": 3, "prepare_threshold": None}
    assert db.connect_args("mysql+pymysql://u:p@h/d?read_timeout=900", 60) == {"connect_timeout": 10,
                                                                                "write_timeout": 60}


@pytest.mark.parametrize("url", ["mysql+pymysql://u:p@h/d", "postgresql+psycopg://u:p@h/d"])
def test_the_engine_is_handed_the_default_timeouts(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[dict[str, Any]] = []
    engine = db.create_engine("sqlite://")  # a real one, for the listeners the dialect adds

    def fake_create_engine(_url: object, **kwargs: Any) -> Engine:
        handed.append(kwargs)
        return engine
    monkeypatch.setattr(db, "create_engine", fake_create_engine)
    assert db._engine(url, db.DB_TIMEOUT_S) is engine
    [kwargs] = handed
    assert kwargs["connect_args"] == db.connect_args(url, 60) and db.DB_TIMEOUT_S == 60


def _server_only(url: str) -> None:
    if url.startswith("sqlite"):
        pytest.skip("SQLite has no server to wait for")


def test_a_statement_longer_than_the_timeout_raises_instead_of_hanging(db_url: str) -> None:
    _server_only(db_url)
    factory = open_database(db_url, timeout_s=1)
    sleep = "SELECT pg_sleep(4)" if db_url.startswith("postgresql") else "SELECT SLEEP(4)"
    started = time.monotonic()
    with pytest.raises(DatabaseError, match="timed out|statement timeout"):
        with transaction(factory) as session:
            session.execute(text(sleep))
    assert time.monotonic() - started < 3.5
    with transaction(factory) as session:  # the next session works (a timed-out connection is replaced)
        assert session.scalar(text("SELECT 1")) == 1


def test_a_migration_outlasts_the_timeout(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Migrations rebuild big tables: cut off by the sessions' timeout they would fail half-way at every start.
    _server_only(db_url)
    open_database(db_url)
    engine = create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE schema_version SET version = :v"), {"v": SCHEMA_VERSION - 1})
    engine.dispose()
    sleep = "SELECT pg_sleep(2)" if db_url.startswith("postgresql") else "SELECT SLEEP(2)"
    *older, (target, step) = db.MIGRATIONS

    def slow_step(connection: Any) -> None:
        connection.execute(text(sleep))
        step(connection)
    monkeypatch.setattr(db, "MIGRATIONS", (*older, (target, slow_step)))
    factory = open_database(db_url, timeout_s=1)
    with transaction(factory) as session:
        assert session.scalar(select(SchemaVersion.version)) == SCHEMA_VERSION


def test_the_schema_lock_wait_is_bounded_on_both_servers(db_url: str) -> None:
    # pg_advisory_lock waited forever while GET_LOCK gave up after its timeout.
    _server_only(db_url)
    open_database(db_url)
    holder, waiter = create_engine(db_url), create_engine(db_url)
    take = "SELECT pg_advisory_lock(7161723)" if db_url.startswith("postgresql") else \
        "SELECT GET_LOCK('slurm_aigc_schema', 0)"
    try:
        with holder.connect() as held:
            held.execute(text(take))
            started = time.monotonic()
            with pytest.raises(DatabaseError, match="timed out after 2 s waiting for the schema lock"):
                with db._schema_lock(waiter, 2):
                    pass
            assert 1.9 < time.monotonic() - started < 5.0
    finally:
        holder.dispose()
        waiter.dispose()


# ---------------------------------------------------------------- credentials

def test_credentials_file_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "db.url"
    path.write_text("# the controller's\nmysql+pymysql://aigc:s3cret@db1/slurm_aigc\n")
    path.chmod(0o644)
    with pytest.raises(DatabaseError, match=r"mode 0644; it must be 0600 or 0400 \(chmod 600 "):
        read_url_file(path)
    path.chmod(0o400)
    assert read_url_file(path) == "mysql+pymysql://aigc:s3cret@db1/slurm_aigc"


def test_credentials_file_owned_by_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.url"
    db.write_url_file(path, "mysql+pymysql://aigc:s3cret@db1/slurm_aigc")
    monkeypatch.setattr(os, "geteuid", lambda: path.stat().st_uid + 4242)
    with pytest.raises(DatabaseError, match="not by the daemon user"):
        read_url_file(path)


def test_credentials_file_holds_one_url(tmp_path: Path) -> None:
    path = tmp_path / "db.url"
    db.write_url_file(path, "s3cret")
    with pytest.raises(DatabaseError, match="exactly one SQLAlchemy URL") as caught:
        read_url_file(path)
    assert "s3cret" not in str(caught.value)


def test_default_url_reads_the_environment_then_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.url"
    db.write_url_file(path, "sqlite:////tmp/from-file.db")
    monkeypatch.setenv("SLURM_AIGC_DB_URL_FILE", str(path))
    monkeypatch.delenv("SLURM_AIGC_DB_URL", raising=False)
    assert db.default_url() == "sqlite:////tmp/from-file.db"
    assert db.resolve_url(str(path)) == "sqlite:////tmp/from-file.db"
    monkeypatch.setenv("SLURM_AIGC_DB_URL", "sqlite:////tmp/from-env.db")
    assert db.default_url() == "sqlite:////tmp/from-env.db"


def test_mask_url_hides_the_password() -> None:
    assert mask_url("mysql+pymysql://aigc:s3cret@db1:3306/slurm_aigc") == "mysql+pymysql://aigc:***@db1:3306/slurm_aigc"
    assert db.scrub("login s3cret failed (s3%2Fx)", "mysql+pymysql://a:s3cret@h/d") == "login *** failed (s3%2Fx)"


def test_wrong_password_error_and_logs_never_show_it(mariadb: object, caplog: pytest.LogCaptureFixture) -> None:
    url = read_url_file(Path("/var/lib/slurm-aigc/cluster/etc/db/controller.url"))
    wrong = url.replace("aigc_controller:", "aigc_controller:Wr0ngPassw0rd", 1)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DatabaseError) as caught:
        open_database(wrong, NO_WAIT)
    message = str(caught.value)
    assert "Access denied" in message and "aigc_controller:***@" in message
    assert "Wr0ngPassw0rd" not in message and "Wr0ngPassw0rd" not in caplog.text


def test_unreachable_server_is_retried_then_reported_masked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    delays: list[float] = []
    retry = StartupRetry(attempts=3, first_delay_s=0.1, sleep=delays.append)
    with pytest.raises(DatabaseError, match=r"cannot open database mysql\+pymysql://u:\*\*\*@127.0.0.1:1/x") as caught:
        open_database("mysql+pymysql://u:Sup3rS3cret@127.0.0.1:1/x", retry)
    assert len(delays) == 2 and 0.05 <= delays[0] <= 0.15 and 0.1 <= delays[1] <= 0.3  # jittered, growing
    assert "Sup3rS3cret" not in str(caught.value) and "Sup3rS3cret" not in caplog.text
