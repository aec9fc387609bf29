"""Benchmark: one reclaim detection tick over many running jobs, and (optionally) the
time from the start of an idle stretch to the action on the local cluster.

    .venv/bin/python benchmarks/bench_reclaim.py [--jobs 10000] [--gpus 8] [--repeat 5] [--cluster]

Samples are synthetic columns (a mix of busy, idle, memory-held, fake-busy and
over-allocated jobs) covering the default policy's lookback at its poll interval, i.e.
what the controller reads from `job_gpu_samples` each tick. Target: <= 1 s per tick.
Planning and the per-job Verdict objects are included; reading the rows from the
database is not included (it depends on the database server); a steady-state tick reads
only the rows of the last poll.

`--cluster` also measures, on the running local cluster, the time from the start of an
idle stretch (job start + grace) to the first action, with a policy of tiny windows, and
compares it with the target grace + window + 2 poll intervals (the grace is excluded on
both sides: the stretch starts when the grace ends).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from slurm_aigc.reclaim.config import ReclaimConfig, load_reclaim_config
from slurm_aigc.reclaim.detect import JobMeta, SampleBatch, Verdict, detect
from slurm_aigc.reclaim.gpuconflict import find_conflicts
from slurm_aigc.reclaim.ladder import JobFacts, PlannedAction, plan_job
from slurm_aigc.reclaim.tracker import StretchTracker
from slurm_aigc.slurmrecords import JobInfo

REPO = Path(__file__).resolve().parents[1]

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


def latest_poll(batch: SampleBatch) -> SampleBatch:
    """Only the newest sample of every series: what one steady-state tick reads."""
    last = batch.series_offsets[1:] - 1
    n_series = len(last)
    return SampleBatch(
        metas=batch.metas, job_offsets=batch.job_offsets,
        series_offsets=np.arange(n_series + 1, dtype=np.int64),
        series_node=batch.series_node, series_gpu=batch.series_gpu,
        ts=batch.ts[last] + 0.0, util=batch.util[last], memory=batch.memory[last],
        power=batch.power[last], power_limit=batch.power_limit[last],
    )


def shifted(batch: SampleBatch, seconds: float) -> SampleBatch:
    return SampleBatch(batch.metas, batch.job_offsets, batch.series_offsets, batch.series_node, batch.series_gpu,
                       batch.ts + seconds, batch.util, batch.memory, batch.power, batch.power_limit)


def plan_all(verdicts: list[Verdict], config: ReclaimConfig, gpus: int, now: float) -> int:
    planned = 0
    for verdict in verdicts:
        if verdict.kind:
            facts = JobFacts(verdict.job_id, "u", "a", "normal", "train", True, True, 0, 1, gpus)
            planned += isinstance(plan_job(verdict, facts, (), config, now), PlannedAction)
    return planned


CLUSTER_POLICY = """\
agent: {backend: sim, interval_s: 1, publish_features: false}
reclaim:
  poll_interval_s: 1
  gap_intervals: 4
  stale_intervals: 15
  defaults: {grace_s: 3, window_s: 5, min_samples: 3, ladder: {idle: [notify], memory_held: [notify]}}
"""


def listing(n_jobs: int, gpus: int, shard_share: float = 0.3) -> list[JobInfo]:
    """Running jobs as 22.05 lists them, `shard_share` of them shard jobs two to a GPU, the rest
    whole-GPU jobs of 1 GPU; one GPU in 100 carries a shard job and a whole-GPU job (a conflict)."""
    def running(job_id: str, node: str, gres: str) -> JobInfo:
        return JobInfo(job_id, "j", "u", "a", "p", "normal", "RUNNING", "None", node, True, True, 0, None, None,
                       None, None, "", "", "", "", 1, "", {}, ((node, gres),))

    shards = int(n_jobs * shard_share)
    jobs = [running(str(i), f"n{i // gpus:05d}", f"shard:40(IDX:{i % gpus})" if i < shards else f"gpu:a100:1(IDX:{i % gpus})")
            for i in range(n_jobs)]
    # the whole-GPU job Slurm 22.05 put beside every 100th shard job
    jobs += [running(f"w{i}", f"n{i // gpus:05d}", f"gpu:a100:1(IDX:{i % gpus})") for i in range(0, shards, 100)]
    return jobs


def conflict_scan(n_jobs: int, gpus: int, repeat: int) -> list[tuple[str, str, str]]:
    """`find_conflicts` over a tick's listing: cold (every gres_detail parsed) and warm (cached)."""
    jobs = listing(n_jobs, gpus)
    judged = [j.job_id for j in jobs]
    t0 = time.perf_counter()
    found = find_conflicts(jobs, judged)
    cold = time.perf_counter() - t0
    warm_med, warm_max = timed(lambda: find_conflicts(jobs, judged), repeat)
    return [("GPU-conflict scan, first tick (parse)", f"{cold:.3f} s over {len(jobs):,} jobs, {len(found)} conflicts", ""),
            ("GPU-conflict scan, later ticks (med/max)", f"{warm_med:.3f} / {warm_max:.3f} s", "")]


