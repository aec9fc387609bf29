"""`slurm-aigc doctor` with fakes: each broken piece gives a FAIL line with its fix and exit 1."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from slurm_aigc import db
from slurm_aigc.cli import doctor as doc
from slurm_aigc.db import open_database, probe_privileges, server_time
from slurm_aigc.errors import ConfigError, DatabaseError, NvmlUnavailableError
from slurm_aigc.lease import RECLAIM, Leases, holders
from slurm_aigc.localcluster.manager import LocalCluster
from tests.conftest import DatabaseServer

AGENT_CAN = {"add samples": True, "read samples": False, "read actions": False, "write actions": False,
             "write publications": False, "update rows": False, "delete samples": False}
CONTROLLER_CAN = dict.fromkeys(AGENT_CAN, True)
AGENT_URL = "mysql+pymysql://aigc_agent:AGENT-PASSWORD@db1/slurm_aigc"


def no_default() -> str:
    raise AssertionError("doctor fell back to the default URL")


def env(**changes: object) -> doc.DoctorEnv:
    healthy = doc.DoctorEnv(
        open_db=lambda url: object(), privileges=lambda factory: dict(AGENT_CAN), server_time=lambda f: 1000.0,
        slurm_config=lambda: {"SLURM_VERSION": "22.05.8", "Prolog": "/etc/slurm/prolog.sh",
                              "Epilog": "/etc/slurm/epilog.sh", "SlurmUser": "slurm(64030)", "GresTypes": "gpu,shard",
                              "AccountingStorageTRES": "cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu,gres/shard"},
        slurm_ping=lambda: True, slurm_admin_level=lambda user: "Operator", nvml_gpus=lambda: 8,
        load_policy=lambda path: object(), read_text=lambda path: "exec slurm-aigc-jobrecord prolog\n",
        expand=lambda pattern: [pattern], clock=lambda: 1000.0,
        environ={"SLURM_AIGC_DB_URL": AGENT_URL}, environment_files=lambda role: ["/nonexistent/default/slurm-aigc"],
        default_url=no_default,
    )
    return replace(healthy, **changes)  # type: ignore[arg-type]


def failed(findings: list[doc.Finding]) -> dict[str, doc.Finding]:
    return {item.check: item for item in findings if not item.ok}


def test_a_healthy_agent_host_passes() -> None:
    findings = doc.run_checks(env(), "agent", None, None)
    assert failed(findings) == {}
    assert [f.check for f in findings] == ["database", "database role (agent)", "clock", "slurm", "slurm rights",
                                           "prolog", "policy", "nvml"]


def test_an_agent_role_that_can_write_actions_fails_with_the_grant_to_fix() -> None:
    findings = failed(doc.run_checks(env(privileges=lambda f: dict(CONTROLLER_CAN)), "agent", None, None))
    assert set(findings) == {"database role (agent)"}
    assert "write actions should be refused" in findings["database role (agent)"].fix
    assert "delete samples should be refused" in findings["database role (agent)"].fix


def test_a_controller_role_that_cannot_write_actions_fails() -> None:
    findings = failed(doc.run_checks(env(privileges=lambda f: dict(AGENT_CAN)), "controller", None, None))
    assert "write actions should be allowed" in findings["database role (controller)"].fix


def test_unreachable_database_says_so() -> None:
    def down(url: str | None) -> object:
        raise DatabaseError("cannot open database mysql+pymysql://a:***@db1/slurm_aigc: Connection refused")
    findings = failed(doc.run_checks(env(open_db=down), "agent", None, None))
    assert "Connection refused" in findings["database"].detail and "***" in findings["database"].detail


def test_clock_skew_against_the_database_server() -> None:
    findings = failed(doc.run_checks(env(server_time=lambda f: 1007.5), "controller", None, None))
    assert findings["clock"].detail == "this host is +7.5 s off the database server"
    assert "chrony" in findings["clock"].fix


REPO = Path(__file__).resolve().parents[2]


def test_prolog_and_epilog_globs_are_read_file_by_file(tmp_path: Path) -> None:
    # A site keeps its own prolog.d scripts (one of them binary) and links ours in beside them.
    for end in ("prolog.d", "epilog.d"):
        (tmp_path / end).mkdir()
        (tmp_path / end / "10-site").write_bytes(b"\x7fELF\xff\xfe")
        (tmp_path / end / "50-slurm-aigc").symlink_to(REPO / "daemon" / "slurm-aigc-jobrecord")
    conf = {"Prolog": f"{tmp_path}/prolog.d/*", "Epilog": f"{tmp_path}/epilog.d/*"}
    real = env(slurm_config=lambda: conf, read_text=lambda path: Path(path).read_text(encoding="utf-8"),
               expand=doc.DoctorEnv.expand)
    finding = {f.check: f for f in doc.run_checks(real, "agent", None, None)}["prolog"]
    assert finding.ok, finding
    assert finding.detail.startswith(f"{tmp_path}/prolog.d/50-slurm-aigc and {tmp_path}/epilog.d/50-slurm-aigc")


def test_a_prolog_without_the_epilog_or_only_our_taskprolog_fails() -> None:
    only_prolog = failed(doc.run_checks(env(slurm_config=lambda: {"Prolog": "/etc/slurm/prolog.sh"}),
                                        "agent", None, None))
    assert only_prolog["prolog"].detail == "Epilog=(null): no script there calls slurm-aigc-jobrecord"
    task = env(slurm_config=lambda: {"Prolog": "(null)", "TaskProlog": "/usr/local/libexec/slurm-aigc-taskprolog"},
               read_text=lambda path: (REPO / "daemon" / "slurm-aigc-taskprolog").read_text(encoding="utf-8"))
    assert "Prolog=(null), Epilog=(null)" in failed(doc.run_checks(task, "agent", None, None))["prolog"].detail


def test_missing_prolog_nvml_policy_and_rights() -> None:
    def no_nvml() -> int:
        raise NvmlUnavailableError("NVML could not start: NVML Shared Library Not Found")

    def bad_policy(path: str | None) -> object:
        raise ConfigError("/etc/slurm-aigc/slurm-aigc.yaml", "storage.raw_retention_hours", "must be > 0")
    broken = env(slurm_config=lambda: {"Prolog": "(null)"}, nvml_gpus=no_nvml, load_policy=bad_policy,
                 slurm_admin_level=lambda user: "None")
    findings = failed(doc.run_checks(broken, "agent", None, None))
    assert set(findings) == {"prolog", "nvml", "policy", "slurm rights"}
    assert "docs/deploy.md" in findings["prolog"].fix and "adminlevel=Administrator" in findings["slurm rights"].fix  # an agent updates its node
    assert "raw_retention_hours" in findings["policy"].detail


def test_slurmctld_down() -> None:
    findings = failed(doc.run_checks(env(slurm_ping=lambda: False), "controller", None, None))
    assert findings["slurm"].detail == "slurmctld does not answer `scontrol ping`"


def test_command_exit_code_and_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doc, "real_env", lambda: env(server_time=lambda f: 990.0))
    result = CliRunner().invoke(doc.doctor, ["--role", "agent"])
    assert result.exit_code == 1
    assert "FAIL  clock: this host is -10.0 s off the database server" in result.output
    monkeypatch.setattr(doc, "real_env", lambda: env())
    assert CliRunner().invoke(doc.doctor, ["--role", "agent"]).exit_code == 0


def test_probes_on_sqlite_change_nothing(tmp_path: Path) -> None:
    # The real probes (WHERE 1 = 0) on SQLite: every privilege, no row written, no server clock.
    factory = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    assert probe_privileges(factory) == CONTROLLER_CAN
    assert server_time(factory) is None
    findings = failed(doc.run_checks(env(open_db=lambda url: factory, privileges=probe_privileges,
                                         server_time=server_time), "agent", None, None))
    assert "write actions should be refused" in findings["database role (agent)"].fix


def agent_url_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent-db.url"
    db.write_url_file(path, AGENT_URL)
    return path


def test_the_url_comes_from_the_units_environment_file_when_the_shell_names_none(tmp_path: Path) -> None:
    # docs/deploy.md names the agent's URL file only in /etc/default/slurm-aigc: an admin's shell
    # has none of it, and doctor fell back to the SQLite default instead of the agent's database.
    defaults = tmp_path / "default"
    defaults.write_text(f"# site settings\n; old style comment\nexport SLURM_AIGC_DB_URL=sqlite:////evil.db\n"
                        f"SLURM_AIGC_CONFIG=/etc/slurm-aigc/slurm-aigc.yaml\n"
                        f"SLURM_AIGC_DB_URL_FILE=\"{agent_url_file(tmp_path)}\"\n", encoding="utf-8")
    opened: list[str | None] = []
    checked = env(environ={"HOME": "/root"}, environment_files=lambda role: [str(defaults)],
                  open_db=lambda url: opened.append(url))
    findings = {f.check: f for f in doc.run_checks(checked, "agent", None, None)}
    assert opened == [AGENT_URL] and findings["database"].ok
    assert findings["database"].detail == (
        f"reachable, schema current (mysql+pymysql://aigc_agent:***@db1/slurm_aigc from {tmp_path}/agent-db.url, "
        f"named by SLURM_AIGC_DB_URL_FILE in {defaults})")
    # The shell's own setting wins, as it does for the daemon started from it.
    opened.clear()
    doc.run_checks(replace(checked, environ={"SLURM_AIGC_DB_URL": "mysql+pymysql://x@db2/y"}), "agent", None, None)
    assert opened == ["mysql+pymysql://x@db2/y"]


def test_the_shipped_units_name_their_environment_files_and_their_users() -> None:
    assert doc.unit_environment_files("agent") == ("/etc/default/slurm-aigc", "/etc/default/slurm-aigc-agent")
    assert doc.unit_environment_files("controller") == ("/etc/default/slurm-aigc", "/etc/default/slurm-aigc-controller")
    assert doc.unit_settings("agent")["User"] == "slurm" and doc.unit_settings("controller")["User"] == "slurm-aigc"


def test_a_missing_sqlite_file_fails_and_doctor_does_not_create_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "lib" / "state.db"
    monkeypatch.setattr(db, "DEFAULT_DB_URL", f"sqlite:///{state}")
    checked = env(environ={}, default_url=lambda: db.DEFAULT_DB_URL, open_db=open_database,
                  privileges=probe_privileges, server_time=server_time)
    findings = failed(doc.run_checks(checked, "controller", None, None))
    assert findings["database"].detail == f"{state} does not exist (URL from the single-host SQLite default)"
    assert "server database" in findings["database"].fix and "/nonexistent/default/slurm-aigc" in findings["database"].fix
    assert not state.parent.exists()


def test_a_sqlite_file_uri_is_checked_by_opening_it_as_the_daemons_do(tmp_path: Path) -> None:
    # doctor read `file:/...` as a path, found no such file and failed the database; opening it
    # failed too, on the schema lock next to that path (db.sqlite_path: the one reading of both).
    state = tmp_path / "state.db"
    url = f"sqlite:///file:{state}?uri=true"
    open_database(url)
    checked = env(environ={"SLURM_AIGC_DB_URL": url}, open_db=open_database, privileges=probe_privileges,
                  server_time=server_time)
    found = {f.check: f for f in doc.run_checks(checked, "controller", None, None)}
    assert found["database"].ok, found["database"].detail
    assert db.sqlite_path(url) == db.sqlite_path(f"sqlite:///{state}") == str(state)
    assert db.sqlite_path("sqlite://") is None and db.sqlite_path("mysql+pymysql://u@h/d") is None


def test_the_controller_check_says_which_process_holds_each_lease(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    factory = open_database(url)

    def check() -> doc.Finding:
        checked = env(environ={"SLURM_AIGC_DB_URL": url}, open_db=open_database, privileges=probe_privileges,
                      server_time=server_time, lease_holders=lambda f: [h.describe() for h in holders(f)])
        return {f.check: f for f in doc.run_checks(checked, "controller", None, None)}["leases"]

    assert check().detail == "none taken yet: no controller daemon has run against this database"
    live, trial = Leases(factory, 60.0, name="host1:42:ab"), Leases(factory, 60.0, name="host2:7:cd", dry_run=True)
    assert live.hold(RECLAIM) and trial.hold(RECLAIM)
    found = check()
    assert found.ok and found.detail.startswith("the dry-run reclaim lease is held by host2:7:cd for ")
    assert "; the reclaim lease is held by host1:42:ab for " in found.detail
    live.release()
    assert "the reclaim lease is free" in check().detail


def test_a_leases_table_the_role_cannot_read_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_database(url)

    def denied(factory: object) -> list[str]:
        raise DatabaseError("database error: (1142, \"SELECT command denied to user 'aigc_agent' for table 'leases'\")")

    checked = env(environ={"SLURM_AIGC_DB_URL": url}, open_db=open_database, privileges=probe_privileges,
                  server_time=server_time, lease_holders=denied)
    found = {f.check: f for f in doc.run_checks(checked, "controller", None, None)}
    assert not found["leases"].ok and "SELECT command denied" in found["leases"].detail
    assert found["database"].ok


def test_an_agent_on_sqlite_is_a_warning_not_a_role_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SQLite has no roles: every probe passes, which doctor read as "write actions should be
    # refused". The project runs an agent on SQLite on the controller's own host: a warning.
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_database(url)
    monkeypatch.setattr(doc, "real_env", lambda: env(environ={"SLURM_AIGC_DB_URL": url}, open_db=open_database,
                                                     privileges=probe_privileges, server_time=server_time))
    result = CliRunner().invoke(doc.doctor, ["--role", "agent"])
    assert result.exit_code == 0, result.output
    assert f"WARN  database role (agent): SQLite file {tmp_path / 'state.db'}: no roles" in result.output
    assert "fix: agents on other hosts than the controller need a server database" in result.output
    assert "ok    clock: SQLite: no database server to compare with" in result.output


def test_an_agent_role_that_can_read_samples_or_the_audit_trail_fails() -> None:
    nosy = dict(AGENT_CAN, **{"read samples": True, "read actions": True})
    findings = failed(doc.run_checks(env(privileges=lambda f: nosy), "agent", None, None))
    assert set(findings) == {"database role (agent)"}
    fix = findings["database role (agent)"].fix
    assert "read samples should be refused" in fix and "read actions should be refused" in fix


def test_the_local_clusters_shipped_grants_pass_the_role_checks(mariadb: DatabaseServer) -> None:
    # The agent role `cluster up` creates (localcluster render_agent_grants_sql, docs/deploy.md's
    # MariaDB grants): it may add samples and read neither samples nor the audit trail. The
    # probes change no row, so the cluster's own database is only read.
    roles = {role: db.read_url_file(LocalCluster().db_url_file(role)) for role in ("agent", "controller")}
    for role, url in roles.items():
        checked = env(environ={"SLURM_AIGC_DB_URL": url}, open_db=open_database, privileges=probe_privileges,
                      server_time=lambda f: None)
        findings = {f.check: f for f in doc.check_database(checked, role, None)}
        assert findings[f"database role ({role})"].ok, findings
    agent = probe_privileges(open_database(roles["agent"]))
    assert agent["read samples"] is False and agent["read actions"] is False


def test_slurm_rights_are_the_daemon_users_not_doctors(monkeypatch: pytest.MonkeyPatch) -> None:
    # Run as root, doctor passed whatever the controller's account (the unit's User=) could do.
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    asked: list[str] = []

    def levels(user: str) -> str:
        asked.append(user)
        return {"slurm-aigc": "", "ops": "Operator"}.get(user, "None")
    findings = failed(doc.run_checks(env(slurm_admin_level=levels), "controller", None, None))
    assert asked == ["slurm-aigc"]
    assert findings["slurm rights"].detail == "runs as slurm-aigc (AdminLevel=None)"
    assert "sacctmgr modify user slurm-aigc set adminlevel=Operator" in findings["slurm rights"].fix
    assert "slurm rights" not in failed(doc.run_checks(env(slurm_admin_level=levels), "controller", None, None, "ops"))
    # SlurmUser ("slurm(64030)") holds the right without any AdminLevel: the agent's unit runs as it.
    agent = {f.check: f for f in doc.run_checks(env(slurm_admin_level=levels), "agent", None, None)}
    assert agent["slurm rights"].ok and agent["slurm rights"].detail == "runs as slurm (SlurmUser)"
    assert asked == ["slurm-aigc", "ops"]
    monkeypatch.setattr(doc, "real_env", lambda: env(slurm_admin_level=levels))
    result = CliRunner().invoke(doc.doctor, ["--role", "controller", "--user", "slurm"])
    assert "ok    slurm rights: runs as slurm (SlurmUser)" in result.output


def test_an_agent_that_publishes_features_needs_the_right_to_update_its_node() -> None:
    # slurmctld lets only root, SlurmUser and Administrator update a node: an Operator agent
    # passed doctor and then failed every publication of its static features.
    from types import SimpleNamespace

    def policy(publish: bool) -> Callable[[object], object]:
        return lambda path: SimpleNamespace(agent=SimpleNamespace(publish_features=publish))

    operator = env(slurm_admin_level=lambda user: "Operator")
    findings = failed(doc.run_checks(replace(operator, load_policy=policy(True)), "agent", None, None, "ops"))
    assert "adminlevel=Administrator" in findings["slurm rights"].fix
    quiet = failed(doc.run_checks(replace(operator, load_policy=policy(False)), "agent", None, None, "ops"))
    assert "slurm rights" not in quiet  # no features to publish: no node updates
    assert "slurm rights" not in failed(doc.run_checks(operator, "controller", None, None, "ops"))


@pytest.mark.parametrize(("version", "gres_types", "noted"), [
    ("22.05.8", "gpu,shard", True), ("22.05.8", "gpu", False), ("24.11.5", "gpu,shard", False),
])
def test_a_controller_on_slurm_2205_with_shards_is_told_of_the_gpu_conflict_defect(version: str, gres_types: str,
                                                                                   noted: bool) -> None:
    config = {"SLURM_VERSION": version, "GresTypes": gres_types}
    findings = doc.run_checks(env(privileges=lambda f: dict(CONTROLLER_CAN), slurm_config=lambda: config),
                              "controller", None, None)
    notes = [f for f in findings if f.check == "gpu sharing"]
    assert [f.ok for f in notes] == ([True] if noted else [])
    assert not noted or ("gpu_conflict_memory_pct" in notes[0].detail and "share=no" in notes[0].detail)
    agent = doc.run_checks(env(slurm_config=lambda: config), "agent", None, None)
    assert all(f.check != "gpu sharing" for f in agent)


@pytest.mark.parametrize(("tres", "gres_types", "missing"), [
    ("cpu,mem,energy,node,billing,fs/disk,vmem,pages", "gpu", "gres/gpu"),  # Slurm's default
    ("cpu,mem,gres/gpu", "gpu,shard", "gres/shard"),
    ("cpu,mem", "gpu,shard", "gres/gpu, gres/shard"),
    ("cpu,mem,gres/gpu,gres/gpumem,gres/gpuutil", "gpu", None),
    ("cpu,mem,gres/gpu:a100,gres/gpu:t4,gres/shard:a100", "gpu,shard", None),  # typed alone record them too
    ("cpu,mem,gres/gpumem", "gpu", "gres/gpu"),  # gres/gpumem is not gres/gpu
])
def test_a_controller_whose_slurmdbd_records_no_gpu_allocation_fails(tres: str, gres_types: str,
                                                                    missing: str | None) -> None:
    # Reports, replays of the history and the learner count GPUs from recorded allocations:
    # on Slurm's default every job read as a CPU job, and the learner wrote 0 entries, silently.
    config = {"SLURM_VERSION": "24.11.5", "GresTypes": gres_types, "AccountingStorageTRES": tres}
    findings = doc.run_checks(env(privileges=lambda f: dict(CONTROLLER_CAN), slurm_config=lambda: config),
                              "controller", None, None)
    [check] = [f for f in findings if f.check == "gpu accounting"]
    assert check.ok is (missing is None)
    if missing:
        assert f"does not name {missing}" in check.detail and "AccountingStorageTRES" in check.fix
    assert all(f.check != "gpu accounting" for f in doc.run_checks(env(slurm_config=lambda: config), "agent", None, None))



def test_the_mariadb_clock_read_is_exact_in_a_dst_fold(mariadb: DatabaseServer) -> None:
    # 2026-10-25 01:30:00.25 UTC is 02:30 CET in Berlin, a local hour that happens twice:
    # UNIX_TIMESTAMP(NOW(6)) read it as the CEST one, 3,600 s early, and doctor then told a
    # right clock to fix itself. The session's clock is pinned there with SET timestamp.
    factory = open_database(mariadb.create_database())
    engine = factory.kw["bind"]
    with engine.connect() as connection:
        try:
            connection.execute(text("SET time_zone = 'Europe/Berlin'"))
        except OperationalError:
            pytest.skip("MariaDB has no named time zones loaded (slurm-aigc cluster up loads them)")
    engine.dispose()

    @event.listens_for(engine, "connect")
    def in_the_fold(dbapi_connection: Any, record: object) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("SET time_zone = 'Europe/Berlin'")
        cursor.execute("SET timestamp = 1792891800.25")
        cursor.close()

    assert server_time(factory) == pytest.approx(1792891800.25, abs=1e-3)


def test_a_host_running_both_daemons_keeps_the_agents_url_from_the_controller(tmp_path: Path) -> None:
    # With one shared EnvironmentFile, the agent's SLURM_AIGC_DB_URL_FILE line (deploy.md step 4)
    # pointed a controller on the same host at the agents' account and its slurm-owned file.
    shared, agent_only = tmp_path / "slurm-aigc", tmp_path / "slurm-aigc-agent"
    shared.write_text("SLURM_AIGC_CONFIG=/etc/slurm-aigc/slurm-aigc.yaml\n", encoding="utf-8")
    agent_only.write_text(f"SLURM_AIGC_DB_URL_FILE={agent_url_file(tmp_path)}\n", encoding="utf-8")
    files = {"agent": [str(shared), str(agent_only)], "controller": [str(shared), str(tmp_path / "slurm-aigc-controller")]}
    opened: list[str | None] = []
    checked = env(environ={}, environment_files=lambda role: files[role], open_db=lambda url: opened.append(url),
                  default_url=lambda: "mysql+pymysql://aigc_controller:pw@db1/slurm_aigc")
    doc.run_checks(checked, "agent", None, None)
    doc.run_checks(checked, "controller", None, None)
    assert opened == [AGENT_URL, "mysql+pymysql://aigc_controller:pw@db1/slurm_aigc"]
