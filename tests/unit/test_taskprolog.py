"""The shipped TaskProlog (daemon/slurm-aigc-taskprolog) and PyTorch wrapper (daemon/slurm-aigc-torchlimit)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_aigc.shipped import TASK_PROLOG, TORCH_LIMIT, shipped_file

# The gres.conf `slurm-aigc cluster up` writes: one shard line per GPU, 80 shards (GiB) on an a100.
GRES_CONF = """\
AutoDetect=off
NodeName=a100-01 Name=gpu Type=a100 File=/dev/nvidia0
NodeName=a100-01 Name=shard Count=80 File=/dev/nvidia0
NodeName=a100-01 Name=shard Count=80 File=/dev/nvidia1
NodeName=t4-[01-02] Name=shard Count=64 File=/dev/nvidia[0-3]   # 16 per GPU
"""


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "gres.conf").write_text(GRES_CONF)
    full = {"PATH": os.environ.get("PATH", ""), "SLURM_CONF": str(tmp_path / "slurm.conf"), **env}
    return subprocess.run([sys.executable, str(shipped_file(TASK_PROLOG))], env=full, capture_output=True,
                          text=True, timeout=30, check=False)


def exports(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    assert all(line.startswith("export ") for line in result.stdout.splitlines())
    pairs = (line.removeprefix("export ").partition("=") for line in result.stdout.splitlines())
    return {name: value for name, _, value in pairs}


def test_shipped_and_executable() -> None:
    for name in (TASK_PROLOG, TORCH_LIMIT):
        assert shipped_file(name).stat().st_mode & stat.S_IXUSR


def test_a_shard_job_gets_its_share_of_the_gpu(tmp_path: Path) -> None:
    # 22.05's task environment of `--gres=shard:20` on a100-01 (SLURM_SHARDS_ON_NODE measured).
    found = exports(run(tmp_path, SLURM_SHARDS_ON_NODE="20", SLURMD_NODENAME="a100-01", CUDA_VISIBLE_DEVICES="0"))
    assert found == {"SLURM_AIGC_GPU_MEM_FRACTION": "0.25", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25",
                     "SLURM_AIGC_VLLM_GPU_MEMORY_UTILIZATION": "0.25"}


def test_node_ranges_and_device_ranges_of_gres_conf(tmp_path: Path) -> None:
    found = exports(run(tmp_path, SLURM_SHARDS_ON_NODE="4", SLURMD_NODENAME="t4-02"))
    assert found["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"  # 4 of 16 shards


@pytest.mark.parametrize("env", [
    {"SLURMD_NODENAME": "a100-01", "CUDA_VISIBLE_DEVICES": "0,1"},  # whole GPUs: theirs, nothing to say
    {"SLURM_SHARDS_ON_NODE": "20", "SLURMD_NODENAME": "l4-09"},  # node not in gres.conf
    {"SLURM_SHARDS_ON_NODE": "twenty", "SLURMD_NODENAME": "a100-01"},
    {"SLURM_SHARDS_ON_NODE": "0", "SLURMD_NODENAME": "a100-01"},
])
def test_nothing_when_not_a_shard_job_or_unknown(tmp_path: Path, env: dict[str, str]) -> None:
    assert exports(run(tmp_path, **env)) == {}


def test_a_lower_user_value_is_kept_a_higher_one_is_not(tmp_path: Path) -> None:
    found = exports(run(tmp_path, SLURM_SHARDS_ON_NODE="40", SLURMD_NODENAME="a100-01",
                        XLA_PYTHON_CLIENT_MEM_FRACTION="0.2", SLURM_AIGC_VLLM_GPU_MEMORY_UTILIZATION="0.9"))
    assert found["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2"
    assert found["SLURM_AIGC_VLLM_GPU_MEMORY_UTILIZATION"] == "0.5"


def test_missing_gres_conf_prints_nothing_and_exits_0(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(shipped_file(TASK_PROLOG))], capture_output=True, text=True,
                            timeout=30, check=False, env={"SLURM_CONF": str(tmp_path / "none" / "slurm.conf"),
                                                          "SLURM_SHARDS_ON_NODE": "8", "SLURMD_NODENAME": "a100-01"})
    assert (result.returncode, result.stdout) == (0, "") and "gres.conf" in result.stderr


def test_a_shards_per_gpu_file_overrides_gres_conf(tmp_path: Path) -> None:
    (tmp_path / "per-gpu").write_text("40\n")
    found = exports(run(tmp_path, SLURM_SHARDS_ON_NODE="10", SLURMD_NODENAME="a100-01",
                        SLURM_AIGC_SHARDS_PER_GPU_FILE=str(tmp_path / "per-gpu")))
    assert found["SLURM_AIGC_GPU_MEM_FRACTION"] == "0.25"


FAKE_TORCH = """\
calls = []
class cuda:
    @staticmethod
    def is_available(): return True
    @staticmethod
    def device_count(): return 2
    @staticmethod
    def set_per_process_memory_fraction(share, device): calls.append((share, device))
"""


def test_the_torch_wrapper_caps_every_device_then_runs_the_script(tmp_path: Path) -> None:
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / "train.py").write_text("import sys, torch\nprint(torch.calls, sys.argv[1:], __name__)\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path), "SLURM_AIGC_GPU_MEM_FRACTION": "0.25"}
    done = subprocess.run([sys.executable, str(shipped_file(TORCH_LIMIT)), str(tmp_path / "train.py"), "--epochs", "3"],
                          env=env, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == "[(0.25, 0), (0.25, 1)] ['--epochs', '3'] __main__"
    env.pop("SLURM_AIGC_GPU_MEM_FRACTION")
    done = subprocess.run([sys.executable, str(shipped_file(TORCH_LIMIT)), str(tmp_path / "train.py")],
                          env=env, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == "[] [] __main__"
