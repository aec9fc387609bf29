"""The database boundary: the only module that defines tables and opens engines.

SQLite file for a single host; on a cluster of many hosts a MariaDB/MySQL or PostgreSQL
server by SQLAlchemy URL (drivers: the `[mysql]` and `[postgresql]` extras). The URL comes
from `--db`, `$SLURM_AIGC_DB_URL`, a credentials file (`$SLURM_AIGC_DB_URL_FILE`, else
/etc/slurm-aigc/db.url) that must be private to the daemon user, else the SQLite default.
`open_database` creates the schema and applies the ordered migrations under a lock that
every daemon starting at the same moment takes in turn (recorded in `schema_version`), so
an upgrade of slurm-aigc needs no manual step and keeps existing rows. Passwords never
appear in messages: `mask_url`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from slurm_aigc.errors import DatabaseError

DEFAULT_DB_URL = "sqlite:////var/lib/slurm-aigc/state.db"
DEFAULT_URL_FILE = Path("/etc/slurm-aigc/db.url")
SCHEMA_VERSION = 5
LOG = logging.getLogger(__name__)

# The id of every table that grows. INT AUTO_INCREMENT (MariaDB/MySQL) and SERIAL (PostgreSQL)
# stop at 2,147,483,647, and ids are never reused after deletes: at 1,000 nodes one sample table
# takes ~69 million ids a day (docs/deploy.md), so inserts would fail after about a month. SQLite
# keeps INTEGER: only a column declared exactly so is the rowid, which is 64-bit already.
BigId = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "schema_version"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


GPU_SAMPLES_COVERING_INDEX = "ix_gpu_samples_ts_node_lost_sm"
_GPU_SAMPLES_COVERING = Index(GPU_SAMPLES_COVERING_INDEX, "ts", "node", "lost", "sm_util_pct")  # bound by GpuSample


class GpuSample(Base):
    """One GPU's reading at one poll (`nvidia-smi --query-gpu=...`); null = not available."""

    __tablename__ = "gpu_samples"
    # One index (schema version 3): the publisher's mean SM per node over its window, every
    # cycle, reads only the index, never the rows; its ts prefix serves every other read (all are
    # ts ranges). The ts-only and node-only indexes it replaced cost every agent insert, and
    # SQLite's planner took the node one for the GROUP BY, scanning the whole table.
    __table_args__ = (_GPU_SAMPLES_COVERING,)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Double)
    node: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lost: Mapped[bool] = mapped_column(Boolean, default=False)
    memory_total_mib: Mapped[float | None] = mapped_column(Double, nullable=True)
    memory_used_mib: Mapped[float | None] = mapped_column(Double, nullable=True)
    sm_util_pct: Mapped[float | None] = mapped_column(Double, nullable=True)
    mem_bw_util_pct: Mapped[float | None] = mapped_column(Double, nullable=True)
    power_draw_w: Mapped[float | None] = mapped_column(Double, nullable=True)
    power_limit_w: Mapped[float | None] = mapped_column(Double, nullable=True)
    temperature_c: Mapped[float | None] = mapped_column(Double, nullable=True)


class ProcessSample(Base):
    """One compute process on one GPU at one poll, attributed to a Slurm job when possible."""

    __tablename__ = "process_samples"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Double, index=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    gpu_index: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    used_memory_mib: Mapped[float | None] = mapped_column(Double, nullable=True)
    sm_util_pct: Mapped[float | None] = mapped_column(Double, nullable=True)


class JobGpuSample(Base):
    """A job's use of one GPU at one poll: what reports and the idle detectors read."""

    __tablename__ = "job_gpu_samples"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Double, index=True)
    node: Mapped[str] = mapped_column(String(128))
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    gpu_index: Mapped[int] = mapped_column(Integer)
    sm_util_pct: Mapped[float | None] = mapped_column(Double, nullable=True)
    memory_used_mib: Mapped[float | None] = mapped_column(Double, nullable=True)
    memory_total_mib: Mapped[float | None] = mapped_column(Double, nullable=True)
    power_draw_w: Mapped[float | None] = mapped_column(Double, nullable=True)
    power_limit_w: Mapped[float | None] = mapped_column(Double, nullable=True)
    shared: Mapped[bool] = mapped_column(Boolean, default=False)


