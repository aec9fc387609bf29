"""The stores on SQLite and MariaDB (`db_url`), and the agent role's grants on the cluster's MariaDB."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, delete, func, select, text, update
from sqlalchemy.engine import make_url

from slurm_aigc.db import (
    GpuSample,
    JobGpuSample,
    NodePublication,
    ProcessSample,
    drop_database,
    is_permission_denied,
    open_database,
    probe_privileges,
    read_url_file,
    transaction,
)
from slurm_aigc.errors import DatabaseError
from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.reclaim.ladder import PlannedAction
from slurm_aigc.reclaim.store import ReclaimStore, SampleRow
from slurm_aigc.telemetry.attribution import JobGpuUsage
from slurm_aigc.telemetry.records import GpuProcess, GpuReading, NodeReading
from slurm_aigc.telemetry.store import Publication, TelemetryStore
from tests.conftest import DatabaseServer

T0 = datetime(2026, 12, 1, 10, tzinfo=UTC)
DEPLOY_DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def reading(node: str, ts: datetime = T0, util: float = 40.0) -> NodeReading:
    gpus = tuple(GpuReading(index=i, uuid=f"GPU-{i}", memory_total_mib=81920.0, memory_used_mib=1024.0,
                            sm_util_pct=util, power_draw_w=100.0, power_limit_w=400.0,
                            processes=(GpuProcess(pid=100 + i, used_memory_mib=1024.0),)) for i in range(2))
    return NodeReading(node=node, ts=ts, driver_version="550.54", gpus=gpus)


def uses() -> list[JobGpuUsage]:
    return [JobGpuUsage("41", i, 40.0, 1024.0, False, (100 + i,)) for i in range(2)]


def plan(key: str = "41/r0/idle/0:notify") -> PlannedAction:
    return PlannedAction(observation_key=key, job_id="41", user="alice", account="ml", job_class="train",
                         verdict="idle", action="notify", step=0, dry_run=False, restarts_before=0,
                         gpus_before=2, gpus_after=2, gpu_hours_recovered=None, message="idle for 60 min")


def test_telemetry_store_round_trip(db_url: str) -> None:
    store = TelemetryStore(open_database(db_url))
    assert store.write_poll(reading("a100-01"), {100: "41", 101: "41"}, uses()) == 6
    assert store.write_poll(reading("a100-02", util=80.0), {}, []) == 4
    assert store.mean_util_by_node(T0.timestamp() - 1) == {"a100-01": 40.0, "a100-02": 80.0}
    store.record_publication(Publication(T0.timestamp(), "a100-01", ("a100",), ("a100", "idle"), 10, 5, "idle", False))
    assert [p.features_after for p in store.publications("a100-01")] == [("a100", "idle")]
    assert store.last_published_weights() == {"a100-01": 5}


def test_reclaim_store_records_an_observation_once(db_url: str) -> None:
    factory = open_database(db_url)
    TelemetryStore(factory).write_poll(reading("a100-01"), {100: "41", 101: "41"}, uses())
    store = ReclaimStore(factory)
    action_id = store.record_intent(plan(), {"why": "idle"}, 1000.5)
    assert action_id is not None and store.record_intent(plan(), {}, 1001.0) is None
    store.record_outcome(action_id, "done", {"sent": True}, 1002.25)
    row = store.audit(job_id="41")[0]
    assert (row.state, row.ts_intent, row.ts_outcome, dict(row.detail)) == ("done", 1000.5, 1002.25, {"sent": True, "why": "idle"})
    samples = store.samples(["41"], T0.timestamp() - 1)
    assert [(s.gpu_index, s.ts, s.sm_util_pct) for s in samples] == [(0, T0.timestamp(), 40.0), (1, T0.timestamp(), 40.0)]
    assert store.newest_sample_ts() == T0.timestamp()
    with transaction(factory) as session:  # every field lands in its place (rows convert positionally)
        stored = {r.id: {name: getattr(r, name) for name in SampleRow._fields} for r in session.scalars(select(JobGpuSample))}
    assert [s._asdict() for s in samples] == [stored[s.id] for s in samples]
    assert all(isinstance(s.shared, bool) and isinstance(s.job_id, str) for s in samples)
    assert store.samples_after(["41"], min(stored) - 1) == samples and store.samples_after(["41"], max(stored)) == []
    assert store.sample_ids(min(stored) - 1, max(stored), T0.timestamp()) == set(stored)
    assert store.sample_ids(min(stored) - 1, max(stored), T0.timestamp() + 1) == set()  # older than asked
    assert store.samples_by_id(sorted(stored, reverse=True)) == samples



def test_an_intent_keeps_a_prefix_of_names_longer_than_the_audit_columns(db_url: str) -> None:
    # Slurm takes longer names than the columns hold: MariaDB and PostgreSQL refused the insert,
    # so the intent (and the action) of such a job failed at every tick.
    store = ReclaimStore(open_database(db_url))
    account = "ml-platform-research-generative-media-diffusion-inference-team-shared"  # 70 characters
    long_names = replace(plan(), user="u" * 70, account=account, job_class="c" * 40)
    action_id = store.record_intent(long_names, {}, 1000.0)
    row = store.audit(job_id="41")[0]
    assert row.id == action_id
    assert (row.user, row.account, row.job_class) == ("u" * 64, account[:64], "c" * 32)

# ---------------------------------------------------------------- least privilege

def _role_url(role: str) -> str:
    return read_url_file(LocalCluster().db_url_file(role))


@pytest.fixture(params=["mariadb", "postgresql"])
def agent_and_controller(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, str]]:
    """The agent's and controller's URLs, and a node name no one else writes: on the cluster's
    MariaDB its two roles, on PostgreSQL (opt-in) new roles with docs/deploy.md's grants."""
    node = f"test-{uuid.uuid4().hex[:10]}"
    if request.param == "postgresql":
        roles: PostgresRoles = request.getfixturevalue("postgres_roles")
        open_database(roles.controller)  # the controller starts first: it creates the schema
        roles.grant_after_first_start()
        yield roles.agent, roles.controller, node
        return
    request.getfixturevalue("mariadb")
    controller = _role_url("controller")
    yield _role_url("agent"), controller, node
    with transaction(open_database(controller)) as session:
        for table in (GpuSample, ProcessSample, JobGpuSample):
            session.execute(delete(table).where(table.node == node))


