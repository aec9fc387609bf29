"""Benchmark: slurmctld RPCs made by the agents (per node-minute) and the controller (per minute).

    flock /tmp/aigc-cluster.lock .venv/bin/python benchmarks/bench_rpc.py \
        [--shape a100:8x2,t4:4x2] [--phase-s 120] [--restore-shape a100:8x2,t4:4x2]

On the local cluster (brought up in `--shape` with `--replace`, so slurm.conf has the
shipped Prolog/Epilog), with a job mix running on every node (a long 2-GPU job per a100
node, two shard jobs per t4 node, and on every node a chain of short 1-GPU jobs so that new
jobs keep starting), `sdiag -r` then `sdiag` count slurmctld's RPCs by type in three phases:

A. one `slurm-aigc agent --backend sim` per node (Prolog records present);
B. the same agents plus `slurm-aigc controller --dry-run` (reclaim and publisher; a dry-run
   publisher makes no `scontrol update` and so skips its listing before the writes);
D. phase B plus a second `slurm-aigc controller --dry-run` on the same database: a standby,
   as on a second host, which finds the leases held and asks slurmctld nothing;
C. the agents alone again but reading an empty record directory (a site without the
   Prolog): every new job costs one lookup.

Every RPC type counts except the cluster's own traffic (slurmd registrations, batch and
Prolog/Epilog completion, the benchmark's job submissions and kills, sdiag), which the table
lists apart. The controller's figure is phase B minus phase A's rate, the standby's phase D
minus phase B's. Projection to 2,000 nodes:
agents scale per node; the controller's reads are per tick whatever the size, its writes
(`scontrol update` of a node whose weight or features change) are projected per node.
Goals (issue 11.5): agents <= 0.2 per node-minute, controller <= 10 per minute.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_aigc.children import spawn_logged, stop_all  # noqa: E402
from slurm_aigc.localcluster.manager import LocalCluster  # noqa: E402
from slurm_aigc.localcluster.shape import NodeSpec  # noqa: E402
from slurm_aigc.shipped import POLICY, shipped_file  # noqa: E402

DEFAULT_SHAPE = "a100:8x2,t4:4x2"
BIN = Path(sys.executable).parent / "slurm-aigc"
# slurmctld traffic that is the cluster's (and the benchmark's), not the daemons'.
CLUSTER_OWN = frozenset({
    "MESSAGE_NODE_REGISTRATION_STATUS", "REQUEST_COMPLETE_BATCH_SCRIPT", "MESSAGE_EPILOG_COMPLETE",
    "REQUEST_COMPLETE_PROLOG", "REQUEST_STEP_COMPLETE", "REQUEST_COMPLETE_JOB_ALLOCATION",
    "REQUEST_SUBMIT_BATCH_JOB", "REQUEST_KILL_JOB", "REQUEST_CANCEL_JOB_STEP", "REQUEST_JOB_STEP_CREATE",
    "REQUEST_STATS_INFO",  # sdiag itself
})
WRITES = frozenset({"REQUEST_UPDATE_NODE"})
_SDIAG_RE = re.compile(r"^\s+([A-Z_]+)\s+\(\s*\d+\)\s+count:(\d+)")


def sdiag_counts() -> Counter[str]:
    """`sdiag`: RPC count per message type since the last reset."""
    text = subprocess.run(["sdiag"], capture_output=True, text=True, check=True, timeout=30).stdout
    section = text.split("by message type", 1)[1].split("by user", 1)[0]
    return Counter({m.group(1): int(m.group(2)) for line in section.splitlines() if (m := _SDIAG_RE.match(line))})


def sdiag_reset() -> None:
    subprocess.run(["sdiag", "-r"], capture_output=True, check=True, timeout=30)


@dataclass
class Phase:
    name: str
    seconds: float
    counts: Counter[str]
    new_jobs: int = 0

    def daemon(self) -> Counter[str]:
        return Counter({k: v for k, v in self.counts.items() if k not in CLUSTER_OWN})

    def per_minute(self, kinds: Callable[[str], bool] = lambda _k: True) -> float:
        return sum(v for k, v in self.daemon().items() if kinds(k)) * 60.0 / self.seconds


class Daemons:
    """Agents (one per node) and the controller as subprocesses, logs under `log_dir`."""

    def __init__(self, local: LocalCluster, config: Path, log_dir: Path) -> None:
        self.local, self.config, self.log_dir = local, config, log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_agents(self, nodes: Sequence[str], records: Path | None) -> None:
        env = dict(os.environ)
        if records is not None:
            env["SLURM_AIGC_JOB_RECORDS"] = str(records)
        for node in nodes:
            self._start([str(BIN), "agent", "--config", str(self.config), "--node", node, "--backend", "sim",
                         "--simgpu-dir", str(self.local.simgpu_dir), "--db", str(self.local.db_url_file("agent"))],
                        f"agent-{node}", env)

    def start_controller(self, name: str = "controller") -> None:
        self._start([str(BIN), "controller", "--config", str(self.config), "--db",
                     str(self.local.db_url_file("controller")), "--dry-run"], name, dict(os.environ))

    def _start(self, argv: list[str], name: str, env: dict[str, str]) -> None:
        self.procs.append(spawn_logged(argv, self.log_dir / f"{name}.log", env))

    def stop(self) -> None:
        stop_all(self.procs, timeout_s=30)
        self.procs = []


def bench_config(log_dir: Path, feature_check_s: float) -> Path:
    """The shipped policy with the agents' feature re-check interval set (printed in the table)."""
    policy = yaml.safe_load(shipped_file(POLICY).read_text())
    policy.setdefault("agent", {})["feature_check_s"] = feature_check_s
    path = log_dir / "slurm-aigc.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def submit(local: LocalCluster, node: str, gres: str, seconds: float, util: int, name: str) -> str:
    load = shlex.join(local.job_command()) + f" gpu-load --util {util} --mem 2G --seconds {int(seconds)}"
    argv = ["sbatch", "--parsable", f"--gres={gres}", f"--nodelist={node}", f"--job-name={name}",
            "--dependency=singleton", "-o", "/dev/null", "--wrap", load]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout.strip().split(";")[0]


