"""Benchmark: 1,000 node agents writing to the state database while the controller ticks over 10,000 jobs.

    flock /tmp/aigc-cluster.lock .venv/bin/python benchmarks/bench_fanin.py \
        [--nodes 1000] [--jobs-per-node 10] [--interval-s 10] [--duration-s 300] [--db-url URL]

Writers: `--nodes` simulated node agents (light writers, not slurmd), spread over
`--writers` processes of `--threads` threads. Each writes one poll every `--interval-s`,
offsets spread evenly over the interval, through the real code path of an agent poll after
the GPU read: `attribution.job_gpu_usage` splits 8 a100 GPUs between 10 jobs (6 whole-GPU
jobs, 4 shard jobs two per GPU) and `TelemetryStore.write_poll` stores 8 GPU rows, 10
process rows and 10 per-job rows in one transaction. Latency is that call's wall time; lag
is how late a write started against its schedule (a saturated client, not the database).

Controller: every `--interval-s`, one `Controller.tick()` (reclaim, dry-run, and the
publisher's `tick_when_due`, dry-run, every `scoring.interval_s`) over all the jobs and nodes, with Slurm answered by a fake that
returns `squeue --json` / `sinfo --json` documents of that size (22.05 layout). The first
tick reads every job's full lookback; the table shows it apart from the steady ticks.

Database: by default a scratch database on the local cluster's MariaDB (created with the
`test` role's credentials, dropped at the end); `--db-url` uses any SQLAlchemy URL instead.
Database CPU is mariadbd's utime+stime from /proc over the run (when it runs on this host).
Goals (issue 11.6): p99 write latency <= 100 ms, controller tick <= 1 s.

`--ticks-alone N` measures only the controller's tick: N ticks on simulated time, each after
one poll of every node written in-process, against the cluster's MariaDB (a scratch database;
slurmctld is not used, so no cluster lock) or `--db-url` (`sqlite:///FILE`: no cluster at all).
It prints wall and CPU (process time) per steady tick, apart for ticks with and without the
publisher's cycle, so that CPU contention from other work on the host shows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_aigc.db import (  # noqa: E402
    GpuSample,
    JobGpuSample,
    ProcessSample,
    open_database,
    read_url_file,
    scratch_database,
    transaction,
)
from slurm_aigc.localcluster.config import TEST_DATABASE_PREFIX  # noqa: E402
from slurm_aigc.localcluster.manager import LocalCluster  # noqa: E402
from slurm_aigc.reclaim.config import load_reclaim_config  # noqa: E402
from slurm_aigc.reclaim.controller import Controller  # noqa: E402
from slurm_aigc.reclaim.store import ReclaimStore  # noqa: E402
from slurm_aigc.slurm import CommandResult, SlurmCli  # noqa: E402
from slurm_aigc.telemetry.attribution import job_gpu_usage  # noqa: E402
from slurm_aigc.telemetry.config import load_scoring_config  # noqa: E402
from slurm_aigc.telemetry.publisher import Publisher  # noqa: E402
from slurm_aigc.telemetry.records import GpuProcess, GpuReading, NodeReading  # noqa: E402
from slurm_aigc.telemetry.store import TelemetryStore  # noqa: E402
from tests.fakes.slurm import FakeJob, FakeNode  # noqa: E402

GPUS = 8
WHOLE = 6  # GPUs 0-5 hold one job each; GPUs 6 and 7 two shard jobs each
# The fields of a 22.05 `squeue --json` record that slurm-aigc does not read, as the local
# cluster printed them for a running job: with them a record is ~2.7 KB (111 keys) as on a
# cluster, not ~0.7 KB, and parsing the 10,000-job listing costs what it does there (4x more).
OTHER_22_05_FIELDS: dict[str, object] = {
    "accrue_time": 1796334262, "array_job_id": 0, "array_task_id": None, "array_max_tasks": 0,
    "array_task_string": "", "association_id": 2, "batch_features": "", "flags": ["JOB_ACCRUE_OVER",
    "JOB_WAS_RUNNING"], "burst_buffer": "", "burst_buffer_state": "", "cluster": "aigc", "cluster_features": "",
    "command": "", "container": "", "contiguous": False, "core_spec": None, "thread_spec": None,
    "cores_per_socket": None, "billable_tres": 1.0, "cpus_per_task": None, "cpu_frequency_minimum": None,
    "cpu_frequency_maximum": None, "cpu_frequency_governor": None, "cpus_per_tres": "", "deadline": 0,
    "delay_boot": 0, "dependency": "", "derived_exit_code": 0, "eligible_time": 1796334262, "excluded_nodes": "",
    "exit_code": 0, "features": "", "federation_origin": "", "federation_siblings_active": "",
    "federation_siblings_viable": "", "group_id": 0, "group_name": "root", "last_sched_evaluation": 1796334263,
    "licenses": "", "max_cpus": 0, "max_nodes": 0, "mcs_label": "", "memory_per_tres": "", "nice": None,
    "tasks_per_core": None, "tasks_per_node": 0, "tasks_per_socket": None, "tasks_per_board": 0, "tasks": 1,
    "het_job_id": 0, "het_job_id_set": "", "het_job_offset": 0, "prefer": "", "memory_per_node": None,
    "memory_per_cpu": None, "minimum_cpus_per_node": 1, "minimum_tmp_disk_per_node": 0, "preempt_time": 0,
    "pre_sus_time": 0, "profile": None, "reboot": False, "required_nodes": "", "resize_time": 0, "resv_name": "",
    "shared": None, "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"], "sockets_per_board": 0,
    "sockets_per_node": None, "standard_error": "", "standard_input": "/dev/None", "standard_output": "",
    "suspend_time": 0, "system_comment": "", "time_minimum": 0, "threads_per_core": None, "tres_bind": "",
    "tres_freq": "", "tres_per_job": "", "tres_per_socket": "", "tres_per_task": "",
    "tres_req_str": "cpu=1,mem=62.50G,node=1,billing=1", "wckey": "", "current_working_directory": "/tmp",
}


# --------------------------------------------------------------------------- the fleet


def node_name(i: int) -> str:
    return f"n{i:04d}"


def job_layout(node: int) -> list[tuple[str, int]]:
    """(job id, GPU index) of the 10 jobs on node number `node`."""
    base = 100_000 + node * 10
    return [(str(base + k), k if k < WHOLE else WHOLE + (k - WHOLE) // 2) for k in range(10)]


def reading(node: int, rng: random.Random, ts: float | None = None) -> tuple[NodeReading, dict[int, str | None]]:
    """One poll of node `node` (now, or at Unix time `ts`): 8 busy-ish a100 GPUs, one process per job."""
    procs: dict[int, list[GpuProcess]] = {}
    pid_jobs: dict[int, str | None] = {}
    for job, gpu in job_layout(node):
        pid = 10_000 + int(job) % 100_000
        pid_jobs[pid] = job
        # A shard job holds 8 shards of 1 GiB (the shipped a100 inventory) and keeps within them;
        # above them, ~1,900 jobs a tick were over_memory and the tick acted on 10 (the cap) every time.
        memory = rng.uniform(1_000, 7_500) if gpu >= WHOLE else rng.uniform(2_000, 30_000)
        procs.setdefault(gpu, []).append(GpuProcess(pid, memory, rng.uniform(5, 45)))
    gpus = tuple(
        GpuReading(index=i, uuid=f"GPU-{node:04d}-{i}", name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920.0,
                   memory_used_mib=sum(p.used_memory_mib or 0 for p in procs[i]), sm_util_pct=rng.uniform(0, 100),
                   mem_bw_util_pct=rng.uniform(0, 60), power_draw_w=rng.uniform(80, 400), power_limit_w=400.0,
                   temperature_c=rng.uniform(30, 80), processes=tuple(procs[i]))
        for i in range(GPUS))
    when = datetime.now(UTC) if ts is None else datetime.fromtimestamp(ts, UTC)
    return NodeReading(node_name(node), when, "550.54", gpus), pid_jobs


def writer_process(url: str, nodes: Sequence[int], threads: int, interval_s: float, start: float, end: float,
                   total_nodes: int, out: multiprocessing.Queue[tuple[list[float], list[float], int]]) -> None:
    """Write every node of `nodes` each interval until `end`; send back (latencies, lags, rows)."""
    store = TelemetryStore(open_database(url))
    latencies: list[float] = []
    lags: list[float] = []
    rows = [0]
    lock = threading.Lock()

    def run(mine: Sequence[int]) -> None:
        rng = random.Random(mine[0] if mine else 0)
        schedule = sorted((start + interval_s * n / total_nodes, n) for n in mine)
        cycle = 0
        while True:
            for offset, node in schedule:
                due = offset + cycle * interval_s
                if due >= end:
                    return
                time.sleep(max(0.0, due - time.time()))  # the node's poll schedule, not a condition
                began = time.time()
                polled, pid_jobs = reading(node, rng)
                written = store.write_poll(polled, pid_jobs, job_gpu_usage(polled, pid_jobs))
                took = time.time() - began
                with lock:
                    latencies.append(took)
                    lags.append(began - due)
                    rows[0] += written
            cycle += 1

    workers = [threading.Thread(target=run, args=(list(nodes[i::threads]),)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put((latencies, lags, rows[0]))


# --------------------------------------------------------------------------- the controller


class FleetSlurm:
    """A Runner answering `squeue --json` / `sinfo --json` (22.05) for the whole fleet."""

    def __init__(self, nodes: int) -> None:
        started = int(time.time()) - 3600
        jobs = [self._job(job, node, gpu, started) for node in range(nodes) for job, gpu in job_layout(node)]
        self._jobs = json.dumps({"jobs": jobs, "errors": []})
        self._nodes = json.dumps({"nodes": [self._node(node) for node in range(nodes)], "errors": []})

    @staticmethod
    def _job(job: str, node: int, gpu: int, started: int) -> dict[str, object]:
        shard = gpu >= WHOLE
        fake = FakeJob(job, node_name(node), comment="", user="alice", start=datetime.fromtimestamp(started).isoformat(),
                       gpus=0 if shard else 1, shards=8 if shard else 0,
                       gres_detail=f"shard:a100:8(IDX:{gpu})" if shard else f"gpu:a100:1(IDX:{gpu})")
        record = {**fake.record(), **OTHER_22_05_FIELDS, "batch_host": node_name(node)}
        used = {"sockets": {"0": {"cores": {"0": "allocated"}}}, "nodename": node_name(node), "cpus_used": 0,
                "memory_used": 0, "memory_allocated": 0}
        record["job_resources"] = {"nodes": node_name(node), "allocated_cpus": 1, "allocated_hosts": 1,
                                   "allocated_nodes": [used]}
        return record

    @staticmethod
    def _node(node: int) -> dict[str, object]:
        features = ["a100", "nvlink", "nvlink8", "vram80g"]
        return FakeNode(node_name(node), gres="gpu:a100:8,shard:a100:64", features=features, alloc_gpus=6,
                        gres_used="gpu:a100:6(IDX:0-5),shard:a100:32(IDX:6-7)", state="mixed").record(new=False)

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = tuple(argv)
        answers = {("squeue", "--json"): self._jobs, ("sinfo", "--json"): self._nodes,
                   ("scontrol", "--version"): "slurm-wlm 22.05.8"}
        if args in answers:
            return CommandResult(args, 0, answers[args], "")
        return CommandResult(args, 1, "", f"fleet fake: not answered: {list(args)}")


def fleet_controller(url: str, nodes: int, clock: Callable[[], float] = time.time,
                     monotonic: Callable[[], float] = time.monotonic) -> tuple[Controller, Publisher]:
    """Reclaim and the publisher (dry-run) over the fleet, wired as `slurm-aigc controller` does:
    the publisher keeps its own scoring.interval_s (30 s) and hands reclaim its node listing."""
    slurm = SlurmCli(runner=FleetSlurm(nodes))
    factory = open_database(url)
    publisher = Publisher(slurm, TelemetryStore(factory), load_scoring_config(None), dry_run=True,
                          clock=clock, monotonic=monotonic)
    controller = Controller(slurm, ReclaimStore(factory), load_reclaim_config(None), dry_run=True, clock=clock,
                            publisher_tick=publisher.tick_when_due, nodes_seen=lambda: publisher.last_nodes)
    return controller, publisher


def controller_loop(url: str, nodes: int, interval_s: float, end: float, ticks: list[tuple[float, float]],
                    errors: list[str]) -> None:
    """Reclaim + publisher ticks (dry-run) every interval until `end`; appends (wall s, CPU s) per tick."""
    controller, _ = fleet_controller(url, nodes)
    next_tick = time.time() + interval_s  # let the writers fill a first interval
    while next_tick < end:
        time.sleep(max(0.0, next_tick - time.time()))  # the controller's tick schedule
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            controller.tick()
        except Exception as error:  # noqa: BLE001 - a failed tick is reported, as the daemon logs it
            errors.append(f"{type(error).__name__}: {error}")
        ticks.append((time.perf_counter() - wall, time.thread_time() - cpu))
        next_tick += interval_s


# --------------------------------------------------------------------------- database


def mariadbd_cpu_s() -> float | None:
    """CPU seconds (user + system) of the local cluster's mariadbd so far, None when not found."""
    try:
        pid = int((LocalCluster().state_dir / "run" / "mysqld.pid").read_text().split()[0])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def row_counts(url: str) -> dict[str, int]:
    factory = open_database(url)
    with transaction(factory) as session:
        return {table.__tablename__: int(session.scalar(select(func.count()).select_from(table)) or 0)
                for table in (GpuSample, ProcessSample, JobGpuSample)}


