"""The one per-GPU time series of a job, read by the reclaim detectors and the job report (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of one GPU held by a job (a `job_gpu_samples` row); None = not read."""

    ts: float
    sm_util_pct: float | None
    memory_used_mib: float | None
    power_draw_w: float | None = None
    power_limit_w: float | None = None


@dataclass(frozen=True)
class GpuSeries:
    """The samples of one GPU (node, index) of a job, oldest first."""

    node: str
    gpu_index: int
    samples: tuple[Sample, ...]

    @property
    def peak_memory_mib(self) -> float | None:
        """The most memory any sample saw in use; None when no sample read it."""
        values = [s.memory_used_mib for s in self.samples if s.memory_used_mib is not None]
        return max(values) if values else None