def job_mix(local: LocalCluster, nodes: Sequence[NodeSpec], total_s: float, churn_s: float) -> list[str]:
    """Per node: long jobs (2 GPUs on a100, two 8-shard jobs on t4) and a chain of short 1-GPU jobs."""
    ids = []
    for spec in nodes:
        if spec.shards_per_gpu and spec.gpu.gres_type == "t4":
            shards = min(8, spec.shards_per_gpu)
            ids += [submit(local, spec.name, f"shard:{shards}", total_s, util, f"rpc-long-{spec.name}-{util}") for util in (30, 50)]
        else:
            ids.append(submit(local, spec.name, f"gpu:{spec.gpu.gres_type}:2", total_s, 70, f"rpc-long-{spec.name}"))
        ids += [submit(local, spec.name, f"gpu:{spec.gpu.gres_type}:1", churn_s, 40, f"rpc-churn-{spec.name}")
                for _ in range(math.ceil(total_s / churn_s) + 1)]
    return ids


def running(ids: Sequence[str]) -> int:
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%A"], capture_output=True, text=True, timeout=30).stdout
    return len(set(out.split()) & set(ids))


def started_between(ids: Sequence[str], start: float, end: float) -> int:
    """Jobs of `ids` that started in [start, end) (from slurmdbd's `sacct`, not slurmctld)."""
    window = [time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) for t in (start - 1, end + 1)]
    argv = ["sacct", "-a", "-n", "-X", "-P", "-o", "JobID,Start", "-S", window[0], "-E", window[1]]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    wanted, count = set(ids), 0
    for line in out.splitlines():
        job, _, when = line.partition("|")
        if job not in wanted:
            continue
        try:
            ts = time.mktime(time.strptime(when.strip(), "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            continue
        count += start <= ts < end
    return count


def measure(name: str, seconds: float, ids: Sequence[str]) -> Phase:
    sdiag_reset()
    start = time.time()
    time.sleep(seconds)  # the measurement window itself, not a wait for a condition
    counts = sdiag_counts()
    return Phase(name, time.time() - start, counts, started_between(ids, start, time.time()))


def run_shape(shape: str, args: argparse.Namespace, log_dir: Path) -> tuple[int, list[Phase]]:
    local = LocalCluster(progress=lambda message: print(f"[cluster] {message}", file=sys.stderr))
    nodes = list(local.up(shape, install=False, replace=True).nodes)
    conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    assert "slurm-aigc-jobrecord" in conf, "slurm.conf has no slurm-aigc Prolog"
    total_s = 4 * args.phase_s + 120
    ids = job_mix(local, nodes, total_s, args.churn_s)
    daemons = Daemons(local, bench_config(log_dir, args.feature_check_s), log_dir)
    try:
        deadline = time.monotonic() + 120
        while running(ids) < len(nodes) and time.monotonic() < deadline:
            time.sleep(2)
        daemons.start_agents([n.name for n in nodes], None)
        time.sleep(args.warmup_s)  # agents publish their static features once at start
        phases = [measure("A agents", args.phase_s, ids)]
        daemons.start_controller()
        phases.append(measure("B agents+controller", args.phase_s, ids))
        daemons.start_controller("standby")  # the first holds the leases: this one stands by
        phases.append(measure("D B + a standby controller", args.phase_s, ids))
        daemons.stop()
        standby_log = (log_dir / "standby.log").read_text(errors="replace")
        assert "standing by: the" in standby_log, f"the second controller did not stand by:\n{standby_log[-2000:]}"
        daemons.start_agents([n.name for n in nodes], log_dir / "no-records")
        time.sleep(args.warmup_s)
        phases.append(measure("C agents, no Prolog", args.phase_s, ids))
    finally:
        daemons.stop()
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
    return len(nodes), phases


def report(shape: str, nodes: int, phases: list[Phase], feature_check_s: float) -> list[str]:
    a, b, d, c = phases
    agents = a.per_minute() / nodes
    controller = max(b.per_minute() - a.per_minute(), 0.0)
    standby = d.per_minute() - b.per_minute()
    ctl_writes = max(b.per_minute(lambda k: k in WRITES) - a.per_minute(lambda k: k in WRITES), 0.0)
    ctl_reads = controller - ctl_writes
    no_prolog = c.per_minute() / nodes
    lines = [f"shape {shape}: {nodes} nodes, phases of {a.seconds:.0f} s, agent feature_check_s={feature_check_s:.0f}",
             "| phase | daemon RPCs by type | per minute | new jobs started |", "|---|---|---:|---:|"]
    for phase in phases:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(phase.daemon().items())) or "none"
        lines.append(f"| {phase.name} | {kinds} | {phase.per_minute():.2f} | {phase.new_jobs} |")
    own = Counter[str]()
    for phase in phases:
        own.update({k: v for k, v in phase.counts.items() if k in CLUSTER_OWN})
    lines += ["", f"cluster's own traffic (not counted): {', '.join(f'{k} {v}' for k, v in sorted(own.items()))}", "",
              "| measure | value | goal | projection at 2,000 nodes |", "|---|---:|---:|---:|",
              f"| agents, RPCs per node-minute | {agents:.3f} | <= 0.2 | {agents * 2000:.0f} per minute in all |",
              f"| agents without the Prolog, per node-minute | {no_prolog:.3f} | | {no_prolog * 2000:.0f} per minute |",
              f"| agents without the Prolog, per new job | {c.per_minute() * c.seconds / 60 / max(c.new_jobs, 1):.2f} | <= 1 | |",
              f"| controller reads per minute | {ctl_reads:.1f} | <= 10 | {ctl_reads:.1f} (listings per tick) |",
              f"| controller node writes per minute | {ctl_writes:.1f} | | {ctl_writes / nodes * 2000:.0f} if as many nodes change |",
              f"| standby controller, per minute (D - B) | {standby:+.1f} | 0 | {standby:+.1f} |"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", help=f"cluster shape(s) to measure (default {DEFAULT_SHAPE})")
    parser.add_argument("--phase-s", type=float, default=120.0)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--churn-s", type=float, default=45.0, help="length of the short jobs")
    parser.add_argument("--feature-check-s", type=float, default=1800.0)
    parser.add_argument("--restore-shape", default=None, help="bring the cluster back up in this shape afterwards")
    args = parser.parse_args()
    out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-rpc-") as tmp:
        try:
            for shape in args.shape or [DEFAULT_SHAPE]:
                log_dir = Path(tmp) / shape.replace(",", "_").replace(":", "-")
                log_dir.mkdir()
                nodes, phases = run_shape(shape, args, log_dir)
                lines = report(shape, nodes, phases, args.feature_check_s)
                out += [*lines, ""]
                print("\n".join(lines), flush=True)
        finally:
            if args.restore_shape:
                LocalCluster().up(args.restore_shape, install=False, replace=True)
    print("\n".join(out))


if __name__ == "__main__":
    main()