# --------------------------------------------------------------------------- report


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def table(args: argparse.Namespace, latencies: list[float], lags: list[float], rows: int,
          ticks: list[tuple[float, float]], db_cpu: float | None, wall: float, counts: dict[str, int]) -> str:
    steady = ticks[1:] or ticks
    ms = [x * 1000 for x in latencies]
    lines = [
        f"{args.nodes} node agents x {GPUS} GPUs, {args.nodes * 10} jobs, one write per node every "
        f"{args.interval_s:g} s for {wall:.0f} s; {args.writers} writer processes x {args.threads} threads",
        "| measure | value | goal |", "|---|---:|---:|",
        f"| writes | {len(latencies)} ({len(latencies) / wall:.1f}/s, {rows / wall:.0f} rows/s) | {args.nodes / args.interval_s:.0f}/s |",
        f"| write latency p50 / p95 / p99 / max | {percentile(ms, 50):.1f} / {percentile(ms, 95):.1f} / "
        f"{percentile(ms, 99):.1f} / {max(ms, default=0):.1f} ms | p99 <= 100 ms |",
        f"| write start lag p99 (client saturation) | {percentile(lags, 99) * 1000:.0f} ms | |",
        f"| controller first tick (full lookback) | {ticks[0][0]:.2f} s wall, {ticks[0][1]:.2f} s CPU | |" if ticks else "",
        f"| controller steady ticks p50 / max ({len(steady)}) | {statistics.median(t[0] for t in steady):.2f} / "
        f"{max(t[0] for t in steady):.2f} s wall, {statistics.median(t[1] for t in steady):.2f} s CPU | <= 1 s |" if ticks else "",
        f"| database CPU (mariadbd) | {db_cpu / wall:.2f} cores ({db_cpu:.0f} s over the run) | |" if db_cpu is not None
        else "| database CPU | not on this host | |",
        f"| rows stored (gpu / process / job-gpu) | {counts['gpu_samples']} / {counts['process_samples']} / "
        f"{counts['job_gpu_samples']} | |",
    ]
    return "\n".join(line for line in lines if line)


