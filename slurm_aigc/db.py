"""The database boundary: the only module that defines tables and opens engines.

SQLite file by default, a site MariaDB/PostgreSQL by SQLAlchemy URL. `open_database`
creates the schema and applies migrations (recorded in `schema_version`), so an upgrade of
slurm-aigc needs no manual step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    Text,
    create_engine,
    event,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from slurm_aigc.errors import DatabaseError

DEFAULT_DB_URL = "sqlite:////var/lib/slurm-aigc/state.db"
SCHEMA_VERSION = 1


def default_url() -> str:
    """`SLURM_AIGC_DB_URL` when set, else the SQLite file under /var/lib/slurm-aigc."""
    return os.environ.get("SLURM_AIGC_DB_URL", DEFAULT_DB_URL)


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "schema_version"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class GpuSample(Base):
    """One GPU's reading at one poll (`nvidia-smi --query-gpu=...`); null = not available."""

    __tablename__ = "gpu_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    gpu_index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lost: Mapped[bool] = mapped_column(Boolean, default=False)
    memory_total_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    sm_util_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    mem_bw_util_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_draw_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_limit_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    temperature_c: Mapped[float | None] = mapped_column(Float, nullable=True)


class ProcessSample(Base):
    """One compute process on one GPU at one poll, attributed to a Slurm job when possible."""

    __tablename__ = "process_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    gpu_index: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    used_memory_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    sm_util_pct: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobGpuSample(Base):
    """A job's use of one GPU at one poll: what reports and the idle detectors read."""

    __tablename__ = "job_gpu_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    node: Mapped[str] = mapped_column(String(128))
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    gpu_index: Mapped[int] = mapped_column(Integer)
    sm_util_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_total_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_draw_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_limit_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    shared: Mapped[bool] = mapped_column(Boolean, default=False)


class NodePublication(Base):
    """A feature/weight change the publisher made to a node (`scontrol update NodeName=...`)."""

    __tablename__ = "node_publications"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
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
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    observation_key: Mapped[str] = mapped_column(String(255), unique=True)
    ts_intent: Mapped[float] = mapped_column(Float, index=True)
    ts_outcome: Mapped[float | None] = mapped_column(Float, nullable=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    user: Mapped[str | None] = mapped_column(String(64), nullable=True)
    account: Mapped[str | None] = mapped_column(String(64), nullable=True)
    job_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    verdict: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(32))
    step: Mapped[int] = mapped_column(Integer, default=0)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), default="intent")  # intent|done|failed|skipped
    detail: Mapped[str] = mapped_column(Text, default="")
    gpus_before: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpus_after: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_hours_recovered: Mapped[float | None] = mapped_column(Float, nullable=True)


# Migrations from version N to N+1; each runs inside one transaction.
MIGRATIONS: dict[int, Callable[[Engine], None]] = {}


def open_database(url: str | None = None) -> sessionmaker[Session]:
    """Open (and create/migrate) the database at `url`; raise DatabaseError naming the URL."""
    url = url or default_url()
    engine = _engine(url)
    for attempt in range(3):
        try:
            Base.metadata.create_all(engine)
            _migrate(engine)
            break
        except SQLAlchemyError as error:
            # Two daemons creating a new SQLite file at once: the loser sees "already exists".
            if attempt == 2:
                raise DatabaseError(f"cannot open database {_redact(url)}: {error}") from error
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error (as DatabaseError)."""
    session = factory()
    try:
        yield session
        session.commit()
    except SQLAlchemyError as error:
        session.rollback()
        raise DatabaseError(f"database error: {error}") from error
    finally:
        session.close()


def _engine(url: str) -> Engine:
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(connection: object, _record: object) -> None:
    # WAL lets the agents write samples while the controller and reports read.
    cursor = connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")  # NORMAL can lose a recorded intent on power loss
    cursor.close()


def _migrate(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        row = session.scalar(select(SchemaVersion).limit(1))
        if row is None:
            session.add(SchemaVersion(id=1, version=SCHEMA_VERSION))
            return
        while row.version < SCHEMA_VERSION:
            MIGRATIONS[row.version](engine)
            row.version += 1


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
