"""`slurm-aigc doctor` with fakes: each broken piece gives a FAIL line with its fix and exit 1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from slurm_aigc.cli import doctor as doc
from slurm_aigc.db import open_database, probe_privileges, server_time
from slurm_aigc.errors import ConfigError, DatabaseError, NvmlUnavailableError
from tests.conftest import DatabaseServer

AGENT_CAN = {"add samples": True, "read samples": False, "write actions": False, "write publications": False,
             "update rows": False, "delete samples": False}
CONTROLLER_CAN = dict.fromkeys(AGENT_CAN, True)


def env(**changes: object) -> doc.DoctorEnv:
    healthy = doc.DoctorEnv(
        open_db=lambda url: object(), privileges=lambda factory: dict(AGENT_CAN), server_time=lambda f: 1000.0,
        slurm_config=lambda: {"SLURM_VERSION": "22.05.8", "Prolog": "/etc/slurm/prolog.sh",
                              "Epilog": "/etc/slurm/epilog.sh", "SlurmUser": "slurm(64030)", "GresTypes": "gpu,shard",
                              "AccountingStorageTRES": "cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu,gres/shard"},
        slurm_ping=lambda: True, slurm_admin_level=lambda: "Operator", nvml_gpus=lambda: 8,
        load_policy=lambda path: object(), read_text=lambda path: "exec slurm-aigc-jobrecord prolog\n",
        expand=lambda pattern: [pattern], clock=lambda: 1000.0, euid=lambda: 0,
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
                 euid=lambda: 1000, slurm_admin_level=lambda: "None")
    findings = failed(doc.run_checks(broken, "agent", None, None))
    assert set(findings) == {"prolog", "nvml", "policy", "slurm rights"}
    assert "docs/deploy.md" in findings["prolog"].fix and "adminlevel=Operator" in findings["slurm rights"].fix
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
