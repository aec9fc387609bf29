"""Benchmark: the agent's cost per poll (8 GPUs) and the publisher's cycle at 1000 nodes.

    .venv/bin/python benchmarks/bench_telemetry.py [--polls 200] [--nodes 1000]

Agent: CPU time per `Agent.tick()` (read 8 GPUs, attribute, store in SQLite, publish
check) on the fake DGX A100 (NVML code path) and on the simulated backend; memory as the
Python heap peak of one poll (tracemalloc) and the process's peak RSS after all polls.
Publisher: wall time of the pure core (`plan_cycle`) and of a whole `Publisher.tick()`
(parsing `scontrol` output for 1000 nodes and 2000 jobs, the utilization query over
24 000 recent samples, planning, writing every node on the first cycle).
Targets (issue 4): <= 5 ms and <= 60 MiB per agent poll; <= 1 s per publisher cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_aigc.db import open_database  # noqa: E402
from slurm_aigc.slurm import CommandResult, SlurmCli  # noqa: E402
from slurm_aigc.telemetry.agent import Agent  # noqa: E402
from slurm_aigc.telemetry.attribution import job_gpu_usage  # noqa: E402
from slurm_aigc.telemetry.config import AgentConfig, ScoringConfig  # noqa: E402
from slurm_aigc.telemetry.nvml import NvmlBackend  # noqa: E402
from slurm_aigc.telemetry.procfs import ProcFs  # noqa: E402
from slurm_aigc.telemetry.publisher import Publisher, plan_cycle  # noqa: E402
from slurm_aigc.telemetry.records import GpuBackend, GpuReading, NodeReading  # noqa: E402
from slurm_aigc.telemetry.simgpu import (  # noqa: E402
    GpuLoad,
    ProcLoad,
    SimGpuBackend,
    sim_gpus,
    sim_topology_text,
    write_inventory,
    write_proc_load,
)
from slurm_aigc.telemetry.store import TelemetryStore  # noqa: E402
from slurm_aigc.telemetry.topology import parse_topo_matrix  # noqa: E402
from tests.fakes import nvml as fakes  # noqa: E402

MIB = 1024 * 1024


def node_record(name: str, features: str, weight: int, used: str) -> dict[str, object]:
    """One node of Slurm 22.05's `sinfo --json`."""
    return {"name": name, "architecture": "x86_64", "cpus": 128, "features": features, "active_features": features,
            "gres": "gpu:a100:8,shard:a100:640", "gres_used": used, "state": "mixed", "state_flags": [],
            "weight": weight, "partitions": ["gpu"]}


class ClusterRunner:
    """Answers Slurm 22.05's `sinfo --json` / `squeue --json` and `scontrol update` for a synthetic
    cluster of `n` 8-GPU nodes and 2 jobs per node."""

    def __init__(self, n: int) -> None:
        self.features = {f"gpu{i:04d}": "a100,nvlink,nvlink8,vram80g" for i in range(n)}
        self.weights = dict.fromkeys(self.features, 1)
        self.used = {name: f"gpu:a100:{i % 9}(IDX:0-{i % 9 - 1})" if i % 9 else "gpu:a100:0(IDX:N/A)"
                     for i, name in enumerate(self.features)}
        self.jobs = json.dumps({"errors": [], "jobs": [
            {"job_id": i * 2 + k, "name": "j", "user_name": "u", "account": "a", "job_state": "RUNNING", "nodes": name,
             "comment": f"aigc:type=infer,model=m{i % 7}", "node_count": 1}
            for i, name in enumerate(self.features) for k in range(2)]})

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = list(argv)
        if args == ["scontrol", "--version"]:
            return CommandResult(tuple(argv), 0, "slurm-wlm 22.05.8\n", "")
        if args == ["sinfo", "--json"]:
            nodes = [node_record(n, self.features[n], self.weights[n], self.used[n]) for n in self.features]
            return CommandResult(tuple(argv), 0, json.dumps({"errors": [], "nodes": nodes}), "")
        if args == ["squeue", "--json"]:
            return CommandResult(tuple(argv), 0, self.jobs, "")
        if args[1] == "update":
            pairs = dict(a.split("=", 1) for a in args[2:])
            name = pairs["NodeName"]
            self.features[name] = pairs.get("AvailableFeatures", self.features[name])
            self.weights[name] = int(pairs.get("Weight", self.weights[name]))
            return CommandResult(tuple(argv), 0, "", "")
        raise AssertionError(argv)


