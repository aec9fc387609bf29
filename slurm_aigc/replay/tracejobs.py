"""What the trace readers (`replay/traces.py`) return and the generator reads: pure records."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceJob:
    """One trace record, in the trace's own time base (seconds).

    `arrival_s`: trace seconds (openb: from trace start; genai/philly: UNIX seconds of the
    timestamp read as UTC). `gpus`: whole GPUs requested (0 for CPU-only pods);
    `gpu_fraction`: share of one GPU for GPU-sharing pods (openb gpu_milli/1000), else 1.0.
    """

    source: str
    line: int
    job_id: str
    arrival_s: float
    duration_s: float
    gpus: int
    gpu_fraction: float = 1.0
    qos: str = ""
    status: str = ""
    group: str = ""
    model: str = ""
    request_type: str = ""
    images: int = 0
    steps: int = 0
    loras: int = 0


@dataclass(frozen=True)
class SkippedRow:
    """A row the reader could not use: file line number (header = 1) and why."""

    line: int
    reason: str


@dataclass(frozen=True)
class TraceRead:
    """What a reader returns: usable jobs (sorted by arrival) and the rows it skipped."""

    jobs: tuple[TraceJob, ...]
    skipped: tuple[SkippedRow, ...]