def run(args: argparse.Namespace, url: str) -> None:
    """The writers and the controller against `url`, then the table."""
    schema = open_database(url)  # the schema, before the writers race for it
    schema.kw["bind"].dispose()  # no connection of ours is shared with the writers
    start = time.time() + 2.0
    end = start + args.duration_s
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited connections
    queue: multiprocessing.Queue[tuple[list[float], list[float], int]] = context.Queue()
    nodes = list(range(args.nodes))
    procs = [context.Process(target=writer_process, args=(url, nodes[w::args.writers], args.threads, args.interval_s,
                                                          start, end, args.nodes, queue)) for w in range(args.writers)]
    cpu_before = mariadbd_cpu_s()
    for proc in procs:
        proc.start()
    ticks: list[tuple[float, float]] = []
    errors: list[str] = []
    controller_loop(url, args.nodes, args.interval_s, end, ticks, errors)
    results = [queue.get(timeout=args.duration_s + 120) for _ in procs]
    for proc in procs:
        proc.join()
    cpu_after = mariadbd_cpu_s()
    wall = time.time() - start
    latencies = [x for r in results for x in r[0]]
    lags = [x for r in results for x in r[1]]
    db_cpu = None if cpu_before is None or cpu_after is None or args.db_url else cpu_after - cpu_before
    print(table(args, latencies, lags, sum(r[2] for r in results), ticks, db_cpu, wall, row_counts(url)))
    print(f"controller tick errors: {len(errors)}" + (f" (first: {errors[0][:200]})" if errors else ""))


