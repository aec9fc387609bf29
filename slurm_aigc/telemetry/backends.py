"""Choosing a GPU backend: real NVML or simulated GPUs, both behind `records.GpuBackend`.

Above both boundaries (`nvml.py`, `simgpu.py`), which no longer import each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from slurm_aigc.telemetry.nvml import NvmlBackend
from slurm_aigc.telemetry.records import GpuBackend
from slurm_aigc.telemetry.simgpu import SimGpuBackend


def open_backend(kind: Literal["nvml", "sim"], node: str, simgpu_dir: Path | None = None) -> GpuBackend:
    """The backend named by the agent config: real NVML, or simulated GPUs for `node`.

    NVML is started here, so a missing library or driver is NvmlUnavailableError at
    start-up rather than at the first poll.
    """
    if kind == "sim":
        return SimGpuBackend(node, simgpu_dir)
    if kind == "nvml":
        backend = NvmlBackend(node)
        backend.start()
        return backend
    raise ValueError(f"unknown GPU backend {kind!r} (use nvml or sim)")
