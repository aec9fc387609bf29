"""Benchmark on a real NVIDIA GPU: what the agent reads under real loads, and what the product concludes.

    python3 benchmarks/bench_real_gpu.py [--seconds 8] [--json OUT.json]   (needs PyTorch with CUDA)

Everything runs on GPU 0 of this machine through the agent's own NVML backend
(`telemetry.nvml.NvmlBackend`), the code that runs on every GPU node:

1. Poll cost: wall and CPU time of one `NvmlBackend.read()` (every GPU, its processes, NVLink)
   on the idle GPU, the NVML functions it spends it in, and (at the end) its CPU time while
   1 or 4 processes ran (per-process utilization is read only where processes share a GPU).
2. Load profiles: for each workload below, run in its own process for `--seconds`, the GPU's
   SM utilization and power draw every 0.25 s (means in the table; the first second ramps
   up), the load's own process as NVML lists it (memory; per-process SM where shared), and how `report.figures.DEFAULT_USEFUL_RULE` (the reclaim
   detector's fake-busy rule: SM >= 95 % at <= 30 % of the power limit) classes each sample.
   - idle: nothing runs;
   - spin: `torch.cuda._sleep`, one thread spinning on the clock (a hung kernel: busy, no work);
   - decode-b1: bf16 GEMV on a 16384x16384 matrix, batch 1 (LLM decoding, memory-bound);
   - decode-b16: the same at batch 16;
   - matmul: bf16 8192^3 matrix products (training, compute-bound);
   - duty-50: the matmul 0.5 s on, 0.5 s off.
3. Memory guard: the shipped TaskProlog computes a 4-of-80-shard share; a neighbour holds
   5 GiB; a job run through the shipped `slurm-aigc-torchlimit` wrapper tries 12 GiB (must
   get torch's OutOfMemoryError); a hog without the wrapper takes 12 GiB; and JAX is started
   with the TaskProlog's XLA_PYTHON_CLIENT_MEM_FRACTION. The real per-process readings go
   through the agent's attribution (`job_gpu_usage`) and the pure guard (`judge_memory`): the
   hog must be judged over its shards' memory, the neighbour not.

Prints one table per part; `--json` writes every sample. Exit 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_aigc.reclaim.config import ReclaimConfig  # noqa: E402
from slurm_aigc.reclaim.detect import JobMeta, JobWindow  # noqa: E402
from slurm_aigc.reclaim.memguard import judge_memory  # noqa: E402
from slurm_aigc.report.figures import DEFAULT_USEFUL_RULE  # noqa: E402
from slurm_aigc.series import GpuSeries, Sample  # noqa: E402
from slurm_aigc.telemetry.attribution import job_gpu_usage  # noqa: E402
from slurm_aigc.telemetry.nvml import NvmlBackend  # noqa: E402
from slurm_aigc.telemetry.records import GpuReading, NodeReading  # noqa: E402

GIB = 1024**3
POLL_S = 0.25
SHARDS_PER_GPU = 80
JOB_SHARDS = 4  # the share the TaskProlog computes: 4/80 = 5 % of the GPU

# Each workload: a program for `python -c`, argv[1] = seconds; it prints "ready" once its
# memory is allocated so the sampling window covers only the steady state.
_HEAD = "import sys, time, torch\nS = float(sys.argv[1])\n"
# LLM decoding's shape: one weight matrix times BATCH token vectors (memory-bound at small batch).
_DECODE = _HEAD + """w = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
v = torch.randn(16384, BATCH, device="cuda", dtype=torch.bfloat16); print("ready", flush=True)
end = time.time() + S
while time.time() < end:
    for _ in range(50): v = (w @ v) / 128
    torch.cuda.synchronize()
"""
WORKLOADS = {
    "idle": None,
    "spin": _HEAD + """torch.zeros(1, device="cuda"); print("ready", flush=True)
end = time.time() + S
while time.time() < end:
    torch.cuda._sleep(50_000_000); torch.cuda.synchronize()
