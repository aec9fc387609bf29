"""Simulated GPUs: inventory, process files, liveness, summing, backend selection."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_aigc.telemetry.backends import open_backend
from slurm_aigc.telemetry.nvml import NvmlBackend
from slurm_aigc.telemetry.simgpu import (
    GpuLoad,
    ProcLoad,
    SimGpuBackend,
    SimGpuError,
    default_simgpu_dir,
    parse_proc_load,
    sim_gpus,
    sim_topology_text,
    write_inventory,
    write_proc_load,
)
from slurm_aigc.telemetry.topology import parse_topo_matrix

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
NODE = "a100-01"


def fake_proc(root: Path, pid: int, start_ticks: int = 1000) -> None:
    """A /proc/<pid>/stat whose command name has spaces and parentheses, as real ones may."""
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    rest = " ".join(["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 10)
    (root / str(pid) / "stat").write_text(f"{pid} (python3 (gpu) load) {rest}\n")


@pytest.fixture
def simdir(tmp_path: Path) -> Path:
    directory = tmp_path / "simgpu"
    write_inventory(directory, NODE, sim_gpus(NODE, "a100", 8, nvlink=True), sim_topology_text(8, nvlink=True))
    return directory


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    return root


def backend(simdir: Path, proc_root: Path) -> SimGpuBackend:
    return SimGpuBackend(NODE, simdir, clock=lambda: T0, proc_root=proc_root)


def test_inventory_matches_the_architecture_contract(simdir: Path) -> None:
    document = json.loads((simdir / NODE / "inventory.json").read_text())
    assert set(document) == {"node", "driver_version", "gpus", "topology"}
    gpu = document["gpus"][3]
    assert set(gpu) == {"index", "uuid", "name", "memory_total_mib", "power_limit_w", "idle_power_w", "nvlink_peers"}
    assert gpu["index"] == 3 and gpu["nvlink_peers"] == [0, 1, 2, 4, 5, 6, 7] and gpu["uuid"].startswith("GPU-")
    assert (simdir / NODE / "procs").stat().st_mode & 0o7777 == 0o1777
    assert parse_topo_matrix(document["topology"]).nvlink_islands() == [list(range(8))]


def test_uuids_are_stable_and_distinct() -> None:
    first, again = sim_gpus(NODE, "a100", 8, True), sim_gpus(NODE, "a100", 8, True)
    assert [g.uuid for g in first] == [g.uuid for g in again]
    assert len({g.uuid for g in first + sim_gpus("a100-02", "a100", 8, True)}) == 16


def test_idle_node_reads_idle_power_and_no_processes(simdir: Path, proc_root: Path) -> None:
    reading = backend(simdir, proc_root).read()
    assert (reading.node, reading.ts, reading.driver_version) == (NODE, T0, "sim-550.54.15")
    gpu = reading.gpus[0]
    assert (gpu.sm_util_pct, gpu.memory_used_mib, gpu.power_draw_w, gpu.processes) == (0.0, 0.0, 55.0, ())
    assert gpu.active_nvlinks == 12


def test_processes_are_summed_capped_and_reported_with_their_pid(simdir: Path, proc_root: Path) -> None:
    fake_proc(proc_root, 101)
    fake_proc(proc_root, 102)
    write_proc_load(simdir, NODE, ProcLoad(101, (GpuLoad(0, 70.0, 50_000.0), GpuLoad(1, 70.0, 10_240.0)), "busy", "7", 1000))
    write_proc_load(simdir, NODE, ProcLoad(102, (GpuLoad(0, 60.0, 40_000.0, 0.5),), "busy", "8", 1000))
    reading = backend(simdir, proc_root).read()
    gpu0, gpu1 = reading.gpus[0], reading.gpus[1]
    assert gpu0.sm_util_pct == 100.0  # 70 + 60, capped
    assert gpu0.memory_used_mib == 81920.0  # 90000 MiB asked, capped at the total
    assert {p.pid for p in gpu0.processes} == {101, 102}
    # power: idle + (limit - idle) * min(1, 0.7 * 1.0 + 0.6 * 0.5) = 55 + 345 * 1.0
    assert gpu0.power_draw_w == 400.0
    assert gpu1.sm_util_pct == 70.0 and gpu1.power_draw_w == pytest.approx(55 + 345 * 0.7, abs=0.1)
    assert gpu1.processes[0].sm_util_pct == 70.0 and gpu1.processes[0].used_memory_mib == 10240.0


def test_hung_process_is_busy_but_cool(simdir: Path, proc_root: Path) -> None:
    fake_proc(proc_root, 200)
    write_proc_load(simdir, NODE, ProcLoad(200, (GpuLoad(4, 100.0, 8192.0, 0.15),), "hung"))
    gpu = backend(simdir, proc_root).read().gpus[4]
    assert gpu.sm_util_pct == 100.0 and gpu.power_draw_w == pytest.approx(55 + 345 * 0.15, abs=0.1)


def test_file_of_a_dead_process_is_ignored_and_removed(simdir: Path, proc_root: Path) -> None:
    path = write_proc_load(simdir, NODE, ProcLoad(999, (GpuLoad(0, 90.0, 1000.0),)))
    reading = backend(simdir, proc_root).read()
    assert reading.gpus[0].sm_util_pct == 0.0
    assert not path.exists()


def test_reused_pid_is_not_mistaken_for_the_old_process(simdir: Path, proc_root: Path) -> None:
    fake_proc(proc_root, 300, start_ticks=5555)
    path = write_proc_load(simdir, NODE, ProcLoad(300, (GpuLoad(0, 90.0, 1000.0),), start_ticks=1234))
    assert backend(simdir, proc_root).read().gpus[0].processes == ()
    assert not path.exists()


def test_malformed_process_file_is_skipped(simdir: Path, proc_root: Path) -> None:
    (simdir / NODE / "procs" / "12.json").write_text("{not json")
    assert backend(simdir, proc_root).read().gpus[0].sm_util_pct == 0.0


def test_lost_gpu_in_inventory_reads_as_lost(tmp_path: Path, proc_root: Path) -> None:
    gpus = sim_gpus("t4-01", "t4", 4, nvlink=False)
    from dataclasses import replace

    gpus[2] = replace(gpus[2], lost=True)
    write_inventory(tmp_path, "t4-01", gpus, sim_topology_text(4, nvlink=False))
    reading = SimGpuBackend("t4-01", tmp_path, proc_root=proc_root).read()
    assert reading.gpus[2].lost and reading.gpus[2].error
    assert not reading.gpus[1].lost and reading.gpus[1].nvlink == ()


def test_missing_inventory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SimGpuError, match="no simulated-GPU inventory for node ghost"):
        SimGpuBackend("ghost", tmp_path).read()


def test_topology_text_is_the_inventory_topology(simdir: Path, proc_root: Path) -> None:
    assert backend(simdir, proc_root).topology_text() == sim_topology_text(8, nvlink=True)


def test_proc_file_round_trip(simdir: Path) -> None:
    load = ProcLoad(42, (GpuLoad(1, 33.0, 2048.0, 0.4),), "loading", "99", 777)
    assert parse_proc_load(write_proc_load(simdir, NODE, load).read_text()) == load


def test_open_backend_selects_by_kind_and_starts_nvml(simdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    monkeypatch.setattr(NvmlBackend, "start", lambda self: started.append(self.node))
    assert isinstance(open_backend("sim", NODE, simdir), SimGpuBackend)
    assert isinstance(open_backend("nvml", NODE), NvmlBackend)
    assert started == [NODE]
    with pytest.raises(ValueError, match="unknown GPU backend"):
        open_backend("rocm", NODE)  # type: ignore[arg-type]


def test_one_simgpu_dir_default_for_the_agent_gpu_load_and_the_local_cluster(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from slurm_aigc.localcluster.manager import LocalCluster
    from slurm_aigc.policy.model import AgentConfig

    monkeypatch.delenv("SLURM_AIGC_SIMGPU_DIR", raising=False)
    assert default_simgpu_dir() == Path(AgentConfig().simgpu_dir)
    monkeypatch.setenv("SLURM_AIGC_SIMGPU_DIR", "")  # empty is unset, as for the policy, not the current directory
    assert default_simgpu_dir() == Path(AgentConfig().simgpu_dir)
    monkeypatch.setenv("SLURM_AIGC_SIMGPU_DIR", str(tmp_path))
    assert default_simgpu_dir() == tmp_path == LocalCluster(tmp_path / "state").simgpu_dir
