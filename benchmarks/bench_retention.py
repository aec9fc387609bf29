"""Benchmark retention: database size and row counts after a simulated day, and the rollup's cost.

    .venv/bin/python benchmarks/bench_retention.py [--nodes 1000] [--gpus 8] [--hours 24]
        [--interval-s 600] [--backend sqlite|mariadb|both] [--batch-rows 5000]
    .venv/bin/python benchmarks/bench_retention.py --large-hour [--nodes 1000] [--gpus 8]
        [--budget-s 5] [--backend ...]

Time-compressed: `--hours` of polls of `--nodes` x `--gpus` GPUs are inserted as fast as the
database takes them (one row per GPU per poll in gpu_samples, process_samples and
job_gpu_samples, like the agent), with jobs of 1-8 GPUs lasting 1-6 hours. A coarser
`--interval-s` than the agent's 10 s keeps the run short; the table projects the row counts and
size to 10 s polls from the measured bytes per row. Then retention runs with "now" 48 h after
the last poll, so every hour is rolled up and its raw rows deleted (`--batch-rows` per
transaction). MariaDB runs in a throwaway database on the local cluster's server (the
cluster's `test` role); hold the cluster lock for it.

`--large-hour` measures what the controller's tick waits for instead: one hour of job_gpu_samples
at the agent's 10 s polls (plus the 10 minutes read past its end), then retention runs with its
time budget (`--budget-s`, the controller's 5 s) until it has nothing left, as the controller
does tick after tick; the table gives the longest single run against the budget.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import (
    DB_LONG_TIMEOUT_S,
    GpuSample,
    JobGpuRollup,
    JobGpuSample,
    ProcessSample,
    open_database,
    read_url_file,
    scratch_database,
    transaction,
)
from slurm_aigc.localcluster.config import TEST_DATABASE_PREFIX
from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.report.retention import DEFAULT_BUDGET_S, Retention

T0 = 1_796_000_400.0  # an hour boundary
AGENT_INTERVAL_S = 10.0
TABLES = (GpuSample, ProcessSample, JobGpuSample, JobGpuRollup)


@dataclass
class Measure:
    backend: str
    insert_s: float = 0.0
    rows_before: dict[str, int] | None = None
    bytes_before: int = 0
    rows_after: dict[str, int] | None = None
    bytes_after: int = 0
    rollup_s: float = 0.0
    delete_s: float = 0.0
    raw_read: int = 0
    deleted: int = 0


def polls(args: argparse.Namespace) -> Iterator[tuple[list[dict[str, object]], list[dict[str, object]], list[dict[str, object]]]]:
    """One poll of every node at a time: rows of the three sample tables."""
    for step in range(int(args.hours * 3600 / args.interval_s)):
        ts = T0 + step * args.interval_s
        gpu_rows, proc_rows, job_rows = [], [], []
        for node_index in range(args.nodes):
            node = f"gpu{node_index:04d}"
            for gpu in range(args.gpus):
                # Jobs of 1-8 GPUs (GPU blocks of 2^k) lasting 1-6 hours; the id says which.
                width = 2 ** ((node_index + gpu // 4) % 4)
                hours = 1 + (node_index + gpu) % 6
                job = f"{node_index}{gpu // width}{int((ts - T0) // (hours * 3600))}"
                util = float((node_index * 31 + gpu * 7 + step) % 101)
                gpu_rows.append({"ts": ts, "node": node, "gpu_index": gpu, "uuid": f"GPU-{node_index}-{gpu}",
                                 "name": "NVIDIA A100-SXM4-80GB", "lost": False, "memory_total_mib": 81920.0,
                                 "memory_used_mib": 20000.0, "sm_util_pct": util, "mem_bw_util_pct": util / 2,
                                 "power_draw_w": 100 + util * 3, "power_limit_w": 400.0, "temperature_c": 50.0})
                proc_rows.append({"ts": ts, "node": node, "gpu_index": gpu, "pid": 1000 + gpu, "job_id": job,
                                  "used_memory_mib": 20000.0, "sm_util_pct": util})
                job_rows.append({"ts": ts, "node": node, "job_id": job, "gpu_index": gpu, "sm_util_pct": util,
                                 "memory_used_mib": 20000.0, "memory_total_mib": 81920.0, "power_draw_w": 100 + util * 3,
                                 "power_limit_w": 400.0, "shared": False})
        yield gpu_rows, proc_rows, job_rows


def fill(factory: sessionmaker[Session], args: argparse.Namespace) -> float:
    started = time.monotonic()
    for gpu_rows, proc_rows, job_rows in polls(args):
        with transaction(factory) as session:
            session.execute(insert(GpuSample), gpu_rows)
            session.execute(insert(ProcessSample), proc_rows)
            session.execute(insert(JobGpuSample), job_rows)
    return time.monotonic() - started


def polled(factory: sessionmaker[Session], ts: float) -> None:
    """The agents' poll at `ts`: retention keeps the raw rows of 48 h before the newest sample."""
    with transaction(factory) as session:
        session.add(GpuSample(ts=ts, node="bench-now", gpu_index=0, sm_util_pct=0.0))