""",
    "decode-b1": _DECODE.replace("BATCH", "1"),
    "decode-b16": _DECODE.replace("BATCH", "16"),
    "matmul": _HEAD + """a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); print("ready", flush=True)
end = time.time() + S
while time.time() < end:
    (a @ a).sum().item()
""",
    "duty-50": _HEAD + """a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); print("ready", flush=True)
end = time.time() + S
while time.time() < end:
    busy = time.time() + 0.5
    while time.time() < busy: (a @ a).sum().item()
    time.sleep(0.5)
""",
}
# argv[1] seconds to hold, argv[2] GiB to allocate; prints "ready"/"oom" then holds what it got.
ALLOC = """import sys, time, torch
S, gib = float(sys.argv[1]), float(sys.argv[2])
try:
    x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda"); x.fill_(1); print("ready", flush=True)
except torch.cuda.OutOfMemoryError as error:
    torch.zeros(1, device="cuda"); print("oom", str(error).splitlines()[0][:160], flush=True)
time.sleep(S)
"""
JAX = """import sys, time, jax, jax.numpy as jnp
(jnp.ones(1024) + 1).block_until_ready(); print("ready", flush=True)
time.sleep(float(sys.argv[1]))
"""


@dataclass
class Child:
    """A workload process and the first line it printed ("ready", or "oom ...")."""

    process: subprocess.Popen[str]
    first_line: str


def start(code: str, argv: Sequence[str], scratch: Path, env: dict[str, str] | None = None,
          wrapper: str | None = None) -> Child:
    """A child running `code` from a file in `scratch` (the wrapper runs a script path), through
    `wrapper` when given; returns once it printed its first line."""
    handle, name = tempfile.mkstemp(suffix=".py", dir=scratch)
    os.close(handle)
    script = Path(name)
    script.write_text(code)
    command = [sys.executable] + ([wrapper] if wrapper else []) + [str(script), *argv]
    process = subprocess.Popen(command, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return Child(process, process.stdout.readline().strip())


def stop(child: Child | None) -> None:
    if child is not None and child.process.poll() is None:
        child.process.terminate()
        child.process.wait(timeout=30)


READ_MS: dict[str, list[float]] = {}  # CPU ms of each read() while sampling, by how many processes ran


def sample(backend: NvmlBackend, seconds: float) -> list[NodeReading]:
    readings = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.process_time()
        reading = backend.read()
        READ_MS.setdefault(f"{len(reading.gpus[0].processes)} process(es)", []).append(
            (time.process_time() - start) * 1000)
        readings.append(reading)
        time.sleep(POLL_S)
    return readings


def gpu0(reading: NodeReading) -> GpuReading:
    return reading.gpus[0]


def poll_cost(backend: NvmlBackend, polls: int = 100) -> dict[str, float]:
    wall, cpu = [], []
    for _ in range(polls):
        w0, c0 = time.perf_counter(), time.process_time()
        backend.read()
        wall.append((time.perf_counter() - w0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    wall.sort()
    return {"wall_ms_p50": statistics.median(wall), "wall_ms_p95": wall[int(0.95 * len(wall)) - 1],
            "cpu_ms_p50": statistics.median(cpu)}


class TimedNvml:
    """pynvml with every function call timed by name (where a poll's time goes)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not callable(value) or not name.startswith("nvml"):
            return value

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return value(*args)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.calls[name] = self.calls.get(name, 0) + 1
        return timed


def poll_breakdown(node: str, polls: int = 50) -> list[tuple[str, float, float]]:
    """(NVML function, ms per poll, calls per poll), slowest first."""
    import pynvml

    nvml = TimedNvml(pynvml)
    backend = NvmlBackend(node, nvml=nvml)
    backend.read()
    nvml.seconds.clear()
    nvml.calls.clear()
    for _ in range(polls):
        backend.read()
    return sorted(((name, 1000 * total / polls, nvml.calls[name] / polls) for name, total in nvml.seconds.items()),
                  key=lambda row: -row[1])


def profile(backend: NvmlBackend, name: str, seconds: float, scratch: Path) -> dict[str, Any]:
    code = WORKLOADS[name]
    child = start(code, [str(seconds + 2)], scratch) if code else None
    try:
        readings = sample(backend, seconds)
    finally:
        stop(child)
    gpus = [gpu0(r) for r in readings]
    util = [g.sm_util_pct or 0.0 for g in gpus]
    power = [g.power_draw_w or 0.0 for g in gpus]
    limit = gpus[-1].power_limit_w
    fake = [DEFAULT_USEFUL_RULE.is_fake_busy(g.sm_util_pct or 0.0, g.power_draw_w, g.power_limit_w) for g in gpus]
    useful = [DEFAULT_USEFUL_RULE.useful_pct(g.sm_util_pct, g.power_draw_w, g.power_limit_w) or 0.0 for g in gpus]
    own = [p for g in gpus for p in g.processes if child is not None and p.pid == child.process.pid]
    return {
        "workload": name, "samples": len(gpus), "sm_util_mean": statistics.fmean(util),
        "power_w_mean": statistics.fmean(power), "power_limit_w": limit,
        "power_pct_mean": 100 * statistics.fmean(power) / limit if limit else None,
        "fake_busy_share": sum(fake) / len(fake), "useful_mean": statistics.fmean(useful),
        "pid_seen": bool(own), "pids_listed": sorted({p.pid for g in gpus for p in g.processes}),
        "child_pid": child.process.pid if child else None,
        "proc_mem_mib_p50": statistics.median([p.used_memory_mib or 0.0 for p in own]) if own else None,
        "proc_sm_p50": _median_or_none([p.sm_util_pct for p in own if p.sm_util_pct is not None]),
        "series": [(g.sm_util_pct, g.power_draw_w) for g in gpus],
    }


def _median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def taskprolog_env(scratch: Path) -> dict[str, str]:
    """The shipped TaskProlog's exports for a job with JOB_SHARDS of SHARDS_PER_GPU shards."""
    per_gpu = scratch / "shards-per-gpu"
    per_gpu.write_text(f"{SHARDS_PER_GPU}\n")
    env = dict(os.environ, SLURM_SHARDS_ON_NODE=str(JOB_SHARDS), SLURM_AIGC_SHARDS_PER_GPU_FILE=str(per_gpu))
    done = subprocess.run([sys.executable, str(ROOT / "daemon/slurm-aigc-taskprolog")], env=env,
                          capture_output=True, text=True, check=True)
    exports = {}
    for line in done.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        exports[name] = value
    return exports


def memory_guard(backend: NvmlBackend, seconds: float, scratch: Path) -> dict[str, Any]:
    exports = taskprolog_env(scratch)
    total_mib = gpu0(backend.read()).memory_total_mib or 0.0
    limit_mib = total_mib * JOB_SHARDS / SHARDS_PER_GPU
    children: dict[str, Child] = {}
    hold = str(seconds + 30)
    try:
        children["neighbour"] = start(ALLOC, [hold, "5"], scratch, exports)
        children["capped"] = start(ALLOC, [hold, "12"], scratch, exports, wrapper=str(ROOT / "daemon/slurm-aigc-torchlimit"))
        children["hog"] = start(ALLOC, [hold, "12"], scratch, exports)
        children["jax"] = start(JAX, [hold], scratch, exports)
        readings = sample(backend, seconds)
        alive = {name: child.process.poll() is None for name, child in children.items()}
    finally:
        for child in children.values():
            stop(child)
    pid_jobs: dict[int, str | None] = {child.process.pid: name for name, child in children.items()}
    series: dict[str, list[Sample]] = {name: [] for name in children}
    for reading in readings:
        ts = reading.ts.timestamp()
        for use in job_gpu_usage(reading, pid_jobs):
            series[use.job_id].append(Sample(ts, use.sm_util_pct, use.memory_used_mib))
    now = readings[-1].ts.timestamp()
    out: dict[str, Any] = {"exports": exports, "limit_mib": limit_mib, "gpu_total_mib": total_mib, "jobs": {}}
    for name, child in children.items():
        samples = series[name]
        window = JobWindow(JobMeta(name, "infer", readings[0].ts.timestamp(), None, True),
                           (GpuSeries(backend.node, 0, tuple(samples)),) if samples else ())
        verdict = judge_memory(window, limit_mib, 3, now, 10.0, allowance_mib=ReclaimConfig().over_memory_allowance_mib)
        out["jobs"][name] = {
            "first_line": child.first_line,
            "still_running": alive[name], "samples": len(samples),
            "memory_mib_p50": statistics.median([s.memory_used_mib or 0.0 for s in samples]) if samples else None,
            "verdict": verdict.reason if verdict else None,
        }
    return out


def measure(backend: NvmlBackend, seconds: float, scratch: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Parts 2 and 3, printed as they go; returns the profiles and the memory-guard result."""
    profiles = []
    print(f"\n{'workload':<11} {'SM %':>5} {'W':>6} {'% lim':>6} {'fake':>5} {'useful':>6}  own process (MiB, SM %)")
    for name in WORKLOADS:
        row = profile(backend, name, seconds, scratch)
        profiles.append(row)
        own = ("-" if row["child_pid"] is None else
               f"{row['proc_mem_mib_p50']:.0f}, {row['proc_sm_p50'] if row['proc_sm_p50'] is not None else '- (alone)'}"
               if row["pid_seen"] else
               f"pid {row['child_pid']} not listed; NVML lists {row['pids_listed']}")
        print(f"{name:<11} {row['sm_util_mean']:>5.0f} {row['power_w_mean']:>6.0f} {row['power_pct_mean'] or 0:>6.1f} "
              f"{row['fake_busy_share']:>5.2f} {row['useful_mean']:>6.0f}  {own}")
    guard = memory_guard(backend, seconds, scratch)
    print(f"\nmemory guard: TaskProlog exports {guard['exports']}; shards' limit {guard['limit_mib'] / 1024:.2f} GiB "
          f"of {guard['gpu_total_mib'] / 1024:.1f}")
    for name, job in guard["jobs"].items():
        memory = "-" if job["memory_mib_p50"] is None else f"{job['memory_mib_p50']:.0f} MiB"
        print(f"  {name:<10} {job['first_line'][:60]:<60} running={job['still_running']} samples={job['samples']} "
              f"memory={memory} verdict={job['verdict'] or '-'}")
    return profiles, guard


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="sampling time per workload")
    parser.add_argument("--json", type=Path, help="write every figure and sample here")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_real_gpu: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_real_gpu: no CUDA GPU", file=sys.stderr)
        return 2
    backend = NvmlBackend(os.uname().nodename)
    first = backend.read()
    gpu = gpu0(first)
    print(f"GPU 0: {gpu.name}, {gpu.memory_total_mib:.0f} MiB, power limit {gpu.power_limit_w} W, "
          f"driver {first.driver_version}, {len(first.gpus)} GPU(s), NVLink links {len(gpu.nvlink)}")
    cost = poll_cost(backend)
    print(f"NvmlBackend.read(): wall p50 {cost['wall_ms_p50']:.2f} ms, p95 {cost['wall_ms_p95']:.2f} ms, "
          f"CPU p50 {cost['cpu_ms_p50']:.2f} ms")
    breakdown = poll_breakdown(backend.node)
    print("  per poll: " + ", ".join(f"{name.removeprefix('nvmlDevice')} {ms:.2f} ms ({calls:g}x)"
                                     for name, ms, calls in breakdown[:6]))
    with tempfile.TemporaryDirectory(prefix="bench_real_gpu-") as temp:
        profiles, guard = measure(backend, args.seconds, Path(temp))
    print("\nNvmlBackend.read() CPU while sampling, by processes on GPU 0: " + ", ".join(
        f"{key}: p50 {statistics.median(values):.2f} ms ({len(values)} reads)" for key, values in sorted(READ_MS.items())))
    backend.close()
    if args.json:
        args.json.write_text(json.dumps({"gpu": gpu.name, "driver": first.driver_version, "poll": cost,
                                         "poll_breakdown": breakdown, "read_ms": READ_MS, "profiles": profiles,
                                         "memory_guard": guard}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