class NodePublication(Base):
    """A feature/weight change the publisher made to a node (`scontrol update NodeName=...`)."""

    __tablename__ = "node_publications"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Double, index=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    features_before: Mapped[str | None] = mapped_column(Text, nullable=True)
    features_after: Mapped[str | None] = mapped_column(Text, nullable=True)
    weight_before: Mapped[int | None] = mapped_column(Integer, nullable=True)
    weight_after: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)


class ActionRecord(Base):
    """The audit trail: an action recorded as an intent before it runs, then its outcome.

    `observation_key` is unique: the same observation (job, verdict, window end) can only
    ever produce one action, across restarts.
    """

    __tablename__ = "actions"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    observation_key: Mapped[str] = mapped_column(String(255), unique=True)
    ts_intent: Mapped[float] = mapped_column(Double, index=True)
    ts_outcome: Mapped[float | None] = mapped_column(Double, nullable=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    user: Mapped[str | None] = mapped_column(String(64), nullable=True)
    account: Mapped[str | None] = mapped_column(String(64), nullable=True)
    job_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    verdict: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(32))
    step: Mapped[int] = mapped_column(Integer, default=0)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    # intent|done|failed|skipped; indexed (version 4): open_intents() reads the few intents every
    # live tick, which without it scanned the whole audit trail.
    state: Mapped[str] = mapped_column(String(16), default="intent", index=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    gpus_before: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpus_after: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_hours_recovered: Mapped[float | None] = mapped_column(Double, nullable=True)


class JobGpuRollup(Base):
    """One job's use of one GPU over one hour, kept after its raw samples are deleted (`retention`).

    `used_gpu_s` and `known_s` are sums over the hour's sample slices (see
    `report.records.slices`), so reports over rolled-up hours give the same totals as the raw rows.
    """

    __tablename__ = "job_gpu_rollups"
    __table_args__ = (UniqueConstraint("bucket_ts", "job_id", "node", "gpu_index"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    bucket_ts: Mapped[float] = mapped_column(Double, index=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    node: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[int] = mapped_column(Integer)
    first_ts: Mapped[float] = mapped_column(Double)
    samples: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float] = mapped_column(Double)
    known_s: Mapped[float] = mapped_column(Double)
    used_gpu_s: Mapped[float] = mapped_column(Double)
    memory_used_mib_max: Mapped[float | None] = mapped_column(Double, nullable=True)
    memory_total_mib: Mapped[float | None] = mapped_column(Double, nullable=True)


class RetentionState(Base):
    """How far raw samples are rolled up: rows older than `rolled_until` may be deleted."""

    __tablename__ = "retention_state"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rolled_until: Mapped[float] = mapped_column(Double)


class Lease(Base):
    """Which controller process runs one part (reclaim, publisher, learner) of the controller
    (schema version 5; slurm_aigc/lease.py).

    Several controllers may run against one database, on several hosts (a standby): the one
    holding a part's lease runs it, the others wait. `expires_at` is on the database server's
    clock, so hosts whose clocks disagree still agree on it.
    """

    __tablename__ = "leases"
    part: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    acquired_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)


# The tables an agent writes (and all it may write): see `AGENT_GRANTS` and docs/deploy.md.
SAMPLE_TABLES = ("gpu_samples", "process_samples", "job_gpu_samples")
# The tables whose ids are `BigId` (schema version 4).
GROWING_TABLES = (*SAMPLE_TABLES, "job_gpu_rollups", "node_publications", "actions")
ACTIONS_STATE_INDEX = "ix_actions_state"


# ---------------------------------------------------------------- credentials

def default_url() -> str:
    """`$SLURM_AIGC_DB_URL`, else the credentials file ($SLURM_AIGC_DB_URL_FILE or
    /etc/slurm-aigc/db.url when present), else the SQLite file under /var/lib/slurm-aigc."""
    if os.environ.get("SLURM_AIGC_DB_URL"):
        return os.environ["SLURM_AIGC_DB_URL"]
    named = os.environ.get("SLURM_AIGC_DB_URL_FILE")
    if named:
        return read_url_file(Path(named))
    if DEFAULT_URL_FILE.exists():
        return read_url_file(DEFAULT_URL_FILE)
    return DEFAULT_DB_URL


def resolve_url(value: str | None) -> str:
    """What `--db` means: a URL (contains `://`), a credentials file's path, or None for the default."""
    if not value:
        return default_url()
    if "://" in value:
        return value
    return read_url_file(Path(value))


def read_url_file(path: Path) -> str:
    """The URL in a credentials file: one line (`#` comments allowed), private to its reader.

    The file must be mode 0600 or 0400 and owned by the user reading it (or read by root):
    the agent's URL sits on every compute node, where users log in.
    """
    try:
        info = path.stat()
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise DatabaseError(f"cannot read database credentials file {path}: {error.strerror}") from error
    if info.st_mode & 0o077:
        raise DatabaseError(f"database credentials file {path} is mode {info.st_mode & 0o777:04o}; "
                            f"it must be 0600 or 0400 (chmod 600 {path})")
    if os.geteuid() not in (0, info.st_uid):
        raise DatabaseError(f"database credentials file {path} is owned by uid {info.st_uid}, "
                            f"not by the daemon user (uid {os.geteuid()}): chown it")
    urls = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if len(urls) != 1 or "://" not in urls[0]:
        raise DatabaseError(f"database credentials file {path} must hold exactly one SQLAlchemy URL "
                            "(e.g. mysql+pymysql://USER:PASSWORD@HOST/slurm_aigc)")
    return urls[0]


def write_url_file(path: Path, url: str) -> None:
    """Write a credentials file readable only by its owner (created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(url + "\n")
    path.chmod(0o600)


def mask_url(url: str) -> str:
    """The URL with its password replaced by `***` (for logs and messages)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable database URL>"


def scrub(message: str, url: str) -> str:
    """`message` with the URL's password (plain or URL-quoted) replaced by `***`."""
    try:
        password = make_url(url).password
    except ArgumentError:
        return message
    if password:
        from urllib.parse import quote_plus
        for form in {str(password), quote_plus(str(password))}:
            message = message.replace(form, "***")
    return message


# ---------------------------------------------------------------- opening

# Seconds to reach the server; then the longest a MariaDB/MySQL read or write, or a PostgreSQL
# statement, may take (`open_database(timeout_s=...)`). Without them a server that hangs, or a
# host that dies mid-query, holds an agent's poll or the controller's tick until TCP gives up
# (15 min to 2 h). 60 s is far above any statement of ours (an agent's poll writes in ms).
CONNECT_TIMEOUT_S = 10
DB_TIMEOUT_S = 60
# Whole-window readers and writers (reports, replays, retention's hourly rollup): one sorted
# read of a month of samples, or one hour's rollup at 8,000 GPUs (~80 s measured), outlasts 60 s.
DB_LONG_TIMEOUT_S = 600


@dataclass(frozen=True)
class StartupRetry:
    """Retries of schema creation while other daemons hold the lock or the server starts."""

    attempts: int = 12
    first_delay_s: float = 0.1
    max_delay_s: float = 5.0
    lock_timeout_s: int = 120
    sleep: Callable[[float], None] = time.sleep

    def delay_s(self, attempt: int) -> float:
        # Jittered exponential backoff: daemons that failed together do not retry together.
        return float(min(self.max_delay_s, self.first_delay_s * 2 ** attempt) * random.uniform(0.5, 1.5))


def open_database(url: str | None = None, retry: StartupRetry = StartupRetry(), *,
                  timeout_s: int | None = DB_TIMEOUT_S, create: bool = True) -> sessionmaker[Session]:
    """Open (and create/migrate) the database at `url` (see `resolve_url`); DatabaseError names the masked URL.

    `timeout_s` bounds each read/write (MariaDB/MySQL) or statement (PostgreSQL) of the sessions;
    None: unbounded. Schema creation and migrations are never bounded by it (`ensure_schema`).
    `create=False` (read-only commands: `audit`, `idle`, `report`): a SQLite file that does not
    exist is a DatabaseError and nothing is created, not its folder either (a server database
    that does not exist already fails to connect).
    """
    url = resolve_url(url)
    try:
        engine = _engine(url, timeout_s, create)
    except ImportError as error:
        raise DatabaseError(f"cannot open database {mask_url(url)}: its driver is not installed ({error}); "
                            "install slurm-aigc[mysql] or slurm-aigc[postgresql]") from error
    except ArgumentError as error:
        raise DatabaseError(f"cannot open database {mask_url(url)}: {scrub(str(error), url)}") from error
    for attempt in range(retry.attempts):
        try:
            ensure_schema(engine, retry.lock_timeout_s)
            break
        except DBAPIError as error:
            if _permission_denied(error):
                raise DatabaseError(f"database {mask_url(url)}: this role may not create or upgrade the schema "
                                    f"(start the controller, or run `slurm-aigc doctor`): {_short(error, url)}") from error
            if _code(error) in _FATAL_CODES or attempt == retry.attempts - 1:
                raise DatabaseError(f"cannot open database {mask_url(url)}: {_short(error, url)}") from error
            LOG.info("database %s not ready (%s); retrying", mask_url(url), _short(error, url))
            retry.sleep(retry.delay_s(attempt))
        except SQLAlchemyError as error:
            raise DatabaseError(f"cannot open database {mask_url(url)}: {_short(error, url)}") from error
    return sessionmaker(engine, expire_on_commit=False)


def schema_version(engine: Engine) -> int | None:
    """The version recorded in the database; None when there is no schema yet (read-only)."""
    with engine.connect() as connection:
        if not inspect(connection).has_table(SchemaVersion.__tablename__):
            return None
        value = connection.scalar(select(SchemaVersion.version).where(SchemaVersion.id == 1))
    return None if value is None else int(value)


def ensure_schema(engine: Engine, lock_timeout_s: int = 120) -> None:
    """Create the tables and apply migrations once, whoever else starts at the same moment.

    The common case (schema current) only reads one row, so an agent needs no DDL right.
    The DDL runs on a connection without the read/statement timeout: a migration that rebuilds
    a table of millions of rows must not be cut off half-way, then retried at every start.
    """
    current = schema_version(engine)
    if current == SCHEMA_VERSION:
        return
    if current is not None and current > SCHEMA_VERSION:
        raise DatabaseError(f"database schema is version {current}, newer than this slurm-aigc "
                            f"(version {SCHEMA_VERSION}): upgrade slurm-aigc")
    with _unbounded(engine) as ddl, _schema_lock(ddl, lock_timeout_s):
        _create_and_migrate(ddl)


@contextmanager
def _unbounded(engine: Engine) -> Iterator[Engine]:
    """The same database through an engine without read/statement timeouts (SQLite: the engine itself)."""
    if engine.dialect.name == "sqlite":
        yield engine
        return
    ddl = _engine(engine.url, None)
    try:
        yield ddl
    finally:
        ddl.dispose()


def _create_and_migrate(engine: Engine) -> None:
    existing = schema_version(engine)  # again: another daemon may have finished while we waited
    if existing == SCHEMA_VERSION:
        return
    if existing is None and inspect(engine).has_table(GpuSample.__tablename__):
        existing = 1  # a version-1 database whose version row was lost in the old start-up race
    Base.metadata.create_all(engine)  # CREATE TABLE only for missing tables
    version = existing if existing is not None else SCHEMA_VERSION
    for target, step in MIGRATIONS:
        if version < target:
            with engine.begin() as connection:
                if connection.dialect.name == "postgresql":
                    # A role may carry a statement_timeout of its own (docs/deploy.md, PgBouncer).
                    connection.execute(text("SET LOCAL statement_timeout = 0"))
                step(connection)
            version = target
            _set_version(engine, version)
            LOG.info("database migrated to schema version %d", version)
    _set_version(engine, version)


def _set_version(engine: Engine, version: int) -> None:
    with engine.begin() as connection:
        updated = connection.execute(update(SchemaVersion).where(SchemaVersion.id == 1).values(version=version))
        if updated.rowcount == 0:
            try:
                with connection.begin_nested():
                    connection.execute(insert(SchemaVersion).values(id=1, version=version))
            except IntegrityError:
                pass  # inserted by a daemon that took no lock (an older slurm-aigc)


@contextmanager
def _schema_lock(engine: Engine, timeout_s: int) -> Iterator[None]:
    """A lock across processes and hosts: GET_LOCK (MariaDB/MySQL), an advisory lock
    (PostgreSQL), flock on a file next to the SQLite database. A server lock not had within
    `timeout_s` raises DatabaseError, on either server."""
    dialect = engine.dialect.name
    if dialect == "sqlite":
        with _file_lock(engine):
            yield
        return
    mysql = dialect in ("mysql", "mariadb")
    with engine.connect() as connection:
        _wait_for_lock(connection, mysql, timeout_s)
        try:
            yield
        finally:
            release = "SELECT RELEASE_LOCK('slurm_aigc_schema')" if mysql else "SELECT pg_advisory_unlock(7161723)"
            connection.execute(text(release))
            connection.commit()


# Each try waits at most this long: GET_LOCK on the server, pg_try_advisory_lock between tries.
_LOCK_STEP_S = 1


def _wait_for_lock(connection: Connection, mysql: bool, timeout_s: int) -> None:
    """Take the schema lock in short tries until `timeout_s` (pg_advisory_lock alone would wait
    forever; one long GET_LOCK would outlast the read timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if mysql:
            got = connection.scalar(text("SELECT GET_LOCK('slurm_aigc_schema', :t)"), {"t": _LOCK_STEP_S}) == 1
        else:
            got = bool(connection.scalar(text("SELECT pg_try_advisory_lock(7161723)")))
        if got:
            connection.commit()  # both locks belong to the session, not to this transaction
            return
        if time.monotonic() >= deadline:
            what = "GET_LOCK" if mysql else "pg_try_advisory_lock"
            raise DatabaseError(f"timed out after {timeout_s} s waiting for the schema lock ({what})")
        if not mysql:
            time.sleep(_LOCK_STEP_S)


@contextmanager
def _file_lock(engine: Engine) -> Iterator[None]:
    database = sqlite_path(engine.url)
    if database is None:
        yield
        return
    with open(f"{database}.schema-lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---------------------------------------------------------------- migrations

def _v2_double_precision(connection: Connection) -> None:
    """Version 2: floats in double precision (MySQL's FLOAT is single: a Unix time lost ~2 minutes);
    new tables (rollups, retention state) come from create_all."""
    if connection.dialect.name not in ("mysql", "mariadb"):
        return  # SQLite REAL and PostgreSQL FLOAT are already double precision
    for table in Base.metadata.sorted_tables:
        if table.name in ("job_gpu_rollups", "retention_state"):
            continue
        for column in table.columns:
            if isinstance(column.type, Double):
                null = "NULL" if column.nullable else "NOT NULL"
                connection.execute(text(f"ALTER TABLE {table.name} MODIFY {column.name} DOUBLE {null}"))


def _v3_gpu_samples_covering_index(connection: Connection) -> None:
    """Version 3: the covering index on gpu_samples (see GpuSample) replaces the ts and node ones.

    MariaDB builds it online while the agents insert; PostgreSQL (plain CREATE INDEX, as this
    runs in a transaction) and SQLite hold inserts for the build (0.3-0.5 s for 456,000 samples
    on SQLite and MariaDB, benchmarks/bench_publisher_mean.py).
    """
    present = {index["name"] for index in inspect(connection).get_indexes(GpuSample.__tablename__)}
    if GPU_SAMPLES_COVERING_INDEX not in present:
        _GPU_SAMPLES_COVERING.create(connection)
    for old in ("ix_gpu_samples_ts", "ix_gpu_samples_node"):
        if old in present:
            drop_index(connection, GpuSample.__tablename__, old)


def _v4_64_bit_ids_and_action_state_index(connection: Connection) -> None:
    """Version 4: 64-bit ids on the tables that grow (see `BigId`), keeping every row and id,
    and the index on actions.state that `open_intents()` reads.

    Both servers rebuild each table to widen its key, holding the agents' inserts meanwhile
    (docs/deploy.md, "Units", gives the measured rate). MariaDB commits each ALTER on its own, so
    a table already widened by an interrupted run is skipped.
    """
    for table in GROWING_TABLES:
        _widen_id(connection, table)
    present = {index["name"] for index in inspect(connection).get_indexes(ActionRecord.__tablename__)}
    if ACTIONS_STATE_INDEX not in present:
        actions = Base.metadata.tables[ActionRecord.__tablename__]
        next(i for i in actions.indexes if i.name == ACTIONS_STATE_INDEX).create(connection)


def _widen_id(connection: Connection, table: str) -> None:
    dialect = connection.dialect.name
    if dialect == "sqlite":
        return  # INTEGER PRIMARY KEY is the 64-bit rowid
    column = next(c for c in inspect(connection).get_columns(table) if c["name"] == "id")
    if isinstance(column["type"], BigInteger):
        return
    if dialect in ("mysql", "mariadb"):
        connection.execute(text(f"ALTER TABLE {table} MODIFY id BIGINT NOT NULL AUTO_INCREMENT"))
        return
    sequence = connection.scalar(text("SELECT pg_get_serial_sequence(:table, 'id')"), {"table": table})
    connection.execute(text(f"ALTER TABLE {table} ALTER COLUMN id TYPE bigint"))
    if sequence:
        # A SERIAL's sequence is AS integer: it would still stop at 2^31 - 1. Its maximum was the
        # type's, so PostgreSQL moves it to bigint's.
        connection.execute(text(f"ALTER SEQUENCE {sequence} AS bigint"))


def drop_index(connection: Connection, table: str, name: str) -> None:
    """DROP INDEX in the dialect's words (MariaDB/MySQL name the table, SQLite and PostgreSQL do not)."""
    on_table = f" ON {table}" if connection.dialect.name in ("mysql", "mariadb") else ""
    connection.execute(text(f"DROP INDEX {name}{on_table}"))


def _v5_leases(connection: Connection) -> None:
    """Version 5: the `leases` table (see Lease), so that a standby controller can wait its turn."""
    Base.metadata.tables[Lease.__tablename__].create(connection, checkfirst=True)


# (target version, step) in order; each step runs in one transaction and keeps every row.
MIGRATIONS: Sequence[tuple[int, Callable[[Connection], None]]] = (
    (2, _v2_double_precision),
    (3, _v3_gpu_samples_covering_index),
    (4, _v4_64_bit_ids_and_action_state_index),
    (5, _v5_leases),
)


# ---------------------------------------------------------------- sessions

@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error (as DatabaseError)."""
    session = factory()
    try:
        yield session
        session.commit()
    except SQLAlchemyError as error:
        session.rollback()
        url = session.get_bind().engine.url.render_as_string(hide_password=False)
        raise DatabaseError(f"database error: {_short(error, url)}") from error
    finally:
        session.close()


def dialect_name(factory: sessionmaker[Session]) -> str:
    """`sqlite`, `mysql`/`mariadb` or `postgresql`."""
    with factory() as session:
        return session.get_bind().dialect.name


def connect_args(url: str | URL, timeout_s: int | None) -> dict[str, object]:
    """What the driver of `url` is handed when it connects: the connect timeout, and the read/write
    (PyMySQL and MySQL drivers) or statement timeout (libpq: psycopg) when `timeout_s` is set;
    psycopg 3 prepares no statement on the server (PgBouncer, docs/deploy.md).

    A setting the URL's query gives (`?connect_timeout=30`) is the site's and stays: SQLAlchemy
    lets these arguments override the query, so they leave it out. The URL's libpq `options`
    (`-csearch_path=aigc`) are kept, after our statement_timeout so that theirs wins.
    """
    parsed = make_url(url)
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if backend == "sqlite":
        return {"timeout": 30}  # seconds a writer waits for another's lock
    args: dict[str, object] = {}
    if backend in ("mysql", "mariadb"):
        bounded = {} if timeout_s is None else {"read_timeout": timeout_s, "write_timeout": timeout_s}
        args = {"connect_timeout": CONNECT_TIMEOUT_S, **bounded}
    elif backend == "postgresql" and driver in ("psycopg", "psycopg2"):
        # statement_timeout is enforced by the server; the keepalives find a host or link that
        # died while we wait for an answer (after 30 s idle, 3 probes 10 s apart).
        args = {"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 30,
                "keepalives_interval": 10, "keepalives_count": 3}
        if timeout_s is not None:
            given = parsed.query.get("options")
            theirs = " ".join([given] if isinstance(given, str) else list(given or ()))
            args["options"] = f"-c statement_timeout={timeout_s * 1000} {theirs}".strip()
        if driver == "psycopg":
            # No server-side prepared statements: psycopg 3 prepares every executemany (an agent's first
            # poll), and PgBouncer in transaction mode runs the next transaction on another server
            # connection, where "_pg3_N" does not exist (PgBouncer < 1.21, or max_prepared_statements = 0).
            # The cost, 0.4 ms of server CPU per 8-GPU poll: docs/deploy.md, "Connections".
            args["prepare_threshold"] = None
    return {key: value for key, value in args.items() if key == "options" or key not in parsed.query}


def _engine(url: str | URL, timeout_s: int | None, create: bool = True) -> Engine:
    parsed = make_url(url)
    args = connect_args(parsed, timeout_s)
    if parsed.get_backend_name() == "sqlite":
        _sqlite_file(parsed, create)
        engine = create_engine(parsed, connect_args=args)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        # READ COMMITTED: retention's batched deletes take no gap locks that block the agents' inserts.
        return create_engine(parsed, connect_args=args, pool_pre_ping=True, pool_recycle=3600,
                             isolation_level="READ COMMITTED")
    engine = create_engine(parsed, connect_args=args, pool_pre_ping=True)
    event.listen(engine, "begin", _exact_floats)
    return engine


def sqlite_path(url: str | URL) -> str | None:
    """The file a SQLite URL names, a `file:` URI's too (`sqlite:///file:/var/x.db?mode=ro&uri=true`);
    None for a server, an in-memory database or a URL that does not parse (opening it says why)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    path = parsed.database or ""
    if parsed.query.get("uri"):
        path = path.removeprefix("file:")
    if parsed.get_backend_name() != "sqlite" or path in ("", ":memory:"):
        return None
    return path


def _sqlite_file(url: URL, create: bool) -> None:
    """The SQLite file's folder, made when `create`; else DatabaseError when the file is missing."""
    path = sqlite_path(url)
    if path is None or url.query.get("uri"):  # a `file:` URI: SQLite's own modes (mode=ro, rwc) decide
        return
    if create:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    elif not Path(path).exists():
        raise DatabaseError(f"{mask_url(url.render_as_string(hide_password=False))}: no such database file; "
                            "check --db or $SLURM_AIGC_DB_URL (nothing was created)")


def _exact_floats(connection: Connection) -> None:
    # PostgreSQL prints a float8 to 15 significant digits where extra_float_digits is 0 (a site's
    # or a role's setting; 1, exact, is the default since 12): a sample's ts, 1.7e9 s to the
    # microsecond, came back rounded, and retention, paging an hour by the last ts it read,
    # skipped rows. SET LOCAL, in every transaction: under PgBouncer's transaction pooling a
    # session's SET would stay on one server connection, and our next transaction runs on another.
    connection.exec_driver_sql("SET LOCAL extra_float_digits = 3")


def _sqlite_pragmas(connection: object, _record: object) -> None:
    # WAL lets the agents write samples while the controller and reports read.
    cursor = connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")  # NORMAL can lose a recorded intent on power loss
    cursor.close()


# MySQL: 1044 access denied to database, 1142 command denied on table, 1227 need privilege.
# PostgreSQL: 42501 insufficient_privilege.
_DENIED_CODES = {1044, 1142, 1143, 1227}


# MySQL: 1045 wrong user or password, 1049 unknown database: retrying cannot help.
_FATAL_CODES = {1045, 1049}


def _code(error: DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _permission_denied(error: DBAPIError) -> bool:
    original = error.orig
    if _code(error) in _DENIED_CODES:
        return True
    return getattr(original, "sqlstate", None) == "42501" or getattr(original, "pgcode", None) == "42501"


def is_permission_denied(error: BaseException) -> bool:
    """The database refused a statement for lack of a privilege (the role's grants)."""
    cause = error.__cause__ if isinstance(error, DatabaseError) else error
    return isinstance(cause, DBAPIError) and _permission_denied(cause)


def _short(error: SQLAlchemyError, url: str) -> str:
    # The driver's message without SQLAlchemy's SQL echo and background link; password scrubbed.
    original = getattr(error, "orig", None)
    message = str(original) if original is not None else str(error)
    return scrub(message.splitlines()[0] if message else type(error).__name__, url)


# ---------------------------------------------------------------- checks (`slurm-aigc doctor`)

# What a role may do, each probed by a statement that changes no row (WHERE 1 = 0): the
# database checks the privilege all the same.
PRIVILEGE_PROBES: dict[str, str] = {
    "add samples": "INSERT INTO job_gpu_samples (ts, node, job_id, gpu_index, shared) SELECT 0, '', '', 0, FALSE{dual} WHERE 1 = 0",
    "read samples": "SELECT job_id, sm_util_pct FROM job_gpu_samples WHERE 1 = 0",
    "read actions": "SELECT id FROM actions WHERE 1 = 0",  # the audit trail: whose jobs were acted on
    "write actions": "INSERT INTO actions (observation_key, ts_intent, job_id, verdict, action, step, dry_run, state, "
                     "detail) SELECT '', 0, '', '', '', 0, FALSE, '', ''{dual} WHERE 1 = 0",
    "write publications": "INSERT INTO node_publications (ts, node, reason, dry_run) SELECT 0, '', '', FALSE{dual} WHERE 1 = 0",
    "update rows": "UPDATE actions SET state = 'x' WHERE 1 = 0",
    "delete samples": "DELETE FROM job_gpu_samples WHERE 1 = 0",
}


def probe_privileges(factory: sessionmaker[Session]) -> dict[str, bool]:
    """Which of `PRIVILEGE_PROBES` the role may run (SQLite: all of them)."""
    result: dict[str, bool] = {}
    for name, statement in PRIVILEGE_PROBES.items():
        try:
            with transaction(factory) as session:
                dual = " FROM DUAL" if session.get_bind().dialect.name in ("mysql", "mariadb") else ""
                session.execute(text(statement.format(dual=dual)))
                session.rollback()
            result[name] = True
        except DatabaseError as error:
            if not is_permission_denied(error):
                raise
            result[name] = False
    return result


# UTC_TIMESTAMP less the epoch, never UNIX_TIMESTAMP(NOW(6)): that turns the session's local
# time back into seconds, an hour off in a DST fold where the server's zone is a named one.
_MYSQL_NOW = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000"
_SERVER_NOW = {"mysql": _MYSQL_NOW, "mariadb": _MYSQL_NOW, "postgresql": "EXTRACT(EPOCH FROM clock_timestamp())"}
# SQLite has no server: its clock is the host's (one host is all a SQLite file serves).
_SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


def server_now_sql(dialect: str) -> str:
    """An SQL expression for the database's clock as a Unix time (SQLite: the host's)."""
    return _SERVER_NOW.get(dialect, _SQLITE_NOW)


def server_time(factory: sessionmaker[Session]) -> float | None:
    """The database server's clock as a Unix time (None for SQLite, which has no server)."""
    with transaction(factory) as session:
        dialect = session.get_bind().dialect.name
        return float(session.scalar(text(f"SELECT {_SERVER_NOW[dialect]}"))) if dialect in _SERVER_NOW else None


def recreate_database(server_url: str, name: str) -> str:
    """Drop and create the database `name` on the MariaDB/MySQL or PostgreSQL server of
    `server_url` (a role allowed to); returns the URL of the new, empty database. For tests,
    replays and benchmarks."""
    _check_database_name(name)
    create = "CREATE DATABASE {} CHARACTER SET utf8mb4" if _is_mysql(server_url) else "CREATE DATABASE {}"
    try:
        _server_ddl(server_url, _drop_statement(server_url, name), create.format(name))
    except SQLAlchemyError as error:
        raise DatabaseError(f"cannot create database {name} on {mask_url(server_url)}: {_short(error, server_url)}") from error
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, name: str) -> None:
    """Drop the database `name` on the server of `server_url` (the counterpart of `recreate_database`)."""
    _check_database_name(name)
    _server_ddl(server_url, _drop_statement(server_url, name))


@contextmanager
def scratch_database(server_url: str, name: str) -> Iterator[str]:
    """A new, empty database `name` for the `with` block (its URL), dropped afterwards."""
    url = recreate_database(server_url, name)
    try:
        yield url
    finally:
        drop_database(server_url, name)


def _is_mysql(url: str) -> bool:
    return make_url(url).get_backend_name() in ("mysql", "mariadb")


def _drop_statement(server_url: str, name: str) -> str:
    # PostgreSQL refuses to drop a database others are connected to (a test's pooled connections)
    # unless told to end them (FORCE, PostgreSQL 13+).
    return f"DROP DATABASE IF EXISTS {name}" + ("" if _is_mysql(server_url) else " WITH (FORCE)")


def _server_ddl(server_url: str, *statements: str) -> None:
    """Run database-level DDL outside any database: MariaDB/MySQL with none selected;
    PostgreSQL from its `postgres` database and outside a transaction (it refuses
    CREATE/DROP DATABASE in one)."""
    url = make_url(server_url)
    if _is_mysql(server_url):
        engine = create_engine(url._replace(database=None))
    else:
        engine = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


def _check_database_name(name: str) -> None:
    # The name goes into DDL, which takes no bound parameters.
    if not name.replace("_", "").isalnum() or not name.isascii() or len(name) > 64:
        raise DatabaseError(f"database name {name!r}: ASCII letters, digits and _ only, at most 64 characters")