def counts(factory: sessionmaker[Session]) -> dict[str, int]:
    with transaction(factory) as session:
        return {model.__tablename__: int(session.scalar(select(func.count()).select_from(model)) or 0) for model in TABLES}


def size_bytes(factory: sessionmaker[Session]) -> int:
    with transaction(factory) as session:
        bind = session.get_bind()
        if bind.dialect.name == "sqlite":
            pages = session.execute(text("PRAGMA page_count")).scalar() or 0
            free = session.execute(text("PRAGMA freelist_count")).scalar() or 0
            size = session.execute(text("PRAGMA page_size")).scalar() or 0
            return int((pages - free) * size)  # in use; VACUUM returns the rest to the file system
        for model in TABLES:
            session.execute(text(f"ANALYZE TABLE {model.__tablename__}"))
        value = session.execute(text(
            "SELECT SUM(data_length + index_length) FROM information_schema.tables WHERE table_schema = DATABASE()")).scalar()
        return int(value or 0)


def measure(backend: str, url: str, args: argparse.Namespace) -> Measure:
    factory = open_database(url, timeout_s=DB_LONG_TIMEOUT_S)
    result = Measure(backend)
    result.insert_s = fill(factory, args)
    result.rows_before, result.bytes_before = counts(factory), size_bytes(factory)
    now = T0 + args.hours * 3600 + 48 * 3600
    polled(factory, now)
    # No budget: the benchmark measures the whole catch-up in one run.
    run = Retention(factory, raw_retention_hours=48.0, batch_rows=args.batch_rows, default_interval_s=args.interval_s,
                    budget_s=math.inf).run(now)
    result.rollup_s, result.delete_s, result.raw_read = run.rollup_s, run.delete_s, run.raw_rows_read
    result.deleted = sum(run.deleted.values())
    result.rows_after, result.bytes_after = counts(factory), size_bytes(factory)
    return result


@dataclass
class Budgeted:
    backend: str
    raw_rows: int
    runs: list[float]  # seconds of each run
    rollup_runs: int  # runs that rolled up (the others only deleted)


def fill_hour(factory: sessionmaker[Session], args: argparse.Namespace) -> int:
    """One hour of job rows at 10 s polls, and the lookahead (the next 10 minutes) the rollup reads."""
    hour = argparse.Namespace(**{**vars(args), "hours": 1 + 600 / 3600, "interval_s": AGENT_INTERVAL_S})
    rows = 0
    for _, _, job_rows in polls(hour):
        with transaction(factory) as session:
            session.execute(insert(JobGpuSample), job_rows)
        rows += len(job_rows)
    return rows


def measure_budgeted(backend: str, url: str, args: argparse.Namespace) -> Budgeted:
    factory = open_database(url, timeout_s=DB_LONG_TIMEOUT_S)
    result = Budgeted(backend, fill_hour(factory, args), [], 0)
    retention = Retention(factory, raw_retention_hours=48.0, batch_rows=args.batch_rows, budget_s=args.budget_s)
    now = T0 + 3600 + 48 * 3600  # the one hour is older than the retention
    polled(factory, now)
    while True:  # as the controller: one run a tick, while a run leaves work
        started = time.monotonic()
        run = retention.run(now)
        result.runs.append(time.monotonic() - started)
        result.rollup_runs += bool(run.raw_rows_read or run.rollup_rows or run.hours_rolled)
        if run.finished:
            return result


