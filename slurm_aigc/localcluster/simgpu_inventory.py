"""Writes each node's simulated-GPU inventory (the contract in docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

from slurm_aigc.localcluster.shape import ClusterShape
from slurm_aigc.telemetry.simgpu import sim_gpus, sim_topology_text, write_inventory


def write_inventories(shape: ClusterShape, simgpu_dir: Path) -> None:
    """One inventory per node, GPU indices matching the gres.conf device files."""
    for node in shape.nodes:
        gpus = sim_gpus(node.name, node.gpu.gres_type, node.gpu_count, node.gpu.nvlink)
        write_inventory(simgpu_dir, node.name, gpus, sim_topology_text(node.gpu_count, node.gpu.nvlink))
