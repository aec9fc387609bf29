"""The cluster's shape: which nodes, with which simulated GPUs (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_aigc.errors import ClusterError


@dataclass(frozen=True)
class GpuModel:
    """How Slurm sees a simulated GPU type (its NVML side is telemetry.simgpu.SIM_GPU_MODELS)."""

    gres_type: str
    memory_gib: int  # as marketed (80 GB, 16 GB): sets shards per GPU
    nvlink: bool


GPU_MODELS: dict[str, GpuModel] = {
    "a100": GpuModel("a100", 80, True),
    "h100": GpuModel("h100", 80, True),
    "l40s": GpuModel("l40s", 48, False),
    "t4": GpuModel("t4", 16, False),
}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpu: GpuModel
    gpu_count: int
    cpus: int
    port: int

    @property
    def shards_per_gpu(self) -> int:
        # One shard per GiB: a `shard:N` request then guarantees N GiB on any GPU type.
        return self.gpu.memory_gib


@dataclass(frozen=True)
class ClusterShape:
    nodes: tuple[NodeSpec, ...]

    @property
    def gpu_types(self) -> tuple[GpuModel, ...]:
        seen: dict[str, GpuModel] = {}
        for node in self.nodes:
            seen.setdefault(node.gpu.gres_type, node.gpu)
        return tuple(seen.values())

    @property
    def total_gpus(self) -> int:
        return sum(node.gpu_count for node in self.nodes)


DEFAULT_SHAPE = "a100:8x2,t4:4x2"
_PART_RE = re.compile(r"^(?P<type>[a-z0-9]+):(?P<gpus>\d+)x(?P<nodes>\d+)$")


def parse_shape(text: str, first_port: int = 17001, cpus_per_node: int = 32) -> ClusterShape:
    """`a100:8x2,t4:4x2` = 2 nodes of 8 a100 and 2 nodes of 4 t4 -> nodes a100-01.. t4-02."""
    nodes: list[NodeSpec] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        match = _PART_RE.match(part)
        if not match:
            raise ClusterError(f"cluster shape part {part!r} is not TYPE:GPUSxNODES (e.g. a100:8x2)")
        gpu_type = match["type"]
        if gpu_type not in GPU_MODELS:
            raise ClusterError(f"cluster shape: unknown GPU type {gpu_type!r}; known: {', '.join(GPU_MODELS)}")
        count, node_count = int(match["gpus"]), int(match["nodes"])
        if not 1 <= count <= 16:
            raise ClusterError(f"cluster shape part {part!r}: 1 to 16 GPUs per node")
        for _ in range(node_count):
            index = sum(1 for n in nodes if n.gpu.gres_type == gpu_type) + 1
            nodes.append(NodeSpec(f"{gpu_type}-{index:02d}", GPU_MODELS[gpu_type], count, cpus_per_node, first_port + len(nodes)))
    if not 1 <= len(nodes) <= 64:
        raise ClusterError(f"cluster shape {text!r} has {len(nodes)} nodes; 1 to 64 are supported")
    return ClusterShape(tuple(nodes))


def shape_to_text(shape: ClusterShape) -> str:
    """The inverse of parse_shape (node groups in order)."""
    groups: list[tuple[str, int, int]] = []
    for node in shape.nodes:
        if groups and groups[-1][0] == node.gpu.gres_type and groups[-1][1] == node.gpu_count:
            kind, gpus, count = groups[-1]
            groups[-1] = (kind, gpus, count + 1)
        else:
            groups.append((node.gpu.gres_type, node.gpu_count, 1))
    return ",".join(f"{kind}:{gpus}x{count}" for kind, gpus, count in groups)
