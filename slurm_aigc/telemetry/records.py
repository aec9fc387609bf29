"""Typed, immutable GPU readings shared by the NVML and simulated backends.

`None` in any field means "not available" (the GPU or driver does not support it, or we
lack permission); it never means zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol


def utc_now() -> datetime:
    """The default clock of both backends (timezone-aware UTC)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a GPU (`nvidia-smi --query-compute-apps=pid,used_memory`)."""

    pid: int
    used_memory_mib: float | None
    sm_util_pct: float | None = None


@dataclass(frozen=True)
class NvLinkState:
    """State of one NVLink of a GPU (`nvidia-smi nvlink --status`)."""

    link: int
    active: bool


@dataclass(frozen=True)
class GpuReading:
    """One GPU in one poll (`nvidia-smi --query-gpu=index,uuid,name,memory.total,...`).

    A GPU that failed mid-poll has `lost=True`, `error` set, and whatever fields were
    read before the failure (usually only `index`).

    `mig` is True for a GPU in MIG mode (`nvidia-smi --query-gpu=mig.mode.current`). Its
    instances go to different jobs and are not measured one by one, so its utilization,
    memory used and processes are not available (None, ()): no job's use can be read from it.
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    sm_util_pct: float | None = None
    mem_bw_util_pct: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    nvlink: tuple[NvLinkState, ...] = ()
    lost: bool = False
    error: str | None = None
    mig: bool = False

    @property
    def active_nvlinks(self) -> int:
        """Number of NVLinks reported up."""
        return sum(1 for link in self.nvlink if link.active)


@dataclass(frozen=True)
class NodeReading:
    """All GPUs of one node at one instant (`ts` is timezone-aware UTC)."""

    node: str
    ts: datetime
    driver_version: str | None
    gpus: tuple[GpuReading, ...]

    def gpu(self, index: int) -> GpuReading | None:
        """The reading of GPU `index`, or None when the node has no such GPU."""
        return next((g for g in self.gpus if g.index == index), None)


class GpuBackend(Protocol):
    """What the agent polls: NVML on real nodes, `SimGpuBackend` on the local cluster."""

    def read(self) -> NodeReading:
        """One poll of every GPU of the node."""
        ...

    def topology_text(self) -> str | None:
        """The node's `nvidia-smi topo -m` text, or None when it cannot be had."""
        ...

    def close(self) -> None:
        """Release the backend (NVML shutdown); idempotent."""
        ...
