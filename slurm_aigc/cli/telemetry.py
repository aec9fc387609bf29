"""Telemetry commands: `slurm-aigc topo show` and `slurm-aigc gpu-load` (the agent joins later).

Commands are module-level attributes registered by `slurm_aigc.cli.main.COMMANDS`:
`topo` (group), `gpu_load`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from slurm_aigc.telemetry.backends import open_backend
from slurm_aigc.telemetry.loadgen import (
    PROFILES,
    GpuOutOfMemory,
    LoadRun,
    Profile,
    make_plan,
    node_name,
    parse_profile_spec,
)
from slurm_aigc.telemetry.simgpu import SimGpuBackend, default_simgpu_dir, read_inventory
from slurm_aigc.telemetry.topology import TopologyMatrix, parse_topo_matrix
from slurm_aigc.textfmt import text_table
from slurm_aigc.validation import parse_size_gib

# --------------------------------------------------------------------------- topo


@click.group()
def topo() -> None:
    """GPU/NIC topology (`nvidia-smi topo -m`)."""


@topo.command("show")
@click.option("--input", "input_path", type=click.Path(dir_okay=False, allow_dash=True), help="Read this `topo -m` text ('-': stdin).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document (gpus, nics, links, nvlink_islands).")
@click.option("--backend", type=click.Choice(["nvml", "sim"]), default="nvml", show_default=True, help="Live source without --input.")
@click.option("--node", default=None, help="Node name for --backend sim (default: SLURMD_NODENAME or host name).")
@click.option("--simgpu-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Simulated GPU dir (default: $SLURM_AIGC_SIMGPU_DIR).")
def topo_show(input_path: str | None, as_json: bool, backend: str, node: str | None, simgpu_dir: Path | None) -> None:
    """Parse and show the topology: from FILE, or the live machine (`nvidia-smi topo -m`)."""
    text = _topology_text(input_path, backend, node, simgpu_dir)
    matrix = parse_topo_matrix(text)
    if as_json:
        click.echo(json.dumps(matrix.to_json(), indent=2))
    else:
        click.echo(render_matrix(matrix))


def _topology_text(input_path: str | None, backend: str, node: str | None, simgpu_dir: Path | None) -> str:
    if input_path == "-":
        return sys.stdin.read()
    if input_path:
        return Path(input_path).read_text(encoding="utf-8", errors="replace")
    name = node or node_name(os.environ)
    # For nvml this starts NVML too, so a missing driver is the clear NvmlUnavailableError.
    source = open_backend("sim" if backend == "sim" else "nvml", name, simgpu_dir)
    try:
        text = source.topology_text()
    finally:
        source.close()
    if text is None:
        raise click.ClickException(f"backend {backend} has no topology for node {name}")
    return text


def render_matrix(matrix: TopologyMatrix) -> str:
    """A human summary: GPUs with affinities, NICs, the link matrix and NVLink islands."""
    names = [f"GPU{g.index}" for g in matrix.gpus] + list(matrix.nics)
    rows = [[row, *("X" if row == col else (link.code if (link := matrix.link(row, col)) else "?") for col in names)]
            for row in names]
    lines = [text_table(["", *names], rows, rule=False), ""]
    for gpu in matrix.gpus:
        lines.append(f"GPU{gpu.index}: cpu_affinity={gpu.cpu_affinity or '-'} numa_affinity={gpu.numa_affinity or '-'}")
    lines.append(f"nvlink_islands: {matrix.nvlink_islands()}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- gpu-load


def _size_gib(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_size_gib(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


@click.command("gpu-load")
@click.option("--util", "util_pct", type=click.FloatRange(0, 100), default=85.0, show_default=True, help="SM utilization % in busy phases.")
@click.option("--mem", "mem_gib", default="10G", show_default=True, callback=_size_gib, help="Memory per GPU (e.g. 30G, 512M).")
@click.option("--seconds", type=click.FloatRange(min=0), default=600.0, show_default=True, help="Run time; 0 runs until killed.")
@click.option("--until-killed", is_flag=True, help="Same as --seconds 0 (for services).")
@click.option("--power-factor", type=click.FloatRange(min=0), default=1.0, show_default=True, help="Scales power draw per % util.")
@click.option("--profile", "profile_name", type=click.Choice(sorted(PROFILES)), default=None, help="A named load profile.")
@click.option("--profile-spec", default=None, help='Phases, e.g. "loading:30,busy:120,idle:60" (append ",repeat" to cycle).')
@click.option("--gpus", default=None, help="GPU indices (default: from SLURM_STEP_GPUS/SLURM_JOB_GPUS/CUDA_VISIBLE_DEVICES).")
@click.option("--simgpu-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Simulated GPU dir (default: $SLURM_AIGC_SIMGPU_DIR).")
@click.option("--work-conserving", is_flag=True,
              help="Busy phases measure work: they last longer while the GPU's processes ask for more than 100 % SM.")
def gpu_load(
    util_pct: float,
    mem_gib: float,
    seconds: float,
    until_killed: bool,
    power_factor: float,
    profile_name: str | None,
    profile_spec: str | None,
    gpus: str | None,
    simgpu_dir: Path | None,
    work_conserving: bool,
) -> None:
    """Put a simulated load on this job's GPUs (run inside a Slurm job on the local cluster)."""
    if profile_name and profile_spec:
        raise click.UsageError("use --profile or --profile-spec, not both")
    profile: Profile = parse_profile_spec(profile_spec) if profile_spec else PROFILES[profile_name or "busy"]
    directory = simgpu_dir or default_simgpu_dir()
    explicit = None if gpus is None else _gpu_list(gpus)
    plan = make_plan(os.environ, directory, profile, util_pct, mem_gib, power_factor, 0.0 if until_killed else seconds, explicit,
                     work_conserving)
    _, inventory, _ = read_inventory(directory, plan.node)
    run = LoadRun(plan, directory, time.monotonic, live_loads=SimGpuBackend(plan.node, directory).live_loads,
                  memory_total_mib={gpu.index: gpu.memory_total_mib for gpu in inventory})
    run.install_signal_handlers()
    click.echo(f"gpu-load pid {run.pid} on {plan.node} GPUs {list(plan.gpus)}: profile {profile.name}", err=True)
    try:
        run.run()
    except GpuOutOfMemory as error:  # the job fails, as a framework's CUDA OOM makes it exit 1
        raise click.ClickException(str(error)) from None
    except OSError as error:  # e.g. procs/ not writable for this user
        raise click.ClickException(f"cannot write the simulated load under {directory}: {error}") from None


