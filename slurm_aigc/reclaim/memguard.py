"""Pure memory guard: a shard job's own GPU memory against the GiB its shards promise.

Slurm's shards isolate nothing: a job granted `shard:20` on an 80-shard, 80 GiB GPU can
allocate all 80 GiB and make its neighbours fail with out-of-memory errors. The agent
attributes memory per process, so `job_gpu_samples.memory_used_mib` is the sum of this
job's own processes on that GPU (slurm_aigc.telemetry.attribution), never its neighbours':
the verdict is per job, and a memory hog cannot get a neighbour judged.

Per node, the job's memory at one poll is the sum over its GPUs there (one poll writes one
timestamp per node). The job is `over_memory` when the newest `samples_needed` polls in a
row are all above its limit (its shards on that node x GiB per shard, plus `allowance_mib`
for each of its GPUs there), without a gap longer than `gap_s` between them, the newest one
fresh. An unreadable reading (None/NaN) or a gap ends the run, so missing data never condemns
a job. There is no start-up grace: a job that overflows while loading harms its neighbours
just the same.

The allowance is there because the frameworks' memory fractions (the TaskProlog's exports)
cap their allocators, not the CUDA context each process holds besides: on an H200 (driver
580, benchmarks/bench_real_gpu.py) a PyTorch process holding 5 GiB showed 5.6 GiB in NVML, and
JAX told to take 5 % (7.0 GiB) showed 7.5 GiB. Without it, every job that obeys its limit
exactly would be requeued.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from slurm_aigc.reclaim.detect import JobWindow, Verdict
from slurm_aigc.series import GpuSeries
from slurm_aigc.units import MIB_PER_GIB

OVER_MEMORY = "over_memory"


def node_totals(series: Iterable[GpuSeries]) -> dict[str, list[tuple[float, float]]]:
    """Per node, (ts, the job's memory in MiB summed over its GPUs) sorted by time; NaN if any GPU unreadable."""
    totals: dict[str, dict[float, float]] = {}
    for gpu in series:
        per_ts = totals.setdefault(gpu.node, {})
        for sample in gpu.samples:
            value = math.nan if sample.memory_used_mib is None else sample.memory_used_mib
            per_ts[sample.ts] = per_ts.get(sample.ts, 0.0) + value
    return {node: sorted(per_ts.items()) for node, per_ts in totals.items()}


def trailing_over(points: Sequence[tuple[float, float]], limit_mib: float, gap_s: float) -> list[tuple[float, float]]:
    """The newest run of polls above `limit_mib` with no gap over `gap_s` (oldest first)."""
    run: list[tuple[float, float]] = []
    for ts, mib in reversed(points):
        if not mib > limit_mib or (run and run[-1][0] - ts > gap_s):  # NaN is never above
            break
        run.append((ts, mib))
    return run[::-1]


def judge_memory(
    window: JobWindow, limit_mib: float, samples_needed: int, now_ts: float, gap_s: float, *, allowance_mib: float
) -> Verdict | None:
    """`over_memory` when the job stayed above `limit_mib` (+ `allowance_mib` per GPU) on some node
    for `samples_needed` polls; else None."""
    if limit_mib <= 0:
        return None  # not a shard job, or its node's GPU type has no shards in the inventory
    for node, points in sorted(node_totals(window.series).items()):
        gpus = sum(1 for series in window.series if series.node == node)
        run = trailing_over(points, limit_mib + allowance_mib * gpus, gap_s)
        if len(run) >= samples_needed and now_ts - run[-1][0] <= gap_s:
            return _verdict(window, node, gpus, run, limit_mib, allowance_mib * gpus, now_ts)
    return None


def _verdict(window: JobWindow, node: str, gpus: int, run: Sequence[tuple[float, float]], limit_mib: float,
             allowance_mib: float, now_ts: float) -> Verdict:
    meta = window.meta
    peak = max(mib for _, mib in run)
    reason = (f"its processes use {peak / MIB_PER_GIB:.1f} GiB of GPU memory on {node}, above its shards' "
              f"{limit_mib / MIB_PER_GIB:.1f} GiB (+ {allowance_mib / MIB_PER_GIB:.1f} GiB allowed for CUDA contexts), "
              f"for {len(run)} samples in a row")
    return Verdict(meta.job_id, meta.job_class, OVER_MEMORY, reason, now_ts, run[-1][0] - run[0][0], run[0][0],
                   gpus, None, ())
