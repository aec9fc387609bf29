"""The agent's write path through PgBouncer in transaction mode (docs/deploy.md, "Connections").

psycopg 3 prepares every `executemany` on the server ("_pg3_N"), so an agent's first poll; PgBouncer in
transaction mode hands the next transaction another server connection, where that statement does not
exist (PgBouncer < 1.21, or `max_prepared_statements = 0`). Measured before the fix, 12 agents through
PgBouncer 1.18 with 4 server connections: 666 of 1,200 polls failed. The agent's engine therefore
prepares nothing (`db.connect_args`).

The PgBouncer leg runs where scripts/test.sh runs (scripts/pg-test-server.sh starts the pair), else
it is opt-in: $SLURM_AIGC_TEST_PG_URL (tests/conftest.py) and
$SLURM_AIGC_TEST_PGBOUNCER_URL=postgresql+psycopg://HOST:PORT, a PgBouncer (1.18 or later) in front of
that server with, in pgbouncer.ini:

    [databases]
    * = host=PGHOST port=PGPORT
    [pgbouncer]
    pool_mode = transaction
    ignore_startup_parameters = options
    default_pool_size = 4          ; fewer server connections than agents below
    auth_type = scram-sha-256
    auth_file = userlist.txt       ; the admin role of SLURM_AIGC_TEST_PG_URL and its password
    auth_user = ADMIN              ; that role (a superuser): looks up the test's new roles

`max_prepared_statements` is left at the version's default (0 before 1.24, 200 since).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from slurm_aigc import db
from slurm_aigc.db import JobGpuSample, open_database, transaction
from slurm_aigc.errors import DatabaseError
from slurm_aigc.lease import RECLAIM, Leases
from slurm_aigc.telemetry.attribution import JobGpuUsage
from slurm_aigc.telemetry.records import GpuProcess, GpuReading, NodeReading
from slurm_aigc.telemetry.store import TelemetryStore
from tests.conftest import DatabaseServer
from tests.unit.test_lease import race
from tests.unit.test_stores import PostgresRoles

DEPLOY_DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
T0 = datetime(2026, 12, 1, 10, tzinfo=UTC)
AGENTS, POLLS, GPUS = 8, 25, 8


def deploy_agent_timeout_sql() -> str:
    """docs/deploy.md's statement that bounds the agent's statements behind PgBouncer (which drops
    the bound the agent sends when connecting)."""
    connections = DEPLOY_DOC.read_text().split("**Connections.**", 1)[1].split("**Timeouts.**", 1)[0]
    found = re.search(r"`(ALTER ROLE aigc_agent SET statement_timeout = '\w+');`", connections)
    assert found, "docs/deploy.md, Connections: no `ALTER ROLE aigc_agent SET statement_timeout = '...';`"
    return found.group(1)


def poll(node: str, number: int) -> tuple[NodeReading, dict[int, str | None], list[JobGpuUsage]]:
    """One poll of an 8-GPU node, one process and one job's use per GPU (24 rows)."""
    gpus = tuple(GpuReading(index=i, uuid=f"GPU-{i}", memory_total_mib=81920.0, memory_used_mib=1024.0,
                            sm_util_pct=float(number % 100), power_draw_w=100.0, power_limit_w=400.0,
                            processes=(GpuProcess(pid=100 + i, used_memory_mib=1024.0),)) for i in range(GPUS))
    reading = NodeReading(node=node, ts=T0 + timedelta(seconds=10 * number), driver_version="550.54", gpus=gpus)
    return reading, {100 + i: "41" for i in range(GPUS)}, [JobGpuUsage("41", i, 40.0, 1024.0, False, (100 + i,)) for i in range(GPUS)]


# ---------------------------------------------------------------- always

def test_the_agents_engine_prepares_no_statement_on_the_server() -> None:
    assert db.connect_args("postgresql+psycopg://u:p@h/d", 60)["prepare_threshold"] is None
    assert db.connect_args("postgresql+psycopg://u:p@h/d", None)["prepare_threshold"] is None
    # psycopg2 never prepares, and libpq would refuse the keyword as an unknown connection option.
    assert "prepare_threshold" not in db.connect_args("postgresql+psycopg2://u:p@h/d", 60)


def test_deploy_doc_gives_the_agents_statement_timeout_for_pgbouncer() -> None:
    # Run by the PgBouncer leg below: a doc edit that breaks the parsing must fail here, not skip.
    assert deploy_agent_timeout_sql() == "ALTER ROLE aigc_agent SET statement_timeout = '60s'"


