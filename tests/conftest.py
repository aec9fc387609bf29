"""Shared fixtures: the session-scoped local cluster for integration tests."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.localcluster.shape import DEFAULT_SHAPE
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
    yield ClusterHandle(
        slurm=local.slurm,
        state_dir=local.state_dir,
        simgpu_dir=local.simgpu_dir,
        etc_dir=local.etc_dir,
        nodes=[node.name for node in shape.nodes],
        local=local,
    )


@pytest.fixture
def shared_dir() -> Path:
    """../shared (data we may read but not commit); tests skip when it is absent."""
    if not SHARED.is_dir():
        pytest.skip("../shared is absent")
    return SHARED
