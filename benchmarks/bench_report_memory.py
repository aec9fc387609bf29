"""Benchmark: the report's memory and time over many sampled job-hours (the caps' hourly cells).

    .venv/bin/python benchmarks/bench_report_memory.py [--sizes 1000x6,1000x24,1000x96,5000x24] [--slices-per-hour 6]

`slurm-aigc report` caps used <= sampled <= allocated GPU-hours per job, run and clock hour
(`figures.Aggregator`). The store hands each job's sample slices together
(`SampleStore.job_slices`), and the aggregator caps a job's hours into the group sums once the
stream has passed the job, so what it holds grows with the jobs (their run segments, the
distinct-job sets), not with their sampled hours. Each size JOBSxHOURS is that many one-GPU jobs,
each sampled for HOURS hours at `--slices-per-hour` slices an hour (6: the report benchmark in
docs/reports.md), started a minute apart. Records and slices are generated lazily, so the
tracemalloc peak is the aggregator's; each size runs twice, under tracemalloc (peak, and the
most cells open at once) and without it (time). No sacct parsing, no database: the aggregation only.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_aigc.report.figures import Aggregator, ReportParams  # noqa: E402
from slurm_aigc.report.records import SampleSlice  # noqa: E402
from slurm_aigc.report.sacct import JobRecord  # noqa: E402
from slurm_aigc.report.tres import parse_tres  # noqa: E402

T0 = 1_796_000_400.0  # an hour boundary
USERS = 200
MIB = 1024.0 * 1024.0
ALLOC_TRES = "billing=8,cpu=8,gres/gpu:a100=1,gres/gpu=1,mem=64G,node=1"
TRES = parse_tres(ALLOC_TRES)


def params(hours: int) -> ReportParams:
    return ReportParams(since_ts=T0, until_ts=T0 + (hours + 1) * 3600.0, group_by=("user",), shards_per_gpu={"a100": 80})


def records(jobs: int, hours: int) -> Iterator[JobRecord]:
    for i in range(jobs):
        start = T0 + (i % 60) * 60.0
        user = f"user{i % USERS:03d}"
        yield JobRecord(
            job_id=str(1_000_000 + i), job_id_raw=str(1_000_000 + i), name=f"train-{i}", user=user, account=f"acct{i % 20:02d}",
            partition="gpu", qos="normal", state="COMPLETED", submit_ts=start - 60.0, eligible_ts=start - 60.0, start_ts=start,
            end_ts=start + hours * 3600.0, elapsed_s=hours * 3600, tres=TRES, alloc_tres=ALLOC_TRES, node_list=f"a100-{i % 125:03d}",
            comment="", admin_comment="aigc_class=train", aigc_class="train")


def slices(jobs: int, hours: int, per_hour: int, watch: Aggregator | None, open_max: list[int]) -> Iterator[SampleSlice]:
    """Each job's slices together, as the store reads them; `watch`: note the most cells open."""
    step_s = 3600.0 / per_hour
    for i in range(jobs):
        start, job = T0 + (i % 60) * 60.0, str(1_000_000 + i)
        for step in range(hours * per_hour):
            util = float((i * 7 + step * 13) % 101)
            yield SampleSlice(job, f"a100-{i % 125:03d}", 0, start + step * step_s, step_s, util, 20_000.0, 81_920.0, 300.0, 400.0)
            if watch is not None:
                open_max[0] = max(open_max[0], watch.open_cells)


def report(jobs: int, hours: int, per_hour: int, watched: bool) -> tuple[float, int]:
    aggregator = Aggregator(params(hours))
    aggregator.add_rows(records(jobs, hours))
    open_max = [0]
    aggregator.add_slices(slices(jobs, hours, per_hour, aggregator if watched else None, open_max))
    total = aggregator.result().total
    assert abs(total.gpu_hours_sampled - jobs * hours) < 1e-6 * jobs * hours, total.gpu_hours_sampled
    return total.gpu_hours_used or 0.0, open_max[0]


def measure(jobs: int, hours: int, per_hour: int) -> str:
    gc.collect()
    tracemalloc.start()
    _, open_max = report(jobs, hours, per_hour, watched=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    gc.collect()
    began = time.perf_counter()
    report(jobs, hours, per_hour, watched=False)
    took = time.perf_counter() - began
    count = jobs * hours * per_hour
    return (f"| {jobs * hours:,} | {jobs:,} x {hours} h | {count:,} | {peak / MIB:,.1f} MiB | {peak / jobs:,.0f} B "
            f"| {open_max:,} | {took:.2f} s | {count / took:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000x6,1000x24,1000x96,5000x24", help="comma-separated JOBSxHOURS")
    parser.add_argument("--slices-per-hour", type=int, default=6)
    args = parser.parse_args()
    print(f"one-GPU jobs, {args.slices_per_hour} sample slices per job-hour, grouped by user ({USERS} users)")
    print("| sampled job-hours | jobs | slices | peak (tracemalloc) | peak per job | cells open at most | seconds | slices/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes.split(","):
        jobs, hours = (int(n) for n in size.lower().split("x"))
        print(measure(jobs, hours, args.slices_per_hour), flush=True)


if __name__ == "__main__":
    main()