def quiet_slurm(node: str) -> SlurmCli:
    runner = ClusterRunner(0)
    runner.features = {node: "a100,nvlink,nvlink8,vram80g"}
    runner.weights = {node: 1}
    runner.used = {node: "gpu:a100:0(IDX:N/A)"}
    return SlurmCli(runner=runner)


def make_agent(backend: GpuBackend, node: str, db: Path) -> Agent:
    pid_jobs = {4242: "1", 5001: "2", 5002: "3", os.getpid(): "4"}
    return Agent(
        node, backend, TelemetryStore(open_database(f"sqlite:///{db}")), quiet_slurm(node), AgentConfig(),
        attribute=lambda pids: {pid: pid_jobs.get(pid) for pid in pids}, split_uses=job_gpu_usage,
        parse_islands=lambda text: parse_topo_matrix(text).nvlink_islands(),
    )


def sim_backend(directory: Path) -> SimGpuBackend:
    node = "sim-a100"
    write_inventory(directory, node, sim_gpus(node, "a100", 8, nvlink=True), sim_topology_text(8, True))
    loads = tuple(GpuLoad(i, 80.0, 20000.0) for i in range(4))
    write_proc_load(directory, node, ProcLoad(os.getpid(), loads, "busy", "4", ProcFs().start_ticks(os.getpid())))
    return SimGpuBackend(node, directory)


def measure_agent(agent: Agent, polls: int) -> tuple[float, float]:
    """(median CPU ms per poll, peak traced MiB of one poll)."""
    agent.tick()  # warm up: imports, first publication, SQLite pages
    cpu_ms = []
    for _ in range(polls):
        start = time.process_time()
        agent.tick()
        cpu_ms.append((time.process_time() - start) * 1000)
    tracemalloc.start()
    agent.tick()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(cpu_ms), peak / MIB


def seed_samples(store: TelemetryStore, names: Sequence[str], now: float, polls: int) -> None:
    for poll in range(polls):
        ts = datetime.fromtimestamp(now - 10 * poll, UTC)
        for i, name in enumerate(names):
            gpus = tuple(GpuReading(index=g, sm_util_pct=float((i * 7 + g * 13 + poll) % 100)) for g in range(8))
            store.write_poll(NodeReading(name, ts, "sim", gpus), {}, [])


def timed(function: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    rows: list[tuple[str, float, str, float]] = []
    with tempfile.TemporaryDirectory() as temp:
        tmp = Path(temp)
        machine = fakes.dgx_a100()
        dgx = NvmlBackend("dgx-01", nvml=fakes.FakeNvml(machine), smi=fakes.smi_runner(machine))
        cpu, heap = measure_agent(make_agent(dgx, "dgx-01", tmp / "agent-nvml.db"), args.polls)
        rows += [("agent poll CPU, fake DGX A100 (NVML path)", cpu, "ms", 5.0),
                 ("agent poll heap peak, fake DGX A100", heap, "MiB", 60.0)]
        cpu, heap = measure_agent(make_agent(sim_backend(tmp / "simgpu"), "sim-a100", tmp / "agent-sim.db"), args.polls)
        rows += [("agent poll CPU, simulated 8x A100", cpu, "ms", 5.0),
                 ("agent poll heap peak, simulated 8x A100", heap, "MiB", 60.0),
                 ("agent process peak RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "MiB", 60.0)]

        runner = ClusterRunner(args.nodes)
        store = TelemetryStore(open_database(f"sqlite:///{tmp / 'publisher.db'}"))
        now = time.time()
        seed_samples(store, list(runner.features), now, 3)
        slurm = SlurmCli(runner=runner)
        nodes = slurm.nodes()
        jobs = slurm.jobs()
        utils = store.mean_util_by_node(now - 300)
        config = ScoringConfig()
        core = timed(lambda: plan_cycle(nodes, jobs, utils, {}, config))
        publisher = Publisher(slurm, store, config, clock=lambda: now)
        first = timed(publisher.tick, repeat=1)
        steady = timed(publisher.tick)
        rows += [(f"publisher core (plan_cycle), {args.nodes} nodes", core * 1000, "ms", 1000.0),
                 (f"publisher tick, first (writes {args.nodes} nodes)", first * 1000, "ms", 1000.0),
                 (f"publisher tick, steady state, {args.nodes} nodes", steady * 1000, "ms", 1000.0)]
    print(f"{'measure':<52} {'value':>10} {'unit':<4} {'target':>8}  ok")
    for name, value, unit, target in rows:
        print(f"{name:<52} {value:>10.2f} {unit:<4} {'<=' + format(target, 'g'):>8}  {'yes' if value <= target else 'NO'}")


if __name__ == "__main__":
    main()
