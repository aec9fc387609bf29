"""Report records: one job's GPU sample slices and audit events, as figures and renderers read them.

Pure data and the one rule that turns a GPU's samples into slices with durations; the
store (`report/samples.py`) fills them from the database, the figures and renderers only
read them. The agents write one `job_gpu_samples` row per job, GPU and poll. A sample stands
for the time until the next poll of that GPU; a gap longer than `GAP_FACTOR` poll intervals
(the agent was down) counts as unknown, never as used or idle time.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from slurm_aigc.policy.model import DEFAULT_AGENT_INTERVAL_S

# A lone sample stands for one poll: the agent's default `agent.interval_s` (the one default, in the model).
DEFAULT_INTERVAL_S = DEFAULT_AGENT_INTERVAL_S
GAP_FACTOR = 3.0


@dataclass(frozen=True)
class SampleSlice:
    """One sample of one job's GPU and the seconds it stands for."""

    job_id: str
    node: str
    gpu_index: int
    ts: float
    duration_s: float
    sm_util_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    # The GPU's power at the poll (shared by every job on it); None from rollups and where NVML has none.
    power_draw_w: float | None = None
    power_limit_w: float | None = None

    @property
    def used_gpu_s(self) -> float | None:
        """GPU-seconds of work: utilization × duration (None when utilization is unknown)."""
        return None if self.sm_util_pct is None else self.sm_util_pct / 100.0 * self.duration_s


@dataclass(frozen=True)
class ActionEvent:
    """One row of the `actions` audit table, as reports show it."""

    job_id: str
    ts: float
    verdict: str
    action: str
    state: str
    dry_run: bool
    detail: str
    gpus_before: int | None
    gpus_after: int | None
    gpu_hours_recovered: float | None

    @property
    def effective(self) -> bool:
        """Counted in figures: it happened (done) and was not a dry run."""
        return self.state == "done" and not self.dry_run


_Row = tuple[str, str, int, float, float | None, float | None, float | None]
_RowWithPower = tuple[str, str, int, float, float | None, float | None, float | None, float | None, float | None]


def slices(raw: Sequence[_Row | _RowWithPower], default_interval_s: float = DEFAULT_INTERVAL_S) -> list[SampleSlice]:
    """Turn one GPU's samples of one job, sorted by time, into slices with durations.

    A row is (job, node, gpu, ts, util, memory used, memory total[, power draw, power limit]).
    """
    times = [row[3] for row in raw]
    gaps = [b - a for a, b in pairwise(times) if b > a]
    interval_s = statistics.median(gaps) if gaps else default_interval_s
    result: list[SampleSlice] = []
    for index, row in enumerate(raw):
        job_id, node, gpu_index, ts, util, mem_used, mem_total = row[:7]
        power: float | None = row[7] if len(row) == 9 else None  # type: ignore[misc]
        limit: float | None = row[8] if len(row) == 9 else None  # type: ignore[misc]
        gap = times[index + 1] - ts if index + 1 < len(times) else interval_s
        duration_s = gap if 0 <= gap <= GAP_FACTOR * interval_s else interval_s
        result.append(SampleSlice(job_id, node, gpu_index, ts, duration_s, util, mem_used, mem_total, power, limit))
    return result