def cluster_latency(bin_path: str) -> list[tuple[str, str, str]]:
    """Submit an idle job, feed samples, tick the controller; seconds from idle start to the action."""
    from slurm_aigc.db import open_database
    from slurm_aigc.reclaim.jobs import start_ts
    from slurm_aigc.reclaim.store import ReclaimStore
    from slurm_aigc.slurm import SlurmCli

    slurm = SlurmCli()
    work = Path(tempfile.mkdtemp(prefix="slurm-aigc-bench-reclaim-"))
    policy_file = work / "policy.yaml"
    policy_file.write_text(CLUSTER_POLICY)
    config = load_reclaim_config(policy_file)
    db_url = f"sqlite:///{work / 'state.db'}"
    script = f"#!/bin/bash\n{bin_path} gpu-load --profile idle --mem 4G --seconds 0\n"
    job_id = slurm.submit(["--gres=gpu:1", "--job-name=bench-reclaim", "--output=/dev/null"], script)
    agent = None
    try:
        job = _wait(lambda: (j := slurm.job(job_id)) is not None and j.state == "RUNNING" and j, 120)
        agent = subprocess.Popen([bin_path, "agent", "--config", str(policy_file), "--backend", "sim", "--node",
                                  job.node_list, "--db", db_url, "--interval", "1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        store = ReclaimStore(open_database(db_url))

        def acted() -> float | None:
            subprocess.run([bin_path, "controller", "--config", str(policy_file), "--db", db_url, "--once",
                            "--no-dry-run", "--no-publisher", "--job", job_id], capture_output=True, timeout=60, check=False)
            rows = store.audit(job_id=job_id)
            return rows[0].ts_intent if rows else None

        action_ts = _wait(acted, 120)
        started = start_ts(job) or 0.0
        policy = config.defaults
        measured = action_ts - (started + policy.grace_s)
        target = policy.window_s + 2 * config.poll_interval_s
        verdict = "PASS" if measured <= target else "OVER"
        return [("cluster: idle start -> first action", f"{measured:.1f} s (grace {policy.grace_s:.0f} s excluded)",
                 f"{verdict} (target window + 2 polls = {target:.0f} s)")]
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=15)
        slurm.cancel(job_id)
        shutil.rmtree(work, ignore_errors=True)


T = TypeVar("T")


def _wait(probe: Callable[[], T | None | bool], timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value  # type: ignore[return-value]
        time.sleep(0.5)
    raise TimeoutError(f"no result within {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--config", default=str(REPO / "etc" / "slurm-aigc.yaml"), help="Policy whose reclaim: section is used.")
    parser.add_argument("--cluster", action="store_true", help="Also measure idle-to-action time on the local cluster.")
    args = parser.parse_args()
    config = load_reclaim_config(args.config)
    policy = config.policy_for("train")
    n_samples = int((policy.window_s + 2 * config.gap_s) // config.poll_interval_s) + 1
    now = 1.7e9
    t0 = time.perf_counter()
    full = synthetic_batch(args.jobs, args.gpus, n_samples, config.poll_interval_s, now)
    build_s = time.perf_counter() - t0
    verdicts = detect(full, config.classes, config.defaults, now, config.gap_s)
    full_med, full_max = timed(lambda: detect(full, config.classes, config.defaults, now, config.gap_s), args.repeat)

    # Steady state: the tracker holds the windows; each tick folds in one new poll per GPU.
    tracker = StretchTracker()
    tracker.update(full, config)
    metas = {m.job_id: m for m in full.metas}
    polls = [shifted(latest_poll(full), config.poll_interval_s * (i + 1)) for i in range(args.repeat)]
    fold_runs, judge_runs = [], []
    tick_verdicts: list[Verdict] = []
    for i, poll in enumerate(polls):
        tick_now = now + config.poll_interval_s * (i + 1)
        t0 = time.perf_counter()
        tracker.update(poll, config)
        fold_runs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tick_verdicts = tracker.verdicts(metas, config, tick_now)
        judge_runs.append(time.perf_counter() - t0)
    plan_med, plan_max = timed(lambda: plan_all(tick_verdicts, config, args.gpus, now), args.repeat)
    tick_max = max(f + j for f, j in zip(fold_runs, judge_runs)) + plan_max
    same = [v.kind for v in verdicts] == [v.kind for v in tick_verdicts]
    kinds = {k: sum(v.kind == k for v in tick_verdicts) for k in ("idle", "memory_held", "fake_busy", "over_allocated", None)}
    rows = [
        ("policy", f"{args.config} (class train: window {policy.window_s:.0f} s, poll {config.poll_interval_s:.0f} s)", ""),
        ("jobs x GPUs x samples per window", f"{args.jobs} x {args.gpus} x {n_samples} = {len(full.ts):,}", ""),
        ("build columns (synthetic data)", f"{build_s:.3f} s", ""),
        ("full-window detect, cold start (med/max)", f"{full_med:.3f} / {full_max:.3f} s", "(once per restart)"),
        ("steady tick: fold one poll (max)", f"{max(fold_runs):.3f} s", ""),
        ("steady tick: verdicts (max)", f"{max(judge_runs):.3f} s", ""),
        ("steady tick: plan flagged jobs (max)", f"{plan_max:.3f} s", ""),
        ("steady tick total (max)", f"{tick_max:.3f} s", "PASS" if tick_max <= 1.0 else "OVER"),
        ("incremental == full-window verdicts", "yes" if same else "NO", ""),
        ("verdicts", ", ".join(f"{k or 'none'}={v}" for k, v in kinds.items()), ""),
    ]
    rows += conflict_scan(args.jobs, args.gpus, args.repeat)
    if args.cluster:
        rows += cluster_latency(str(Path(sys.executable).with_name("slurm-aigc")))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':<58}  target: tick <= 1 s")
    for name, value, status in rows:
        print(f"{name:<{width}}  {value:<58}  {status}")


if __name__ == "__main__":
    main()
