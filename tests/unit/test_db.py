"""The database boundary on SQLite and MariaDB: start-up races, migrations, credentials, masking."""

from __future__ import annotations

import logging
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, func, inspect, select, text

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
from slurm_aigc.telemetry.store import TelemetryStore

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


# ---------------------------------------------------------------- migrations

def _create_version_1(url: str) -> None:
    dialect = next((name for name in ("sqlite", "postgresql") if url.startswith(name)), "mysql")
    lines = (FIXTURES / f"schema_v1.{dialect}.sql").read_text().splitlines()
    script = "\n".join(line for line in lines if not line.startswith("--"))
    statements = [s.strip() for s in script.split(";") if s.strip()]
    engine = create_engine(url)
    with engine.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))
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
