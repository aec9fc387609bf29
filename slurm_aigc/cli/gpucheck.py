"""`slurm-aigc gpu-check`: the agent's view of a real GPU machine, checked against nvidia-smi.

One dry-run poll through the agent's NVML backend (nothing is published or acted on), the
real `nvidia-smi topo -m` through the `topo show` parser and, where PyTorch is installed, a
small load whose process must appear on its GPU with memory and utilization as the agent sees
it. Everything lands in one table; any disagreement with `nvidia-smi --query-gpu=...` (count,
UUID, name, total memory, driver) or a load the agent does not see makes the exit status 1.
scripts/gpu-check.sh is the wrapper to run on a GPU machine.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import click

from slurm_aigc.errors import AigcError
from slurm_aigc.telemetry.nvml import NvmlBackend, TextRunner, run_nvidia_smi
from slurm_aigc.telemetry.records import GpuProcess, GpuReading, NodeReading
from slurm_aigc.telemetry.topology import parse_topo_matrix

SMI_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version")
SMI_QUERY = ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
MEMORY_TOLERANCE_MIB = 1.0  # nvidia-smi prints whole MiB; NVML gives bytes
# The load: a matmul loop on the one GPU CUDA_VISIBLE_DEVICES names, for argv[1] seconds.
LOAD_SCRIPT = """import sys, time, torch
x = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(sys.argv[1])
while time.time() < end:
    (x @ x).sum().item()
"""


@dataclass(frozen=True)
class SmiGpu:
    """One row of `nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version`."""

    index: int
    uuid: str
    name: str
    memory_total_mib: float
    driver_version: str


@dataclass
class CheckResult:
    """What the check saw and every disagreement found (empty `mismatches`: all agree)."""

    reading: NodeReading
    smi: list[SmiGpu]
    topo_gpus: int | None = None
    load: GpuProcess | None = None
    load_gpu: int | None = None
    notes: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


def parse_smi_query(text: str) -> list[SmiGpu]:
    """Rows of SMI_QUERY's output; a row that does not fit is an AigcError quoting it."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split(",")]
        try:
            index, uuid, name, memory, driver = parts  # names hold no commas (NVML's own strings)
            rows.append(SmiGpu(int(index), uuid, name, float(memory), driver))
        except ValueError:
            raise AigcError(f"unexpected `{' '.join(SMI_QUERY)}` line: {line!r}") from None
    return rows


def compare(reading: NodeReading, smi: Sequence[SmiGpu]) -> list[str]:
    """Disagreements between the agent's poll and nvidia-smi, one sentence each."""
    found = []
    if len(reading.gpus) != len(smi):
        found.append(f"GPU count: agent {len(reading.gpus)}, nvidia-smi {len(smi)}")
    by_index = {row.index: row for row in smi}
    for gpu in reading.gpus:
        row = by_index.get(gpu.index)
        if row is None:
            found.append(f"GPU {gpu.index}: not in nvidia-smi")
        elif gpu.lost:
            found.append(f"GPU {gpu.index}: lost mid-poll ({gpu.error})")
        else:
            found += [f"GPU {gpu.index}: {what}" for what in _field_mismatches(gpu, row)]
    drivers = {row.driver_version for row in smi}
    if smi and drivers != {reading.driver_version}:
        found.append(f"driver: agent {reading.driver_version}, nvidia-smi {', '.join(sorted(drivers))}")
    return found


def _field_mismatches(gpu: GpuReading, row: SmiGpu) -> list[str]:
    found = []
    if gpu.uuid != row.uuid:
        found.append(f"uuid agent {gpu.uuid}, nvidia-smi {row.uuid}")
    if gpu.name != row.name:
        found.append(f"name agent {gpu.name!r}, nvidia-smi {row.name!r}")
    if gpu.memory_total_mib is None or abs(gpu.memory_total_mib - row.memory_total_mib) > MEMORY_TOLERANCE_MIB:
        found.append(f"memory.total agent {gpu.memory_total_mib} MiB, nvidia-smi {row.memory_total_mib:.0f} MiB")
    return found


# A started load: its pid and a function that stops it.
LoadHandle = tuple[int, Callable[[], None]]
LoadStarter = Callable[[GpuReading, float], LoadHandle]