def _gpu_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise click.BadParameter(f"expected GPU indices like 0,1, got {text!r}", param_hint="--gpus") from None


# --------------------------------------------------------------------------- agent


@click.command("agent")
@click.option("--config", "config_path", default=None, help="Policy file (default: $SLURM_AIGC_CONFIG, /etc/slurm-aigc/slurm-aigc.yaml, the shipped one).")
@click.option("--node", default=None, help="This node's Slurm NodeName (default: the one slurm.conf gives this host, `scontrol show aliases`).")
@click.option("--backend", type=click.Choice(["nvml", "sim"]), default=None, help="GPU source (default: agent.backend).")
@click.option("--simgpu-dir", default=None, help="Simulated GPU dir for --backend sim (default: agent.simgpu_dir).")
@click.option("--db", "db_url", default=None, help="SQLAlchemy URL (default $SLURM_AIGC_DB_URL or sqlite:////var/lib/slurm-aigc/state.db).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.1), default=None, help="Seconds between polls (default: agent.interval_s).")
@click.option("--once", is_flag=True, help="Poll once, print a summary, exit (1 when the poll failed).")
@click.option("--dry-run", is_flag=True, help="Read and attribute only: store nothing, change nothing in Slurm (log what would change).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, help="Serve Prometheus metrics on this port.")
def agent(
    config_path: str | None,
    node: str | None,
    backend: str | None,
    simgpu_dir: str | None,
    db_url: str | None,
    interval_s: float | None,
    once: bool,
    dry_run: bool,
    metrics_port: int | None,
) -> None:
    """The node agent: poll GPUs, attribute processes to jobs, store samples, publish static features."""
    from dataclasses import asdict

    from slurm_aigc.telemetry.agent import AgentOptions, run_agent

    options = AgentOptions(config_path, node, backend, simgpu_dir, db_url, interval_s, metrics_port, dry_run)
    status = run_agent(options, once, lambda result: click.echo(json.dumps(asdict(result), sort_keys=True)))
    sys.exit(status)
