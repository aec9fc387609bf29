"""Benchmark: the learner's in-memory job cache at a large site's volume.

    .venv/bin/python benchmarks/bench_learned.py [--jobs-per-day 1000,10000,50000] [--days D]

`LearnedPublisher` (telemetry/learnpublish.py) keeps, between its runs, one `LearnedJob` per
finished GPU job of the last `learned.max_age_days` (by job id): the key its name makes, the
class the hook stamped and what the agents saw of it, built from sacct's record (`HistoryJob`)
and the samples (`JobUsage`) as the daemon does, which are then dropped. Each
`learned.interval_s` it runs the pure `learn_jobs()` over all of them. This builds that cache
for N GPU jobs a day over D days (default: the policy's max_age_days) and prints, per volume,
the memory the cache holds (tracemalloc: its dict, records and strings), `learn_jobs()`'s time
(without tracemalloc) and the memory it allocates on top while it runs.

Synthetic history: 2,000 users, 20 job-name families each with run numbers (`train-llama-7-run0042`),
the hook's stamp in every AdminComment, usage for every job. Each string is its own object, as
decoding sacct's JSON makes them. No cluster, no database, no sacct parsing (its cost is the
report benchmarks'): only what the daemon keeps in memory.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_aigc.policy.model import BASE_CLASSES, LearnedConfig  # noqa: E402
from slurm_aigc.telemetry.learned import HistoryJob, JobUsage, LearnedJob, learn_jobs, learned_job  # noqa: E402

USERS = 2000
FAMILIES = 20  # job-name families per user
CLASSES = ("train", "infer", "finetune", "interactive")
MIB = 1024.0 * 1024.0


def cache(jobs_per_day: int, days: float, now: float, seed: int = 1) -> dict[str, LearnedJob]:
    """The cache as the learner holds it after reading `days` of `jobs_per_day` finished GPU jobs:
    each sacct record and its usage become one `LearnedJob` (telemetry/learnpublish.py,
    `_read_window` and `_keep_with_usage`), and only that is kept."""
    rng = random.Random(seed)
    total = int(jobs_per_day * days)
    held: dict[str, LearnedJob] = {}
    for i in range(total):
        user = rng.randrange(USERS)
        family = rng.randrange(FAMILIES)
        end = now - rng.uniform(0.0, days * 86400.0)
        job_id = str(10_000_000 + i)
        job_class = CLASSES[(user + family) % len(CLASSES)]
        record = HistoryJob(
            job_id, f"user{user:04d}", 10_000 + user, f"{job_class}-model{family:02d}-run{i % 10_000:04d}",
            f"aigc_class={job_class} aigc_stamp=v1", rng.choice((1, 1, 2, 4, 8)), end, end - rng.uniform(600.0, 36_000.0))
        job = learned_job(record, JobUsage(rng.uniform(2_000.0, 80_000.0), rng.uniform(5.0, 95.0)))
        if job is not None:
            held[job_id] = job
    return held


def measure(jobs_per_day: int, days: float, config: LearnedConfig) -> str:
    """One table row: the cache's memory, learn()'s time and its extra memory."""
    now = time.time()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    jobs = cache(jobs_per_day, days, now)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.reset_peak()
    learn_jobs(jobs.values(), config, now, BASE_CLASSES)
    extra = tracemalloc.get_traced_memory()[1] - before - held
    tracemalloc.stop()
    began = time.process_time()
    entries = learn_jobs(jobs.values(), config, now, BASE_CLASSES)
    took = time.process_time() - began
    return (f"| {jobs_per_day:,} | {days:g} | {len(jobs):,} | {held / MIB:,.0f} MiB | {held / max(len(jobs), 1):,.0f} B "
            f"| {took:.2f} s | {extra / MIB:,.0f} MiB | {len(entries):,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs-per-day", default="1000,10000,50000", help="comma-separated GPU jobs a day")
    parser.add_argument("--days", type=float, default=None, help="history kept (default: learned.max_age_days)")
    args = parser.parse_args()
    config = LearnedConfig()
    days = config.max_age_days if args.days is None else args.days
    print(f"learner cache over {days:g} days (learned.max_age_days {config.max_age_days:g}); "
          f"{USERS:,} users x {FAMILIES} job-name families")
    print("| GPU jobs a day | days | jobs held | cache memory | per job | learn_jobs() CPU | learn_jobs() extra memory | entries |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for per_day in (int(n) for n in args.jobs_per_day.split(",")):
        print(measure(per_day, days, config), flush=True)


if __name__ == "__main__":
    main()