def deploy_postgresql_sql() -> tuple[list[str], list[str], list[str]]:
    """docs/deploy.md's PostgreSQL role statements, as an admin runs them: (on the server, in the
    database after `\\c slurm_aigc`, after the controller's first start)."""
    roles = DEPLOY_DOC.read_text().split("## 2. Roles", 1)[1]
    block = roles.split("PostgreSQL:\n\n```sql\n", 1)[1].split("```", 1)[0]
    server, _, in_database = block.partition("\\c slurm_aigc\n")
    before, _, after = in_database.partition("-- after the controller has started once:\n")
    return _statements(server), _statements(before), _statements(after)


def _statements(sql: str) -> list[str]:
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    return [statement.strip() for statement in " ".join(lines).split(";") if statement.strip()]


@dataclass
class PostgresRoles:
    """A new database with its own controller and agent roles, set up as docs/deploy.md says."""

    server: DatabaseServer
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.database = self.server.create_database().rsplit("/", 1)[1]
        self._names = {"slurm_aigc": self.database, "aigc_controller": f"aigc_controller_{self.suffix}",
                       "aigc_agent": f"aigc_agent_{self.suffix}", "CONTROLLER-PASSWORD": f"c-{self.suffix}",
                       "AGENT-PASSWORD": f"a-{self.suffix}"}
        on_server, in_database, self._after = deploy_postgresql_sql()
        self._run(None, [s for s in on_server if not s.startswith("CREATE DATABASE")])
        self._run(self.database, in_database)

    def url(self, role: str) -> str:
        user, password = self._names[f"aigc_{role}"], self._names[f"{role.upper()}-PASSWORD"]
        return make_url(self.server.server_url).set(username=user, password=password, database=self.database) \
            .render_as_string(hide_password=False)

    @property
    def agent(self) -> str:
        return self.url("agent")

    @property
    def controller(self) -> str:
        return self.url("controller")

    def grant_after_first_start(self) -> None:
        self._run(self.database, self._after)

    def drop(self) -> None:
        drop_database(self.server.server_url, self.database)
        self._run(None, [f"DROP ROLE IF EXISTS {self._names[r]}" for r in ("aigc_agent", "aigc_controller")])

    def _run(self, database: str | None, statements: list[str]) -> None:
        url = make_url(self.server.server_url)
        engine = create_engine(url.set(database=database) if database else url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                for statement in statements:
                    connection.execute(text(re.sub(r"\b(" + "|".join(map(re.escape, self._names)) + r")\b",
                                                   lambda m: self._names[m.group(1)], statement)))
        finally:
            engine.dispose()


@pytest.fixture
def postgres_roles(postgresql: DatabaseServer) -> Iterator[PostgresRoles]:
    roles = PostgresRoles(postgresql)
    yield roles
    roles.drop()


def test_deploy_doc_gives_the_postgresql_role_statements() -> None:
    # Read by the PostgreSQL leg above: a doc edit that breaks the parsing must fail here, not skip.
    on_server, in_database, after = deploy_postgresql_sql()
    assert any(s.startswith("CREATE ROLE aigc_controller") for s in on_server)
    assert any(s.startswith("CREATE ROLE aigc_agent") for s in in_database)
    assert any(s.startswith("GRANT INSERT ON gpu_samples") for s in after)


def test_agent_role_may_add_samples(agent_and_controller: tuple[str, str, str]) -> None:
    agent, controller, node = agent_and_controller
    assert TelemetryStore(open_database(agent)).write_poll(reading(node), {100: "41"}, uses()) == 6
    with transaction(open_database(controller)) as session:
        assert session.scalar(select(func.count()).select_from(JobGpuSample).where(JobGpuSample.node == node)) == 2


@pytest.mark.parametrize("statement", [
    "INSERT INTO actions (observation_key, ts_intent, job_id, verdict, action, step, dry_run, state, detail) "
    "VALUES ('x', 1, '1', 'idle', 'requeue', 0, FALSE, 'done', '')",
    "INSERT INTO node_publications (ts, node, reason, dry_run) VALUES (1, 'n', 'x', FALSE)",
    "UPDATE gpu_samples SET sm_util_pct = 0",
    "UPDATE schema_version SET version = 99",
    "INSERT INTO leases (part, holder, acquired_at, expires_at) VALUES ('reclaim', 'a node', 0, 1e12)",
    "DELETE FROM job_gpu_samples",
    "TRUNCATE TABLE process_samples",
    "SELECT count(*) FROM actions",
    "SELECT job_id, sm_util_pct FROM job_gpu_samples",
    "SELECT node FROM gpu_samples",
    "DROP TABLE gpu_samples",
    "ALTER TABLE gpu_samples ADD COLUMN x INT",
    "CREATE TABLE evil (id INT)",
])
def test_agent_role_forbidden_statements_are_refused(agent_and_controller: tuple[str, str, str], statement: str) -> None:
    agent, _controller, _node = agent_and_controller
    factory = open_database(agent)
    with refused():
        with transaction(factory) as session:
            session.execute(text(statement))


@contextmanager
def refused() -> Iterator[None]:
    """The block fails for lack of a privilege (MariaDB: "... command denied", PostgreSQL:
    "permission denied" or "must be owner"), not for any other reason."""
    with pytest.raises(DatabaseError) as caught:
        yield
    assert is_permission_denied(caught.value), caught.value


def test_agent_role_cannot_record_actions_or_publications_through_the_stores(
        agent_and_controller: tuple[str, str, str]) -> None:
    agent, _controller, node = agent_and_controller
    factory = open_database(agent)
    with refused():
        TelemetryStore(factory).record_publication(Publication(1.0, node, None, None, None, 1, "x", False))
    with refused():
        ReclaimStore(factory).record_intent(plan(f"{node}/r0"), {}, 1.0)
    with refused():
        with transaction(factory) as session:
            session.execute(update(NodePublication).values(reason="x"))


def test_agent_role_cannot_create_the_schema_on_postgresql(postgres_roles: PostgresRoles) -> None:
    with pytest.raises(DatabaseError, match="this role may not create"):
        open_database(postgres_roles.agent)  # before the controller's first start


def test_agent_role_cannot_create_the_schema(mariadb: object, tmp_path: Path) -> None:
    # On an empty database the agent says who must create the schema instead of failing obscurely.
    server = mariadb
    url = server.create_database()  # type: ignore[attr-defined]
    agent_user = _role_url("agent").split("://", 1)[1].split("@", 1)[0]
    with pytest.raises(DatabaseError, match="denied|this role may not create"):
        open_database(url.replace(url.split("://", 1)[1].split("@", 1)[0], agent_user, 1))


def test_doctor_probes_see_the_agent_and_controller_grants(agent_and_controller: tuple[str, str, str]) -> None:
    agent, controller, _node = agent_and_controller
    assert probe_privileges(open_database(agent)) == {
        "add samples": True, "read samples": False, "write actions": False, "write publications": False,
        "update rows": False, "delete samples": False, "read actions": False}
    assert all(probe_privileges(open_database(controller)).values())