# ---------------------------------------------------------------- PostgreSQL leg (opt-in)

@pytest.fixture
def deployed(postgresql: DatabaseServer) -> Iterator[PostgresRoles]:
    """A database with docs/deploy.md's roles and grants, its schema created by the controller, and
    the agent role's statement_timeout from the PgBouncer bullet."""
    roles = PostgresRoles(postgresql)
    open_database(roles.controller)  # the controller starts first: it creates the schema
    roles.grant_after_first_start()
    agent_role = make_url(roles.agent).username
    admin = create_engine(make_url(postgresql.server_url).set(database=roles.database), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(deploy_agent_timeout_sql().replace("aigc_agent", str(agent_role))))
    admin.dispose()
    yield roles
    roles.drop()


def test_the_agents_polls_leave_no_prepared_statement_on_postgresql(deployed: PostgresRoles) -> None:
    # Before the fix: 3 after the first poll (one per sample table), each reused by later polls.
    factory = open_database(deployed.agent)
    store = TelemetryStore(factory)
    for number in range(POLLS):
        store.write_poll(*poll("direct-01", number))
    with transaction(factory) as session:  # the same pooled connection as the polls
        assert session.scalar(text("SELECT count(*) FROM pg_prepared_statements")) == 0


# ---------------------------------------------------------------- PgBouncer leg (opt-in)

def through(pgbouncer: str, role_url: str) -> str:
    """`role_url` (user, password, database) through the PgBouncer at `pgbouncer` (host, port)."""
    address = make_url(pgbouncer)
    return make_url(role_url).set(host=address.host, port=address.port).render_as_string(hide_password=False)


def test_agents_polling_through_pgbouncer_in_transaction_mode_all_store_their_samples(
        pgbouncer: str, deployed: PostgresRoles) -> None:
    # Before the fix, on PgBouncer 1.18: 'prepared statement "_pg3_0" does not exist' from the second poll
    # of most agents (their transaction ran on another server connection than the one that prepared it).
    errors: list[str] = []

    def agent(node: str) -> None:
        try:
            store = TelemetryStore(open_database(through(pgbouncer, deployed.agent)))
            for number in range(POLLS):
                store.write_poll(*poll(node, number))
        except DatabaseError as error:
            errors.append(f"{node}: {error}")
    threads = [threading.Thread(target=agent, args=(f"bouncer-{n:02d}",)) for n in range(AGENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    with transaction(open_database(deployed.controller)) as session:
        stored = session.scalar(select(func.count()).select_from(JobGpuSample))
    assert stored == AGENTS * POLLS * GPUS


def test_the_agents_statements_through_pgbouncer_are_bounded_by_its_role(pgbouncer: str, deployed: PostgresRoles) -> None:
    # PgBouncer drops the statement_timeout the agent sends when connecting (ignore_startup_parameters =
    # options; without it the connection is refused); the server then applies the role's setting.
    factory = open_database(through(pgbouncer, deployed.agent))
    with transaction(factory) as session:
        assert session.scalar(text("SHOW statement_timeout")) == "1min"


def test_floats_come_back_exact_through_pgbouncer_whatever_the_roles_extra_float_digits(
        pgbouncer: str, deployed: PostgresRoles, postgresql: DatabaseServer) -> None:
    # Each transaction sets extra_float_digits itself (SET LOCAL), so it holds on whichever server
    # connection PgBouncer lends it; the role's 0 would print a sample's ts to 15 digits.
    controller_role = make_url(deployed.controller).username
    admin = create_engine(make_url(postgresql.server_url).set(database=deployed.database), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"ALTER ROLE {controller_role} SET extra_float_digits = 0"))
    admin.dispose()
    factory = open_database(through(pgbouncer, deployed.controller))
    for _ in range(8):  # more transactions than PgBouncer's server connections
        with transaction(factory) as session:
            assert session.scalar(text("SELECT 1764460900.123456::float8")) == 1764460900.123456


def test_controllers_through_pgbouncer_in_transaction_mode_take_turns_by_lease(
        pgbouncer: str, deployed: PostgresRoles) -> None:
    # A lease is a row, not a session lock: PgBouncer lends each transaction another server connection.
    url = through(pgbouncer, deployed.controller)
    assert sum(race(url)) == 1
    holder = Leases(open_database(url), 60.0, name="standby")
    for _ in range(8):  # more transactions than PgBouncer's server connections
        assert not holder.hold(RECLAIM)
