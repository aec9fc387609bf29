"""Shared fixtures: the session-scoped local cluster for integration tests, and `db_url`:
every store test runs on SQLite and on a throwaway database on the local cluster's MariaDB."""

from __future__ import annotations

import itertools
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from slurm_aigc.db import drop_database, read_url_file, recreate_database
from slurm_aigc.errors import DatabaseError
from slurm_aigc.localcluster.config import SCRATCH_DATABASE_PREFIX, TEST_DATABASE_PREFIX
from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.localcluster.shape import DEFAULT_SHAPE
from slurm_aigc.replay.metrics import END_STATES
from slurm_aigc.slurm import SlurmCli

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SLURM_AIGC_BIN = str(Path(sys.executable).with_name("slurm-aigc"))


@dataclass(frozen=True)
class ClusterHandle:
    """What integration tests get: the real local cluster and how to reach it."""

    slurm: SlurmCli
    state_dir: Path
    simgpu_dir: Path
    etc_dir: Path
    nodes: list[str]
    local: LocalCluster

    def nodes_of_type(self, gpu_type: str) -> list[str]:
        """Names of the nodes whose GPUs are `gpu_type` (whatever shape the cluster runs)."""
        return [node.name for node in self.local.shape().nodes if node.gpu.gres_type == gpu_type]

    @property
    def slurm_aigc_in_job(self) -> str:
        """Shell words that run slurm-aigc inside a job of any user (e.g. `... gpu-load --util 50`)."""
        return shlex.join(self.local.job_command())


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterHandle]:
    """Bring the local cluster up (or reuse a running one); needs root and Debian's Slurm.

    $SLURM_AIGC_TEST_SHAPE picks the shape (a running cluster of another shape is replaced);
    without it a running cluster is reused as it is, and a stopped one starts in the default shape.
    """
    if os.geteuid() != 0:
        pytest.fail("integration tests need root to run the local Slurm cluster")
    local = LocalCluster(progress=lambda message: print(f"[cluster] {message}", file=sys.stderr))
    wanted = os.environ.get("SLURM_AIGC_TEST_SHAPE") or (None if local.is_up() else DEFAULT_SHAPE)
    shape = local.up(wanted, install=os.environ.get("SLURM_AIGC_TEST_INSTALL") == "1", replace=True)
    cancel_leftover_jobs(local.slurm)
    yield ClusterHandle(
        slurm=local.slurm,
        state_dir=local.state_dir,
        simgpu_dir=local.simgpu_dir,
        etc_dir=local.etc_dir,
        nodes=[node.name for node in shape.nodes],
        local=local,
    )


def cancel_leftover_jobs(slurm: SlurmCli, timeout_s: float = 60.0) -> None:
    """Cancel every job the cluster still holds or queues, and wait until each has ended.

    Each test cancels its own jobs, but a run killed before that cleanup leaves them, and
    slurmctld restores them when the cluster restarts: one such job (`reclaim-idle`, requeued
    into the next run) held a t4 through a later CI run, and every shard test on that node
    timed out waiting for a GPU (2026-12-06).
    """
    def live() -> list[str]:
        return [job.user for job in slurm.jobs() if job.state.split()[0] not in END_STATES]

    for user in sorted(set(live())):
        slurm.run("scancel", ["-u", user])
    deadline = time.monotonic() + timeout_s
    while left := live():
        if time.monotonic() > deadline:
            pytest.fail(f"{len(left)} job(s) left by an earlier run did not end within {timeout_s:.0f} s of scancel")
        time.sleep(0.5)


@pytest.fixture
def cluster_db(cluster: ClusterHandle) -> Iterator[str]:
    """A fresh database on the local cluster's MariaDB for one integration test (the multi-host
    path); the path of its URL file, for `--db` (no password in argv). Dropped afterwards."""
    name = f"it_{os.getpid()}_{next(_CLUSTER_DB_NUMBERS)}"
    path = cluster.local.scratch_database(name)
    yield path
    drop_database(read_url_file(Path(path)), SCRATCH_DATABASE_PREFIX + name)
    Path(path).unlink(missing_ok=True)


_CLUSTER_DB_NUMBERS = itertools.count()