def budget_table(results: list[Budgeted], args: argparse.Namespace) -> str:
    lines = [f"one hour of {args.nodes} nodes x {args.gpus} GPUs at {AGENT_INTERVAL_S:g} s polls, budget "
             f"{args.budget_s:g} s, {args.batch_rows} rows per transaction",
             f"{'backend':<8} {'job rows read':>13} {'runs':>5} {'rollup runs':>11} {'longest run s':>13} "
             f"{'budget s':>8} {'all runs s':>10}"]
    for m in results:
        lines.append(f"{m.backend:<8} {m.raw_rows:>13,} {len(m.runs):>5} {m.rollup_runs:>11} {max(m.runs):>13.2f} "
                     f"{args.budget_s:>8g} {sum(m.runs):>10.1f}")
    return "\n".join(lines)


def table(results: list[Measure], args: argparse.Namespace) -> str:
    scale = args.interval_s / AGENT_INTERVAL_S
    raw_tables = ("gpu_samples", "process_samples", "job_gpu_samples")
    lines = [f"{args.nodes} nodes x {args.gpus} GPUs, {args.hours:g} h of polls every {args.interval_s:g} s "
             f"(x{scale:g} to the agent's {AGENT_INTERVAL_S:g} s), retention 48 h, {args.batch_rows} rows per delete",
             f"{'backend':<8} {'raw rows':>11} {'MiB':>8} {'B/row':>6} {'rows/day@10s':>13} {'GiB/day@10s':>12} "
             f"{'insert rows/s':>13} {'rollup s':>9} {'read rows/s':>11} {'delete s':>9} {'del rows/s':>10} "
             f"{'rollups':>8} {'MiB after':>9}"]
    for m in results:
        assert m.rows_before is not None and m.rows_after is not None
        raw = sum(m.rows_before[t] for t in raw_tables)
        per_row = m.bytes_before / raw if raw else 0.0
        day_rows = raw * scale * 24 / args.hours
        lines.append(
            f"{m.backend:<8} {raw:>11,} {m.bytes_before / 2**20:>8.1f} {per_row:>6.0f} {day_rows:>13,.0f} "
            f"{day_rows * per_row / 2**30:>12.1f} {raw / m.insert_s:>13,.0f} {m.rollup_s:>9.1f} "
            f"{m.raw_read / max(m.rollup_s, 1e-9):>11,.0f} {m.delete_s:>9.1f} {m.deleted / max(m.delete_s, 1e-9):>10,.0f} "
            f"{m.rows_after['job_gpu_rollups']:>8,} {m.bytes_after / 2**20:>9.1f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--interval-s", type=float, default=600.0)
    parser.add_argument("--batch-rows", type=int, default=5000)
    parser.add_argument("--backend", choices=("sqlite", "mariadb", "both"), default="both")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/slurm-aigc-bench-retention"))
    parser.add_argument("--large-hour", action="store_true",
                        help="Measure the longest budgeted run over one hour of 10 s polls.")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    args = parser.parse_args()
    if args.large_hour:
        print(budget_table([measure_budgeted(name, url, args) for name, url in backends(args)], args))
    else:
        print(table([measure(name, url, args) for name, url in backends(args)], args))


def backends(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(name, URL) of each database asked for, empty; MariaDB's is dropped once the caller moves on."""
    if args.backend in ("sqlite", "both"):
        args.work_dir.mkdir(parents=True, exist_ok=True)
        path = args.work_dir / "state.db"
        for suffix in ("", "-wal", "-shm", ".schema-lock"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        yield "sqlite", f"sqlite:///{path}"
    if args.backend in ("mariadb", "both"):
        server = read_url_file(LocalCluster().db_url_file("test"))
        with scratch_database(server, f"{TEST_DATABASE_PREFIX}retention_{os.getpid()}") as url:
            yield "mariadb", url

if __name__ == "__main__":
    main()