def ticks_alone(args: argparse.Namespace, url: str) -> None:
    """`--ticks-alone N`: N controller ticks on simulated time, each after one poll of every
    node written here (no writer processes, no waiting): the tick's cost without the cluster."""
    now = [time.time() - 3600.0]
    store = TelemetryStore(open_database(url))
    controller, publisher = fleet_controller(url, args.nodes, clock=lambda: now[0], monotonic=lambda: now[0])
    rng = random.Random(1)
    ticks: list[tuple[float, float, bool]] = []  # wall s, CPU s, whether the publisher's cycle ran
    for _ in range(args.ticks_alone):
        now[0] += args.interval_s
        for node in range(args.nodes):
            polled, pid_jobs = reading(node, rng, now[0])
            store.write_poll(polled, pid_jobs, job_gpu_usage(polled, pid_jobs))
        listed = publisher.last_nodes  # a new tuple each publisher cycle
        wall, cpu = time.perf_counter(), time.process_time()
        controller.tick()
        ticks.append((time.perf_counter() - wall, time.process_time() - cpu, publisher.last_nodes is not listed))
    print(f"{args.nodes * 10} jobs on {args.nodes} nodes, {len(ticks)} ticks {args.interval_s:g} s apart (simulated), "
          f"publisher every 30 s; first tick {ticks[0][0]:.2f} s wall, {ticks[0][1]:.2f} s CPU (goal <= 1 s)")
    print("| steady ticks | n | wall p50 / p90 / max | CPU p50 / p90 / max |", "|---|---:|---:|---:|", sep="\n")
    for label, kept in [("all", ticks[1:]), ("without the publisher's cycle", [t for t in ticks[1:] if not t[2]]),
                        ("with the publisher's cycle", [t for t in ticks[1:] if t[2]])]:
        walls, cpus = [t[0] for t in kept], [t[1] for t in kept]
        print(f"| {label} | {len(kept)} | {_spread(walls)} s | {_spread(cpus)} s |")


def _spread(values: Sequence[float]) -> str:
    """`p50 / p90 / max` of `values`, or `-`."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {percentile(values, 90):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--interval-s", type=float, default=10.0)
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--writers", type=int, default=2, help="writer processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per writer process")
    parser.add_argument("--db-url", default=None, help="SQLAlchemy URL (default: a scratch database on the cluster's MariaDB)")
    parser.add_argument("--ticks-alone", type=int, default=0, metavar="N",
                        help="only N controller ticks on simulated time (with --db-url sqlite:///FILE: no cluster)")
    args = parser.parse_args()
    if args.db_url:
        (ticks_alone if args.ticks_alone else run)(args, args.db_url)
        return
    server = read_url_file(LocalCluster().db_url_file("test"))
    with scratch_database(server, f"{TEST_DATABASE_PREFIX}fanin_{os.getpid()}") as url:
        (ticks_alone if args.ticks_alone else run)(args, url)


if __name__ == "__main__":
    main()
