"""`slurm-aigc topo show` and `slurm-aigc gpu-load` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_aigc.cli.main import cli
from slurm_aigc.errors import TopologyParseError
from slurm_aigc.telemetry.simgpu import sim_gpus, sim_topology_text, write_inventory

OWN_TOPO = Path(__file__).resolve().parents[1] / "fixtures" / "topo"
H100 = OWN_TOPO / "synthetic-dgx-h100-8gpu-4nic-nic-legend-ansi-esc-tabs.txt"


def test_topo_show_json_from_file() -> None:
    result = CliRunner().invoke(cli, ["topo", "show", "--input", str(H100), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert list(document) == ["gpus", "nics", "links", "nvlink_islands"]
    assert document["gpus"][4] == {"index": 4, "cpu_affinity": "56-111,168-223", "numa_affinity": "1"}
    assert document["nics"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert document["nvlink_islands"] == [list(range(8))]


def test_topo_show_reads_stdin_and_prints_a_table() -> None:
    result = CliRunner().invoke(cli, ["topo", "show", "--input", "-"], input=H100.read_text())
    assert result.exit_code == 0, result.output
    assert "GPU0" in result.output and "NV18" in result.output and "mlx5_3" in result.output
    assert "nvlink_islands: [[0, 1, 2, 3, 4, 5, 6, 7]]" in result.output


def test_topo_show_damaged_input_is_an_error() -> None:
    result = CliRunner().invoke(cli, ["topo", "show", "--input", str(OWN_TOPO / "damaged-asymmetric.txt")])
    assert isinstance(result.exception, TopologyParseError)
    assert "GPU0-GPU2" in str(result.exception)


def test_topo_show_live_from_the_sim_backend(tmp_path: Path) -> None:
    write_inventory(tmp_path, "t4-01", sim_gpus("t4-01", "t4", 4, nvlink=False), sim_topology_text(4, nvlink=False))
    argv = ["topo", "show", "--json", "--backend", "sim", "--node", "t4-01", "--simgpu-dir", str(tmp_path)]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["nvlink_islands"] == [[0], [1], [2], [3]]
    assert document["links"]["GPU0"]["GPU1"] == "PIX" and document["links"]["GPU1"]["GPU2"] == "SYS"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "busy", "--profile-spec", "idle:5"], "not both"),
        (["--mem", "lots"], "not a size"),
        (["--util", "150"], "150"),
        (["--profile", "sleepy"], "sleepy"),
    ],
)
def test_gpu_load_option_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["gpu-load", *args])
    assert result.exit_code == 2 and message in result.output


def test_gpu_load_without_gpus_explains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(cli, ["gpu-load", "--seconds", "1", "--simgpu-dir", str(tmp_path)])
    assert result.exception is not None and "no GPUs" in str(result.exception)
