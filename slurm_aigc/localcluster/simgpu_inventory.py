"""Writes each node's simulated-GPU inventory (the contract in docs/architecture.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from slurm_aigc.localcluster.shape import ClusterShape, NodeSpec


def node_inventory(node: NodeSpec) -> dict[str, object]:
    gpus = [
        {
            "index": index,
            "uuid": _uuid(node.name, index),
            "name": node.gpu.nvml_name,
            "memory_total_mib": node.gpu.memory_gib * 1024,
            "power_limit_w": node.gpu.power_limit_w,
            "idle_power_w": node.gpu.idle_power_w,
            "nvlink_peers": [peer for peer in range(node.gpu_count) if peer != index] if node.gpu.nvlink else [],
        }
        for index in range(node.gpu_count)
    ]
    return {"node": node.name, "driver_version": "sim-550.54.15", "gpus": gpus, "topology": _topology_text(node)}


def _uuid(node: str, index: int) -> str:
    digest = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _topology_text(node: NodeSpec) -> str:
    try:
        from slurm_aigc.telemetry.simgpu import sim_topology_text
    except ImportError:
        return ""
    return str(sim_topology_text(node.gpu_count, node.gpu.nvlink))


def write_inventories(shape: ClusterShape, simgpu_dir: Path) -> None:
    for node in shape.nodes:
        directory = simgpu_dir / node.name
        (directory / "procs").mkdir(parents=True, exist_ok=True)
        (directory / "procs").chmod(0o1777)  # jobs of every user write their own process files
        temporary = directory / "inventory.json.tmp"
        temporary.write_text(json.dumps(node_inventory(node), indent=1))
        temporary.replace(directory / "inventory.json")
