"""The node agent on named fake machines: samples stored per poll, processes attributed to
jobs, static features published (and re-published after Slurm forgot them), admin features
kept, Slurm outages survived; plus the `agent:` config section and the CLI in dry-run."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pynvml
import pytest
import yaml
from click.testing import CliRunner
from sqlalchemy import func, select

from slurm_aigc.db import (
    GpuSample,
    JobGpuSample,
    ProcessSample,
    open_database,
    transaction,
)
from slurm_aigc.errors import AigcError, ConfigError, DatabaseError
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.slurm import CommandResult, SlurmCli
from slurm_aigc.telemetry import agent as agent_module
from slurm_aigc.telemetry.agent import Agent, AgentOptions, PublishedTypes, build_agent, state_dir_from_env, static_features
from slurm_aigc.telemetry.attribution import job_gpu_usage
from slurm_aigc.telemetry.config import (
    AgentConfig,
    parse_agent_section,
)
from slurm_aigc.telemetry.metrics import NullMetrics
from slurm_aigc.telemetry.nvml import NvmlBackend
from slurm_aigc.telemetry.simgpu import sim_gpus, sim_topology_text, write_inventory
from slurm_aigc.telemetry.store import TelemetryStore
from slurm_aigc.telemetry.topology import parse_topo_matrix
from slurm_aigc.validation import Node
from tests.fakes import nvml as fakes
from tests.fakes.slurm import FakeNode, FakeSlurm

FIXED_TS = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
# dgx_a100(): pid 4242 on GPU0, pids 5001 and 5002 share GPU1.
PID_JOBS = {4242: "101", 5001: "102", 5002: "103"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def backend(machine: fakes.FakeMachine) -> NvmlBackend:
    return NvmlBackend("dgx-01", nvml=fakes.FakeNvml(machine), clock=lambda: FIXED_TS, smi=fakes.smi_runner(machine))


def islands(text: str) -> list[list[int]]:
    return parse_topo_matrix(text).nvlink_islands()


def make_agent(machine: fakes.FakeMachine, slurm: FakeSlurm, store: TelemetryStore | None, clock: Clock,
               **kwargs: object) -> Agent:
    def attribute(pids: Sequence[int]) -> Mapping[int, str | None]:
        return {pid: PID_JOBS.get(pid) for pid in pids}

    return Agent(
        "dgx-01", backend(machine), store, SlurmCli(runner=slurm), AgentConfig(feature_check_s=60.0),
        attribute=attribute, split_uses=job_gpu_usage, parse_islands=islands, clock=clock, **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def store(tmp_path: Path) -> TelemetryStore:
    return TelemetryStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"))


def count(store: TelemetryStore, table: type) -> int:
    with transaction(store._factory) as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


def test_static_features_of_named_machines() -> None:
    dgx = fakes.dgx_a100()
    assert static_features(backend(dgx).read(), islands(dgx.topology or "")) == ("a100", "nvlink", "nvlink8", "vram80g")
    box = fakes.pcie_l40s_x4()
    reading = NvmlBackend("box", nvml=fakes.FakeNvml(box), clock=lambda: FIXED_TS).read()
    assert static_features(reading, islands(box.topology or "")) == ("l40s", "vram48g")


def test_a_poll_stores_gpus_processes_and_per_job_rows(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("dgx-01", features=["ib"])])
    result = make_agent(fakes.dgx_a100(), slurm, store, Clock(), allocations=lambda _pid_jobs: {"101": [0, 7]}).tick()
    assert (result.gpus, result.lost, result.processes) == (8, 0, 3)
    assert count(store, GpuSample) == 8 and count(store, ProcessSample) == 3
    with transaction(store._factory) as session:
        procs = {p.pid: p.job_id for p in session.scalars(select(ProcessSample))}
        jobs = {(r.job_id, r.gpu_index): r for r in session.scalars(select(JobGpuSample))}
    assert procs == PID_JOBS
    assert set(jobs) == {("101", 0), ("101", 7), ("102", 1), ("103", 1)}
    assert jobs[("101", 7)].sm_util_pct == 0.0  # allocated, running nothing: the idle row reclaim needs
    assert jobs[("102", 1)].shared and jobs[("101", 0)].power_draw_w == 310.0
    assert jobs[("101", 0)].memory_total_mib == 81920.0


def test_a_lost_gpu_is_stored_as_lost_and_the_poll_goes_on(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("dgx-01")])
    result = make_agent(fakes.gpu_lost_mid_poll(3), slurm, store, Clock()).tick()
    assert result.lost == 1 and result.gpus == 8
    with transaction(store._factory) as session:
        lost = [s.gpu_index for s in session.scalars(select(GpuSample).where(GpuSample.lost.is_(True)))]
    assert lost == [3]


def test_features_published_once_merged_and_republished_after_slurm_forgot(store: TelemetryStore) -> None:
    node = FakeNode("dgx-01", features=["ib", "rack7"])
    slurm, clock = FakeSlurm([node]), Clock()
    agent = make_agent(fakes.dgx_a100(), slurm, store, clock)

    assert agent.tick().published == ("ib", "rack7", "a100", "nvlink", "nvlink8", "vram80g")
    assert node.features == ["ib", "rack7", "a100", "nvlink", "nvlink8", "vram80g"]
    assert agent.tick().published is None and len(slurm.updates()) == 1

    SlurmCli(runner=slurm).reconfigure()  # Slurm forgets `scontrol update`
    clock.now += 30
    agent.tick()
    assert node.features == ["ib", "rack7"]  # not yet checked again
    clock.now += 31
    agent.tick()
    assert node.features == ["ib", "rack7", "a100", "nvlink", "nvlink8", "vram80g"]
    # The agent role may only add samples: the agent never writes node_publications.
    assert store.publications("dgx-01") == []


def test_stale_static_features_are_replaced_admin_ones_kept(store: TelemetryStore) -> None:
    node = FakeNode("dgx-01", features=["v100", "vram32g", "fast"])  # the node was re-fitted
    slurm = FakeSlurm([node])
    make_agent(fakes.dgx_a100(), slurm, store, Clock()).tick()
    assert node.features == ["fast", "a100", "nvlink", "nvlink8", "vram80g"]


def test_a_slurm_outage_does_not_stop_sampling(store: TelemetryStore) -> None:
    node = FakeNode("dgx-01")
    slurm = FakeSlurm([node])
    slurm.down = True
    agent = make_agent(fakes.dgx_a100(), slurm, store, Clock())
    assert agent.tick().published is None
    assert count(store, GpuSample) == 8
    slurm.down = False
    assert agent.tick().published is not None  # retried on the next tick, not after feature_check_s


def test_a_database_outage_does_not_stop_publishing(store: TelemetryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode("dgx-01", features=["ib"])
    slurm, clock = FakeSlurm([node]), Clock()
    agent = make_agent(fakes.dgx_a100(), slurm, store, clock)
    agent.tick()
    SlurmCli(runner=slurm).reconfigure()  # Slurm forgets the static features ...

    def database_down(*_args: object) -> int:
        raise DatabaseError("database error: connection refused")

    monkeypatch.setattr(store, "write_poll", database_down)  # ... while the database is down
    clock.now += 61
    with pytest.raises(DatabaseError, match="connection refused"):  # the tick fails as before: the loop backs off
        agent.tick()
    assert node.features == ["ib", "a100", "nvlink", "nvlink8", "vram80g"]


def test_dry_run_changes_nothing(store: TelemetryStore) -> None:
    node = FakeNode("dgx-01", features=["ib"])
    slurm = FakeSlurm([node])
    agent = make_agent(fakes.dgx_a100(), slurm, None, Clock(), dry_run=True)
    assert agent.tick().published is not None
    assert agent.tick().published is None  # logged once
    assert slurm.updates() == [] and node.features == ["ib"]


def test_publishing_off_and_unknown_topology() -> None:
    slurm = FakeSlurm([FakeNode("dgx-01")])
    machine = fakes.dgx_a100()

    def broken(_text: str) -> list[list[int]]:
        return parse_topo_matrix("GPU0\tGPU1\nnot a matrix").nvlink_islands()

    agent = Agent("dgx-01", backend(machine), None, SlurmCli(runner=slurm), AgentConfig(),
                  attribute=lambda pids: {}, split_uses=job_gpu_usage, parse_islands=broken)
    assert agent.tick().published == ("a100", "vram80g")  # no nvlink features without a topology
    quiet = Agent("dgx-01", backend(machine), None, SlurmCli(runner=slurm), AgentConfig(publish_features=False),
                  attribute=lambda pids: {}, split_uses=job_gpu_usage, parse_islands=islands)
    assert quiet.tick().published is None


def test_what_a_reading_cannot_judge_is_kept_not_withdrawn() -> None:
    # A `topo -m` that failed at start says nothing of NVLink; a lost GPU nothing of its type:
    # the node's nvlink8 and a100/vram80g stay (before, the agent withdrew them).
    def broken(_text: str) -> list[list[int]]:
        return parse_topo_matrix("GPU0\tGPU1\nnot a matrix").nvlink_islands()

    slurm = FakeSlurm([FakeNode("dgx-01", features=["a100", "nvlink", "nvlink8", "vram80g", "ib"])])
    no_topology = Agent("dgx-01", backend(fakes.dgx_a100()), None, SlurmCli(runner=slurm), AgentConfig(),
                        attribute=lambda pids: {}, split_uses=job_gpu_usage, parse_islands=broken)
    no_topology.tick()
    assert set(slurm.nodes["dgx-01"].features) == {"a100", "nvlink", "nvlink8", "vram80g", "ib"}
    machine = fakes.dgx_a100()
    every_gpu_lost = replace(machine, gpus=tuple(replace(g, errors={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST})
                                                 for g in machine.gpus))
    lost = Agent("dgx-01", backend(every_gpu_lost), None, SlurmCli(runner=slurm), AgentConfig(),
                 attribute=lambda pids: {}, split_uses=job_gpu_usage, parse_islands=islands)
    lost.tick()
    assert set(slurm.nodes["dgx-01"].features) == {"a100", "nvlink", "nvlink8", "vram80g", "ib"}


# --------------------------------------------------------------------------- MIG


def test_mig_gpus_publish_mig_but_no_type_memory_class_or_nvlink() -> None:
    # A MIG GPU's memory goes to instances of 10-40 GB, and instances have no NVLink peers; the
    # type alone would let the hook's vram_fit send a vram=60G job to a 10 GB instance.
    all_mig = fakes.dgx_a100_mig(mig_gpus=tuple(range(8)))
    assert static_features(backend(all_mig).read(), islands(all_mig.topology or "")) == ("mig",)
    half = fakes.dgx_a100_mig()  # GPUs 0-3 in MIG mode, 4-7 whole
    assert static_features(backend(half).read(), islands(half.topology or "")) == (
        "a100", "mig", "nvlink", "nvlink4", "vram80g")


def test_enabling_mig_withdraws_type_memory_class_and_nvlink_and_disabling_withdraws_mig() -> None:
    node = FakeNode("dgx-01", features=["ib", "a100", "nvlink", "nvlink8", "vram80g"])
    make_agent(fakes.dgx_a100_mig(mig_gpus=tuple(range(8))), FakeSlurm([node]), None, Clock()).tick()
    assert node.features == ["ib", "mig"]
    make_agent(fakes.dgx_a100_mig(mig_gpus=()), FakeSlurm([node]), None, Clock()).tick()
    assert sorted(node.features) == ["a100", "ib", "nvlink", "nvlink8", "vram80g"]


def test_a_node_with_mig_gpus_reads_no_allocations(store: TelemetryStore, caplog: pytest.LogCaptureFixture) -> None:
    # Slurm's index 5 names a MIG instance there, not NVML's GPU 5 (whole and idle): read as NVML's,
    # it would give job 301 an idle row on a GPU it does not have.
    asked: list[Mapping[int, str | None]] = []

    def allocations(pid_jobs: Mapping[int, str | None]) -> Mapping[str, Sequence[int]]:
        asked.append(pid_jobs)
        return {"301": [5]}

    slurm = FakeSlurm([FakeNode("dgx-01")])
    agent = make_agent(fakes.dgx_a100_mig(), slurm, store, Clock(), allocations=allocations)
    with caplog.at_level(logging.WARNING):
        agent.tick()
        agent.tick()
    assert asked == []
    assert len([r for r in caplog.records if "allocations are not read" in r.getMessage()]) == 1
    with transaction(store._factory) as session:
        rows = {(r.job_id, r.gpu_index) for r in session.scalars(select(JobGpuSample))}
    assert rows == {("101", 4)}  # pid 4242 on whole GPU 4; nothing from the MIG GPUs
    make_agent(fakes.dgx_a100(), slurm, None, Clock(), allocations=allocations).tick()
    assert len(asked) == 1  # without MIG the allocations are read as before


# --------------------------------------------------------------------------- GPU types the agent published


def rtx_pro_box() -> fakes.FakeMachine:
    """4x a GPU whose type name is in no list (`rtxpro`), 97,887 MiB each (`vram96g`)."""
    gpus = tuple(fakes.FakeGpu(i, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887) for i in range(4))
    return fakes.FakeMachine("rtx_pro_box", gpus, topology=sim_topology_text(4, nvlink=False))


def recorded(state_dir: Path) -> object:
    return json.loads((state_dir / "published-types.dgx-01.json").read_text(encoding="utf-8"))


def test_an_unknown_gpu_type_is_withdrawn_after_a_restart(tmp_path: Path) -> None:
    node = FakeNode("dgx-01", features=["ib"])
    slurm = FakeSlurm([node])
    first = make_agent(rtx_pro_box(), slurm, None, Clock(), published_types=PublishedTypes(tmp_path, "dgx-01"))
    assert first.tick().published == ("ib", "rtxpro", "vram96g")
    assert recorded(tmp_path) == {"type_features": ["rtxpro"]}
    assert (tmp_path / "published-types.dgx-01.json").stat().st_mode & 0o777 == 0o600
    # The node is re-fitted with L40S GPUs and the agent starts again: only its record knows rtxpro.
    second = make_agent(fakes.pcie_l40s_x4(), slurm, None, Clock(), published_types=PublishedTypes(tmp_path, "dgx-01"))
    second.tick()
    assert node.features == ["ib", "l40s", "vram48g"]
    assert recorded(tmp_path) == {"type_features": ["l40s"]}


def test_the_type_is_recorded_before_the_update_that_adds_it(tmp_path: Path) -> None:
    # Whatever reaches Slurm is recorded first, so a crash right after the update leaves nothing
    # the next run cannot withdraw; an update that failed leaves a recorded name Slurm lacks.
    node = FakeNode("dgx-01", features=["ib"])
    slurm = FakeSlurm([node], fail={"scontrol update": "slurm_update error: Socket timed out on send/recv"})
    agent = make_agent(rtx_pro_box(), slurm, None, Clock(), published_types=PublishedTypes(tmp_path, "dgx-01"))
    assert agent.tick().published is None and node.features == ["ib"]
    assert recorded(tmp_path) == {"type_features": ["rtxpro"]}
    slurm.fail.clear()
    assert agent.tick().published == ("ib", "rtxpro", "vram96g")
    assert recorded(tmp_path) == {"type_features": ["rtxpro"]}


def test_features_an_admin_set_that_look_like_gpu_types_are_never_removed(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    admin = ["rtxpro", "b300", "graphics", "ib"]
    node = FakeNode("dgx-01", features=list(admin))
    slurm = FakeSlurm([node])
    make_agent(fakes.dgx_a100(), slurm, None, Clock(), published_types=PublishedTypes(tmp_path, "dgx-01")).tick()
    assert node.features == [*admin, "a100", "nvlink", "nvlink8", "vram80g"]
    # A record that cannot be read names nothing: what it named stays on the node.
    (tmp_path / "published-types.dgx-01.json").write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        make_agent(fakes.pcie_l40s_x4(), slurm, None, Clock(), published_types=PublishedTypes(tmp_path, "dgx-01")).tick()
    assert set(admin) <= set(node.features) and "a100" not in node.features
    assert any("ignoring" in r.getMessage() for r in caplog.records)


def test_a_record_keeps_only_type_names_and_a_dry_run_writes_none(tmp_path: Path) -> None:
    path = tmp_path / "published-types.dgx-01.json"
    path.write_text(json.dumps({"type_features": ["rtxpro", "vram80g x", 3, "ib,rack7"]}), encoding="utf-8")
    assert PublishedTypes(tmp_path, "dgx-01").names == {"rtxpro"}
    path.unlink()
    node = FakeNode("dgx-01", features=["ib"])
    slurm = FakeSlurm([node])
    make_agent(rtx_pro_box(), slurm, None, Clock(), dry_run=True, published_types=PublishedTypes(tmp_path, "dgx-01")).tick()
    assert not path.exists() and node.features == ["ib"]


def test_the_state_directory_is_systemds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/slurm-aigc-agent:/var/lib/other")
    assert state_dir_from_env() == Path("/var/lib/slurm-aigc-agent")
    monkeypatch.delenv("STATE_DIRECTORY")
    assert state_dir_from_env() is None


# --------------------------------------------------------------------------- config


def test_agent_section_defaults_and_documented_yaml() -> None:
    parsed = parse_agent_section(Node("f.yaml", "agent", yaml.safe_load(shipped_policy().read_text())["agent"]))
    assert parsed == AgentConfig(simgpu_dir="/var/lib/slurm-aigc/simgpu")
    assert parsed.interval_s == 10.0 and parsed.backend == "nvml" and parsed.metrics_port is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"backend": "cuda"}, "agent.backend: expected one of nvml, sim"),
        ({"interval": 5}, "agent: unknown key(s) interval"),
        ({"interval_s": -1}, "agent.interval_s: expected a positive number"),
        ({"metrics_port": 70000}, "agent.metrics_port: expected a TCP port"),
        ({"publish_features": "yes"}, "agent.publish_features: expected true/false"),
    ],
)
def test_bad_agent_sections_name_file_and_key(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_agent_section(Node("etc/slurm-aigc.yaml", "agent", value))
    assert message in str(error.value) and str(error.value).startswith("etc/slurm-aigc.yaml: ")


# --------------------------------------------------------------------------- CLI


def test_cli_once_dry_run_on_simulated_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.cli.telemetry import agent as agent_command

    write_inventory(tmp_path, "simnode-x", sim_gpus("simnode-x", "t4", 4, nvlink=False), sim_topology_text(4, False))
    config = tmp_path / "aigc.yaml"
    config.write_text("agent:\n  backend: sim\n  interval_s: 5\n", encoding="utf-8")
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm tools: publishing logs a warning, sampling goes on
    result = CliRunner().invoke(agent_command, ["--config", str(config), "--node", "simnode-x",
                                                "--simgpu-dir", str(tmp_path), "--once", "--dry-run"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary == {"gpus": 4, "lost": 0, "node": "simnode-x", "processes": 0, "published": None, "rows_written": 0}


def test_cli_once_stores_samples_and_a_bad_config_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.cli.telemetry import agent as agent_command

    write_inventory(tmp_path, "simnode-y", sim_gpus("simnode-y", "a100", 8, nvlink=True), sim_topology_text(8, True))
    monkeypatch.setenv("PATH", str(tmp_path))
    db = tmp_path / "s.db"
    result = CliRunner().invoke(agent_command, ["--node", "simnode-y", "--backend", "sim", "--simgpu-dir", str(tmp_path),
                                                "--db", f"sqlite:///{db}", "--once", "--config", "/dev/null"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["rows_written"] == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  backend: cuda\n", encoding="utf-8")
    result = CliRunner().invoke(agent_command, ["--config", str(bad), "--once"])
    assert isinstance(result.exception, ConfigError) and "agent.backend" in str(result.exception)


# --------------------------------------------------------------------------- metrics


def test_prometheus_metrics_per_gpu_and_per_tick() -> None:
    from slurm_aigc.daemonloop import TickOutcome
    from slurm_aigc.telemetry.metrics import PrometheusMetrics

    metrics = PrometheusMetrics("agent")
    box = fakes.field_unsupported()
    reading = NvmlBackend("box", nvml=fakes.FakeNvml(box), clock=lambda: FIXED_TS).read()
    metrics.observe_reading(reading)
    labels = {"node": "box", "gpu": "2"}
    assert metrics.value("slurm_aigc_gpu_memory_used_mib", labels) == 9000.0
    assert metrics.value("slurm_aigc_gpu_power_draw_w", labels) is None  # not supported: no sample, not 0
    assert metrics.value("slurm_aigc_gpu_processes", labels) == 2.0  # 777 and 778 share GPU 2
    metrics.observe_tick(TickOutcome(0.25, ok=False, consecutive_failures=1))
    metrics.observe_tick(TickOutcome(0.05, ok=True, consecutive_failures=0))
    assert metrics.value("slurm_aigc_tick_errors_total", {"daemon": "agent"}) == 1.0
    assert metrics.value("slurm_aigc_tick_seconds_count", {"daemon": "agent"}) == 2.0


def test_agent_counts_its_publications_in_metrics(store: TelemetryStore) -> None:
    from slurm_aigc.telemetry.metrics import PrometheusMetrics

    metrics = PrometheusMetrics("agent")
    slurm = FakeSlurm([FakeNode("dgx-01")])
    agent = make_agent(fakes.dgx_a100(), slurm, store, Clock(), metrics=metrics)
    agent.tick()
    agent.tick()
    assert metrics.value("slurm_aigc_publications_total", {"node": "dgx-01"}) == 1.0
    assert metrics.value("slurm_aigc_gpu_sm_util_pct", {"node": "dgx-01", "gpu": "0"}) == 85.0


def test_command_line_overrides_the_file_and_env_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.telemetry.agent import AgentOptions, effective_config

    config = tmp_path / "site.yaml"
    config.write_text("classes: {}\nagent:\n  backend: sim\n  interval_s: 30\n  metrics_port: 9400\n", encoding="utf-8")
    monkeypatch.setenv("SLURM_AIGC_CONFIG", str(config))
    from_env = effective_config(AgentOptions())
    assert (from_env.backend, from_env.interval_s, from_env.metrics_port) == ("sim", 30.0, 9400)
    overridden = effective_config(AgentOptions(backend="nvml", interval_s=2.5, metrics_port=9500))
    assert (overridden.backend, overridden.interval_s, overridden.metrics_port) == ("nvml", 2.5, 9500)
    monkeypatch.setenv("SLURM_AIGC_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="missing.yaml: no such file"):
        effective_config(AgentOptions())


def test_the_shipped_policy_file_parses() -> None:
    shipped = Path(__file__).resolve().parents[2] / "etc" / "slurm-aigc.yaml"
    if not shipped.exists():
        pytest.skip("etc/slurm-aigc.yaml not written yet")
    from slurm_aigc.policy.loader import load_policy
    from slurm_aigc.telemetry.config import load_scoring_config

    assert load_policy(str(shipped), hook_sections=False).agent.interval_s > 0
    assert load_scoring_config(str(shipped)).weight_min < load_scoring_config(str(shipped)).weight_max


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5"])  # squeue --json / scontrol --json show job ID
def test_slurm_allocation_lookup_reads_this_nodes_gpus(version: str) -> None:
    from slurm_aigc.telemetry.agent import slurm_allocation_lookup
    from tests.fakes.slurm import FakeJob

    jobs = [FakeJob("7", "dgx-01", gres_detail="gpu:a100:2(IDX:0-1)"),
            FakeJob("8", "dgx-01", gres_detail="shard:10(IDX:3)"),
            FakeJob("9", "other", gres_detail="gpu:a100:1(IDX:0)")]
    slurm = FakeSlurm([FakeNode("dgx-01")], jobs, version=version)
    lookup = slurm_allocation_lookup(SlurmCli(runner=slurm), "dgx-01")
    assert (lookup("7"), lookup("8"), lookup("9")) == (frozenset({0, 1}), frozenset({3}), frozenset())
    assert len([call for call in slurm.calls if "--json" in call]) == 3  # one job-info RPC per lookup


def test_the_agent_keeps_the_active_features_a_node_features_plugin_chose() -> None:
    # node_features/helpers: the node booted in mode_a; mode_b is available, not active. The
    # agent's write must not make mode_b active (Slurm applies ActiveFeatures as written).
    node = FakeNode("dgx-01", features=["ib", "mode_a", "mode_b"])
    slurm = FakeSlurm([node])

    def runner(argv, timeout_s, stdin=None):  # type: ignore[no-untyped-def]
        answer = slurm(argv, timeout_s, stdin)
        if list(argv) == ["sinfo", "--json"]:
            document = json.loads(answer.stdout)
            for record in document["nodes"]:
                record["active_features"] = ",".join(f for f in record["features"].split(",") if f != "mode_b")
            answer = replace(answer, stdout=json.dumps(document))
        return answer

    Agent("dgx-01", backend(fakes.dgx_a100()), None, SlurmCli(runner=runner), AgentConfig(feature_check_s=60.0),
          attribute=lambda pids: {}, split_uses=job_gpu_usage, parse_islands=islands, clock=Clock()).tick()
    (update,) = [call for call in slurm.updates() if call[0] == "scontrol"]
    available = next(a for a in update if a.startswith("AvailableFeatures=")).split("=", 1)[1].split(",")
    active = next(a for a in update if a.startswith("ActiveFeatures=")).split("=", 1)[1].split(",")
    assert "mode_b" in available and "mode_b" not in active
    assert {"a100", "vram80g", "nvlink", "nvlink8"} <= set(active) and "mode_a" in active


# --------------------------------------------------------------------------- the node's Slurm name


class HostedSlurm(FakeSlurm):
    """FakeSlurm plus slurm.conf's NodeHostname per node, for `scontrol show aliases [HOST]`.

    scontrol prints the NodeNames of HOST (this host when none) on one line, nothing for a host
    slurm.conf does not name (22.05.8 on the local cluster: `a100-01 a100-02 t4-01 t4-02`).
    """

    def __init__(self, hosts: Mapping[str, str], this_host: str, nodes: Sequence[FakeNode], version: str = "24.11.5") -> None:
        super().__init__(nodes, version=version)
        self.hosts, self.this_host = dict(hosts), this_host

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        if list(argv[:3]) != ["scontrol", "show", "aliases"]:
            return super().__call__(argv, timeout_s, stdin)
        self.calls.append(list(argv))
        host = argv[3] if len(argv) > 3 else self.this_host
        names = " ".join(name for name, node_host in self.hosts.items() if node_host == host)
        return CommandResult(tuple(argv), 0, names + "\n" if names else "", "")

    def node_reads(self) -> list[list[str]]:
        return [call for call in self.calls if call[0] == "sinfo" or "node" in call]


def start_agent(fake: HostedSlurm, hostname: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Agent:
    """`build_agent` as `slurm-aigc agent --backend sim --dry-run` without --node, on host `hostname`."""
    monkeypatch.setattr(agent_module, "SlurmCli", lambda: SlurmCli(runner=fake))
    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    for name in fake.nodes:
        write_inventory(tmp_path, name, sim_gpus(name, "a100", 8, nvlink=True), sim_topology_text(8, True))
    config = AgentConfig(backend="sim", simgpu_dir=str(tmp_path))
    return build_agent(AgentOptions(dry_run=True), config, NullMetrics())


def test_without_node_the_agent_takes_the_name_slurm_conf_gives_its_host(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # NodeName=gpu001 NodeHostname=r3n17: `hostname -s` (r3n17) names no node.
    fake = HostedSlurm({"gpu001": "r3n17", "gpu002": "r3n18"}, "r3n17", [FakeNode("gpu001"), FakeNode("gpu002")])
    started = start_agent(fake, "r3n17.cluster.example", tmp_path, monkeypatch)
    assert started.node == "gpu001"
    assert fake.node_reads() == []  # slurm.conf said it: no slurmctld read at start
    result = started.tick()
    assert result.node == "gpu001" and result.published is not None and "a100" in result.published
    assert fake.node_reads() == [["scontrol", "-d", "--json", "show", "node", "gpu001"]]


def test_a_host_slurm_conf_names_by_its_full_name_is_found_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = HostedSlurm({"gpu001": "r3n17.cluster.example"}, "r3n17", [FakeNode("gpu001")])
    assert start_agent(fake, "r3n17.cluster.example", tmp_path, monkeypatch).node == "gpu001"
    asked = [call for call in fake.calls if "aliases" in call]
    assert asked == [["scontrol", "show", "aliases"], ["scontrol", "show", "aliases", "r3n17.cluster.example"]]
    assert fake.node_reads() == []


def test_a_host_running_several_nodes_must_be_told_its_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = HostedSlurm({"a100-01": "vm", "a100-02": "vm"}, "vm", [FakeNode("a100-01"), FakeNode("a100-02")])
    with pytest.raises(AigcError) as refused:
        start_agent(fake, "vm", tmp_path, monkeypatch)
    assert "host vm runs several Slurm nodes (a100-01 a100-02)" in str(refused.value)
    assert "--node NAME" in str(refused.value)


def test_a_host_with_no_slurm_node_fails_at_start_naming_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = HostedSlurm({"gpu001": "r3n17"}, "login5", [FakeNode("gpu001")])
    with pytest.raises(AigcError) as refused:
        start_agent(fake, "login5", tmp_path, monkeypatch)
    message = str(refused.value)
    assert message.startswith("no Slurm node for host login5: ") and "start the agent with --node NAME" in message
    assert len(fake.node_reads()) == 1  # at most one node read at start


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5"])
def test_a_dynamic_node_goes_by_its_host_name_after_one_node_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  version: str) -> None:
    # `slurmd -Z`: in no slurm.conf, registered under its host name.
    fake = HostedSlurm({}, "dyn-07", [FakeNode("dyn-07")], version=version)
    assert start_agent(fake, "dyn-07.cluster.example", tmp_path, monkeypatch).node == "dyn-07"
    assert len(fake.node_reads()) == 1


def test_a_node_given_with_node_is_taken_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = HostedSlurm({"a100-01": "vm", "a100-02": "vm"}, "vm", [FakeNode("a100-01"), FakeNode("a100-02")])
    monkeypatch.setattr(agent_module, "SlurmCli", lambda: SlurmCli(runner=fake))
    write_inventory(tmp_path, "a100-02", sim_gpus("a100-02", "a100", 8, nvlink=True), sim_topology_text(8, True))
    config = AgentConfig(backend="sim", simgpu_dir=str(tmp_path))
    assert build_agent(AgentOptions(node="a100-02", dry_run=True), config, NullMetrics()).node == "a100-02"
    assert [call for call in fake.calls if "aliases" in call] == []
