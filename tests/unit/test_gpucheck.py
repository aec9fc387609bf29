"""`slurm-aigc gpu-check` and scripts/gpu-check.sh against the fake machines and a fake nvidia-smi."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_aigc.cli.gpucheck import SMI_QUERY, LoadHandle, gpu_check, parse_smi_query, render, run_check
from slurm_aigc.errors import AigcError
from slurm_aigc.telemetry.nvml import NvmlBackend
from slurm_aigc.telemetry.records import GpuReading
from slurm_aigc.telemetry.simgpu import sim_topology_text
from tests.fakes.nvml import FakeMachine, FakeNvml, dgx_a100, field_unsupported, gpu_lost_mid_poll, pcie_l40s_x4

REPO = Path(__file__).resolve().parents[2]


def smi_query_text(machine: FakeMachine) -> str:
    """What `nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version` prints for it."""
    return "".join(f"{g.index}, {g.uuid}, {g.name}, {g.memory_total_mib:.0f}, {machine.driver_version}\n"
                   for g in machine.gpus)


def smi_runner(query: str, topo: str) -> object:
    def run(argv: Sequence[str]) -> str:
        if list(argv) == SMI_QUERY:
            return query
        assert list(argv) == ["nvidia-smi", "topo", "-m"], argv
        return topo
    return run


def check(machine: FakeMachine, query: str | None = None, topo: str | None = None, load: object = None,
          load_seconds: float = 1.0) -> tuple[list[str], str]:
    backend = NvmlBackend("n1", nvml=FakeNvml(machine))
    result = run_check(backend, smi_runner(query if query is not None else smi_query_text(machine),  # type: ignore[arg-type]
                                           topo or machine.topology or ""), load, load_seconds)  # type: ignore[arg-type]
    return result.mismatches, render(result)


@pytest.mark.parametrize("machine", [dgx_a100(), pcie_l40s_x4()], ids=lambda m: m.name)
def test_agreeing_machine_passes_and_shows_every_gpu(machine: FakeMachine) -> None:
    mismatches, table = check(machine)
    assert mismatches == []
    assert table.splitlines()[0].startswith("GPU  UUID")
    assert sum(1 for line in table.splitlines() if machine.gpus[0].uuid[:-3] in line) == len(machine.gpus)
    assert f"topo -m: {len(machine.gpus)} GPUs" in table and table.endswith("all agree with nvidia-smi")


def test_dgx_processes_appear_in_the_table() -> None:
    _, table = check(dgx_a100())
    # A lone process has no per-process SM (the backend asks only where processes share a GPU).
    assert any(line.endswith(" 4242:30720:-") for line in table.splitlines()) and "5001:12288:60 5002:8192:30" in table


def test_each_kind_of_disagreement_is_named() -> None:
    machine = dgx_a100()
    lines = smi_query_text(machine).splitlines()
    lines[2] = lines[2].replace("0002,", "0099,")          # uuid
    lines[3] = lines[3].replace("A100-SXM4-80GB", "H100")  # name
    lines[4] = lines[4].replace("81920", "81918")          # memory beyond 1 MiB
    lines[5] = lines[5].replace("550.54.15", "550.54.14")  # driver
    mismatches, table = check(machine, "\n".join(lines) + "\n")
    assert [m.split(":")[0] for m in mismatches] == ["GPU 2", "GPU 3", "GPU 4", "driver"]
    assert "uuid agent GPU-fake0000-0000-0000-0000-000000000002" in mismatches[0]
    assert "MISMATCH: GPU 4: memory.total agent 81920.0 MiB, nvidia-smi 81918 MiB" in table


def test_missing_gpu_lost_gpu_and_topology_count_are_mismatches() -> None:
    machine = gpu_lost_mid_poll(3)
    seven = "".join(smi_query_text(machine).splitlines(keepends=True)[:7])
    mismatches, _ = check(machine, seven, topo=sim_topology_text(4, nvlink=False))
    assert "GPU count: agent 8, nvidia-smi 7" in mismatches
    assert any(m.startswith("GPU 3: lost mid-poll") for m in mismatches)
    assert "GPU 7: not in nvidia-smi" in mismatches
    assert "topo -m: 4 GPUs, nvidia-smi --query-gpu 7" in mismatches


def test_half_a_mib_of_rounding_is_not_a_mismatch() -> None:
    machine = pcie_l40s_x4()
    gpus = tuple(replace(g, memory_total_mib=g.memory_total_mib + 0.4) for g in machine.gpus)
    assert check(replace(machine, gpus=gpus), smi_query_text(machine))[0] == []


def test_load_process_is_shown_with_memory_and_utilization() -> None:
    stopped: list[int] = []

    def load(gpu: GpuReading, seconds: float) -> LoadHandle:
        assert gpu.index == 0 and gpu.uuid == dgx_a100().gpus[0].uuid
        return 4242, lambda: stopped.append(4242)

    mismatches, table = check(dgx_a100(), load=load)
    assert mismatches == [] and stopped == [4242]
    assert "load: pid 4242 on GPU 0: 30720 MiB, SM 85 %" in table


def test_load_the_agent_never_sees_is_a_mismatch() -> None:
    def load(gpu: GpuReading, seconds: float) -> LoadHandle:
        return 99999, lambda: None

    mismatches, _ = check(dgx_a100(), load=load, load_seconds=0.2)
    assert mismatches == ["load pid 99999 never appeared on GPU 0 (another PID namespace?)"]


def test_load_without_utilization_sample_is_a_note() -> None:
    def load(gpu: GpuReading, seconds: float) -> LoadHandle:
        return 777, lambda: None

    # GPU 2 of field_unsupported holds 777 and another process, and its driver has no
    # per-process utilization: the one case left without an SM figure for the load.
    machine = field_unsupported()
    machine = replace(machine, gpus=(machine.gpus[2], *machine.gpus[:2], machine.gpus[3]))
    machine = replace(machine, gpus=tuple(replace(g, index=i) for i, g in enumerate(machine.gpus)))
    mismatches, table = check(machine, load=load, load_seconds=0.2)
    assert mismatches == [] and "note: load pid 777: no per-process utilization sample" in table


def test_unparsable_smi_line_is_quoted() -> None:
    with pytest.raises(AigcError, match="unexpected .*'0, GPU-x, only three'"):
        parse_smi_query("0, GPU-x, only three\n")


# ---------------------------------------------------------------- the script, end to end

def fake_smi_on_path(tmp_path: Path, machine: FakeMachine, query: str | None = None) -> dict[str, str]:
    (tmp_path / "query.txt").write_text(query if query is not None else smi_query_text(machine))
    (tmp_path / "topo.txt").write_text(machine.topology or "")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nif [ "$1" = topo ]; then cat {tmp_path}/topo.txt; else cat {tmp_path}/query.txt; fi\n')
    smi.chmod(0o755)
    bin_dir = str(Path(sys.executable).parent)
    # NVML is faked below the backend: the stub `pynvml` serves the named machine (tests/fakes/pynvml_stub).
    return dict(os.environ, PATH=f"{tmp_path}:{bin_dir}:/usr/bin:/bin", SLURM_AIGC_BIN=f"{bin_dir}/slurm-aigc",
                PYTHONPATH=f"{REPO / 'tests/fakes/pynvml_stub'}:{REPO}", AIGC_FAKE_NVML_MACHINE=machine.name)


def run_script(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts/gpu-check.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_script_passes_on_an_agreeing_fake_machine(tmp_path: Path) -> None:
    done = run_script(fake_smi_on_path(tmp_path, dgx_a100()), "--no-load")
    assert done.returncode == 0, done.stderr
    assert "all agree with nvidia-smi" in done.stdout and "note: load: skipped" in done.stdout


def test_script_fails_on_a_mismatch(tmp_path: Path) -> None:
    query = smi_query_text(dgx_a100()).replace("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", 1)
    done = run_script(fake_smi_on_path(tmp_path, dgx_a100(), query), "--no-load")
    assert done.returncode == 1
    assert "MISMATCH: GPU 0: name" in done.stdout and "1 mismatch(es)" in done.stderr


def test_script_without_nvidia_smi_says_so(tmp_path: Path) -> None:
    env = dict(os.environ, PATH="/usr/bin:/bin")
    done = run_script(env)
    assert done.returncode == 2 and "nvidia-smi not found" in done.stderr


def test_the_installed_command_has_no_test_switch() -> None:
    done = CliRunner().invoke(gpu_check, ["--fake-nvml", "dgx_a100", "--no-load"])
    assert done.exit_code == 2 and "No such option '--fake-nvml'" in done.output