@pytest.fixture
def shared_dir() -> Path:
    """../shared (data we may read but not commit); tests skip when it is absent."""
    if not SHARED.is_dir():
        pytest.skip("../shared is absent")
    return SHARED


@dataclass
class DatabaseServer:
    """A MariaDB or PostgreSQL server as a role that may create databases: throwaway databases."""

    server_url: str
    created: list[str] = field(default_factory=list)
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    def create_database(self) -> str:
        """A new empty database (dropped at the end of the session); returns its URL."""
        name = f"{TEST_DATABASE_PREFIX}{os.getpid()}_{next(self._numbers)}"
        self.created.append(name)
        return recreate_database(self.server_url, name)

    def drop_all(self) -> None:
        for name in self.created:
            drop_database(self.server_url, name)


@pytest.fixture(scope="session")
def mariadb() -> Iterator[DatabaseServer]:
    """The local cluster's MariaDB (scripts/test.sh brings the cluster up); skips, saying why, without it."""
    path = LocalCluster().db_url_file("test")
    if not path.exists():
        pytest.skip(f"MariaDB leg: the local cluster's MariaDB is not set up ({path} absent): run "
                    "`slurm-aigc cluster up` (scripts/test.sh does)")
    server = DatabaseServer(make_url(read_url_file(path)).set(database=None).render_as_string(hide_password=False))
    try:
        server.create_database()
    except DatabaseError as error:
        pytest.skip(f"MariaDB leg: the local cluster's MariaDB does not answer ({error}): run `slurm-aigc cluster up`")
    yield server
    server.drop_all()


# PostgreSQL leg (scripts/test.sh starts a server: scripts/pg-test-server.sh; elsewhere opt-in): the URL
# of a role that may create databases and roles on a PostgreSQL >= 13 server, e.g.
# postgresql+psycopg://aigc_pgtest:PW@localhost/postgres.
PG_URL_ENV = "SLURM_AIGC_TEST_PG_URL"


@pytest.fixture(scope="session")
def postgresql() -> Iterator[DatabaseServer]:
    """The PostgreSQL server named by $SLURM_AIGC_TEST_PG_URL; skips, saying how to opt in, without it."""
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.skip(f"PostgreSQL leg: opt in with {PG_URL_ENV}=postgresql+psycopg://USER:PW@HOST/postgres "
                    "(a role that may create databases and roles)")
    server = DatabaseServer(url)
    try:
        server.create_database()
    except DatabaseError as error:
        pytest.skip(f"PostgreSQL leg: {PG_URL_ENV} does not answer: {error}")
    yield server
    server.drop_all()


# PgBouncer leg (with the PostgreSQL leg; scripts/test.sh starts one too): a PgBouncer in transaction mode in front of the
# server of SLURM_AIGC_TEST_PG_URL, by host and port, e.g. postgresql+psycopg://127.0.0.1:6432; what
# it must be configured with: tests/unit/test_pgbouncer.py.
PGBOUNCER_URL_ENV = "SLURM_AIGC_TEST_PGBOUNCER_URL"


@pytest.fixture(scope="session")
def pgbouncer(request: pytest.FixtureRequest) -> str:
    """The PgBouncer named by $SLURM_AIGC_TEST_PGBOUNCER_URL (the PostgreSQL leg's server behind it);
    skips, saying how to opt in, without it or when nothing listens there."""
    url = os.environ.get(PGBOUNCER_URL_ENV)
    if not url:
        pytest.skip(f"PgBouncer leg: opt in with {PGBOUNCER_URL_ENV}=postgresql+psycopg://HOST:PORT (a PgBouncer "
                    f"in transaction mode in front of {PG_URL_ENV}'s server; see tests/unit/test_pgbouncer.py)")
    request.getfixturevalue("postgresql")
    address = make_url(url)
    try:
        socket.create_connection((address.host or "localhost", address.port or 6432), timeout=5).close()
    except OSError as error:
        pytest.skip(f"PgBouncer leg: nothing answers at {PGBOUNCER_URL_ENV}={url}: {error}")
    return url


@pytest.fixture(params=["sqlite", "mariadb", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database's URL: a SQLite file, then a throwaway database on the cluster's MariaDB,
    then (opt-in, see PG_URL_ENV) one on a PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    server: DatabaseServer = request.getfixturevalue(request.param)
    return server.create_database()