def start_torch_load(gpu: GpuReading, seconds: float) -> LoadHandle:
    """`python -c LOAD_SCRIPT` on `gpu` alone (CUDA_VISIBLE_DEVICES=<its UUID>)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu.uuid or str(gpu.index), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    process = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(seconds)], env=env)

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.pid, stop


def watch_load(backend: Any, gpu_index: int, pid: int, timeout_s: float,
               clock: Callable[[], float] = time.monotonic, interval_s: float = 0.5) -> GpuProcess | None:
    """Poll the agent's backend until `pid` is on `gpu_index` with memory and an SM sample.

    A process alone on its GPU has no per-process sample (the backend asks only for shared
    GPUs); it gets the GPU's SM, as attribution gives it, once that reads above 0. Returns the
    last sighting (possibly without utilization: the driver may keep no sample), None when the
    pid never appeared before `timeout_s`.
    """
    deadline = clock() + timeout_s
    seen: GpuProcess | None = None
    while True:
        gpu = next((g for g in backend.read().gpus if g.index == gpu_index), None)
        seen = next((p for p in (gpu.processes if gpu else ()) if p.pid == pid), seen)
        if seen is not None and gpu is not None and seen.sm_util_pct is None and len(gpu.processes) == 1 \
                and gpu.processes[0].pid == pid and gpu.sm_util_pct:
            seen = replace(seen, sm_util_pct=gpu.sm_util_pct)
        if seen is not None and seen.used_memory_mib and seen.sm_util_pct is not None:
            return seen
        if clock() > deadline:
            return seen
        time.sleep(interval_s)


def run_check(backend: Any, smi: TextRunner, load: LoadStarter | None, load_seconds: float = 20.0) -> CheckResult:
    """The whole check against `backend` (NvmlBackend or a fake) and an nvidia-smi runner."""
    reading = backend.read()
    result = CheckResult(reading, parse_smi_query(smi(SMI_QUERY)))
    result.mismatches += compare(reading, result.smi)
    matrix = parse_topo_matrix(smi(["nvidia-smi", "topo", "-m"]))
    result.topo_gpus = len(matrix.gpus)
    if result.topo_gpus != len(result.smi):
        result.mismatches.append(f"topo -m: {result.topo_gpus} GPUs, nvidia-smi --query-gpu {len(result.smi)}")
    if load is None:
        result.notes.append("load: skipped (PyTorch not installed, or --no-load)")
    elif reading.gpus:
        _check_load(backend, load, reading.gpus[0], load_seconds, result)
    return result


def _check_load(backend: Any, load: LoadStarter, gpu: GpuReading, seconds: float, result: CheckResult) -> None:
    pid, stop = load(gpu, seconds)
    try:
        result.load, result.load_gpu = watch_load(backend, gpu.index, pid, timeout_s=seconds), gpu.index
    finally:
        stop()
    if result.load is None:
        result.mismatches.append(f"load pid {pid} never appeared on GPU {gpu.index} (another PID namespace?)")
    elif not result.load.used_memory_mib:
        result.mismatches.append(f"load pid {pid} on GPU {gpu.index} shows no memory")
    elif result.load.sm_util_pct is None:
        result.notes.append(f"load pid {pid}: no per-process utilization sample from the driver")


def render(result: CheckResult) -> str:
    """The one table, then topology, load, notes and mismatches."""
    smi = {row.index: row for row in result.smi}
    header = ("GPU", "UUID", "name", "MiB total (agent/smi)", "MiB used", "SM %", "processes (pid:MiB:SM%)")
    rows = [header] + [_row(gpu, smi.get(gpu.index)) for gpu in result.reading.gpus]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.append(f"driver: agent {result.reading.driver_version}; topo -m: {result.topo_gpus} GPUs")
    if result.load is not None:
        lines.append(f"load: pid {result.load.pid} on GPU {result.load_gpu}: {_num(result.load.used_memory_mib)} MiB, "
                     f"SM {_num(result.load.sm_util_pct)} %")
    lines += [f"note: {note}" for note in result.notes]
    lines += [f"MISMATCH: {what}" for what in result.mismatches] or ["all agree with nvidia-smi"]
    return "\n".join(lines)


def _row(gpu: GpuReading, smi: SmiGpu | None) -> tuple[str, ...]:
    procs = " ".join(f"{p.pid}:{_num(p.used_memory_mib)}:{_num(p.sm_util_pct)}" for p in gpu.processes) or "-"
    smi_total = "-" if smi is None else f"{smi.memory_total_mib:.0f}"
    return (str(gpu.index), gpu.uuid or "?", gpu.name or "?", f"{_num(gpu.memory_total_mib)}/{smi_total}",
            _num(gpu.memory_used_mib), _num(gpu.sm_util_pct), procs if not gpu.lost else f"LOST: {gpu.error}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


@click.command("gpu-check")
@click.option("--load/--no-load", "with_load", default=None, help="Run the PyTorch load (default: when torch is installed).")
@click.option("--load-seconds", type=click.FloatRange(1, 600), default=20.0, show_default=True,
              help="How long the load runs (and how long the agent may take to see it).")
def gpu_check(with_load: bool | None, load_seconds: float) -> None:
    """Check the agent's NVML view of this machine against nvidia-smi (exit 1 on any mismatch)."""
    torch_present = importlib.util.find_spec("torch") is not None
    if with_load and not torch_present:
        raise click.UsageError("--load needs PyTorch (pip install torch)")
    use_load = torch_present if with_load is None else with_load
    backend = NvmlBackend(os.uname().nodename)
    try:
        result = run_check(backend, run_nvidia_smi, start_torch_load if use_load else None, load_seconds)
    finally:
        backend.close()
    click.echo(render(result))
    if result.mismatches:
        raise click.ClickException(f"{len(result.mismatches)} mismatch(es) between the agent and nvidia-smi")

