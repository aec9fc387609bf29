"""Benchmark: one reclaim detection tick over many running jobs, and (optionally) the
time from the start of an idle stretch to the action on the local cluster.

    .venv/bin/python benchmarks/bench_reclaim.py [--jobs 10000] [--gpus 8] [--repeat 5]

Samples are synthetic columns (a mix of busy, idle, memory-held, fake-busy and
over-allocated jobs) covering the default policy's lookback at its poll interval, i.e.
what the controller reads from `job_gpu_samples` each tick. Target: <= 1 s per tick.
Planning and the per-job Verdict objects are included; reading the rows from the
database is timed separately (`--db-rows`), since it depends on the database server.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.detect import JobMeta, SampleBatch, detect
from slurm_aigc.reclaim.ladder import JobFacts, plan_job

PROFILES = ("busy", "idle", "held", "fake", "over")
PROFILE_SHARE = (0.6, 0.15, 0.1, 0.05, 0.1)


def synthetic_batch(n_jobs: int, n_gpus: int, n_samples: int, interval_s: float, now: float, seed: int = 1) -> SampleBatch:
    """Columns for `n_jobs` jobs x `n_gpus` GPUs x `n_samples` polls ending at `now`."""
    rng = np.random.default_rng(seed)
    profile = rng.choice(len(PROFILES), size=n_jobs, p=PROFILE_SHARE)
    shape = (n_jobs, n_gpus, n_samples)
    ts = np.broadcast_to(now - interval_s * np.arange(n_samples)[::-1], shape)
    util = rng.uniform(70, 100, shape)
    memory = rng.uniform(20000, 70000, shape)
    power = rng.uniform(250, 400, shape)
    idle, held, fake, over = (profile == 1), (profile == 2), (profile == 3), (profile == 4)
    util[idle | held] = 0.0
    memory[idle] = 0.0
    power[idle | held] = 60.0
    util[fake] = 100.0
    power[fake] = 70.0
    util[over, 1:, :] = 0.0
    metas = tuple(JobMeta(str(100000 + j), "train", now - 7200.0, n_gpus) for j in range(n_jobs))
    n_series = n_jobs * n_gpus
    return SampleBatch(
        metas=metas,
        job_offsets=np.arange(0, n_series + 1, n_gpus, dtype=np.int64),
        series_offsets=np.arange(0, n_series * n_samples + 1, n_samples, dtype=np.int64),
        series_node=tuple(f"node{j % 1000:04d}" for j in range(n_jobs) for _ in range(n_gpus)),
        series_gpu=tuple(g for _ in range(n_jobs) for g in range(n_gpus)),
        ts=np.ascontiguousarray(ts).ravel(),
        util=util.ravel(),
        memory=memory.ravel(),
        power=power.ravel(),
        power_limit=np.full(n_series * n_samples, 400.0),
    )


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), max(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    config = ReclaimConfig()
    n_samples = int(config.lookback_s() // config.poll_interval_s) + 1
    now = 1.7e9
    build_s, _ = timed(lambda: synthetic_batch(args.jobs, args.gpus, n_samples, config.poll_interval_s, now), 1)
    batch = synthetic_batch(args.jobs, args.gpus, n_samples, config.poll_interval_s, now)
    verdicts = detect(batch, config.classes, config.defaults, now, config.gap_s)
    detect_med, detect_max = timed(lambda: detect(batch, config.classes, config.defaults, now, config.gap_s), args.repeat)

    def plan_all() -> None:
        for verdict in verdicts:
            if verdict.kind:
                plan_job(verdict, JobFacts(verdict.job_id, "u", "a", "normal", "train", True, True, 0, 1, args.gpus),
                         (), config, now)

    plan_med, plan_max = timed(plan_all, args.repeat)
    kinds = {k: sum(v.kind == k for v in verdicts) for k in ("idle", "memory_held", "fake_busy", "over_allocated", None)}
    rows = [
        ("jobs x GPUs x samples", f"{args.jobs} x {args.gpus} x {n_samples} = {len(batch.ts):,}", ""),
        ("build columns (synthetic)", f"{build_s:.3f} s", ""),
        ("detect (median / max)", f"{detect_med:.3f} s / {detect_max:.3f} s", "PASS" if detect_max <= 1.0 else "OVER"),
        ("plan flagged jobs (median / max)", f"{plan_med:.3f} s / {plan_max:.3f} s", ""),
        ("tick = detect + plan (max)", f"{detect_max + plan_max:.3f} s", "PASS" if detect_max + plan_max <= 1.0 else "OVER"),
        ("verdicts", ", ".join(f"{k or 'none'}={v}" for k, v in kinds.items()), ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':<40}  target <= 1 s")
    for name, value, status in rows:
        print(f"{name:<{width}}  {value:<40}  {status}")


if __name__ == "__main__":
    main()
