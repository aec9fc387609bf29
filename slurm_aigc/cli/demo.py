"""`slurm-aigc demo`: the README's main command, end to end on this machine.

Installs what is missing, brings the local cluster up, installs the hook with the default
policy, replays a few minutes of an AIGC job mix generated from public traces (the shared
traces when present, else the project's small trace fixtures) with agents and the
controller running, and ends with the report: a terminal table and an HTML file.
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime
from pathlib import Path

import click

from slurm_aigc.cli.replay_run import local_run_settings
from slurm_aigc.cli.replay_traces import GeneratorChoice, default_trace_input, workload_from_traces
from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.localcluster.shape import DEFAULT_SHAPE
from slurm_aigc.policy.paths import default_policy
from slurm_aigc.replay.compare import metrics_of
from slurm_aigc.replay.runner import SLURM_AIGC_BIN, ReplayRun
from slurm_aigc.replay.workload_files import write_workload


def _step(message: str) -> None:
    click.echo(click.style(f"==> {message}", bold=True), err=True)


def _progress(message: str) -> None:
    click.echo(f"    {message}", err=True)


@click.command()
@click.option("--minutes", type=float, default=2.0, show_default=True, help="Minutes over which the demo's jobs arrive.")
@click.option("--shape", default=DEFAULT_SHAPE, show_default=True, help="Cluster shape (TYPE:GPUSxNODES,...).")
@click.option("--trace", type=click.Choice(["mix", "alibaba-2023", "genai-2026", "philly"]), default="mix", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("demo-out"), show_default=True)
@click.option("--cleanup", is_flag=True, help="Stop the cluster and remove its state at the end.")
def demo(minutes: float, shape: str, trace: str, seed: int, out_dir: Path, cleanup: bool) -> None:
    """Local GPU Slurm + hook + agents + controller on an AIGC job mix, ending in a report."""
    started = time.time()
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(progress=_progress)
    _step("local cluster: install and bring up")
    cluster.up(shape, install=True, replace=True)
    policy = default_policy()
    _step(f"workload: {trace} trace(s) from {default_trace_input()}, {minutes:g} minutes, seed {seed}")
    workload, _ = workload_from_traces(GeneratorChoice(
        trace=trace, input_path=None, seed=seed, minutes=minutes, capacity_gpus=cluster.shape().total_gpus,
        overrides=(f"max_duration_s={max(45.0, 40 * minutes):g}",)))
    write_workload(workload, out_dir / "workload.csv")
    _progress(f"{len(workload.jobs)} jobs written to {out_dir / 'workload.csv'}")
    _step(f"replay with slurm-aigc: hook + policy {policy}, agents, controller")
    since = datetime.now().replace(microsecond=0)
    run = ReplayRun(workload, local_run_settings(policy, out_dir, mode="aigc"), cluster, _progress)
    record = run.run()
    metrics = metrics_of(record)
    _progress(f"makespan {metrics.makespan_s:.0f} s, effective utilization {100 * metrics.effective_utilization:.1f} %, "
              f"allocation {100 * metrics.allocation_ratio:.1f} %, reclaimed {metrics.gpu_hours_reclaimed:.3f} GPU-h")
    _step("report")
    html = out_dir / "report.html"
    report_args = ["report", "--since", since.isoformat(), "--db", run.db_url, "--group-by", "class"]
    subprocess.run([SLURM_AIGC_BIN, *report_args], check=False)
    subprocess.run([SLURM_AIGC_BIN, *report_args, "--format", "html", "--output", str(html)], check=False)
    click.echo(f"\nHTML report: {html}")
    click.echo(f"sinfo / sacct: run `sinfo` and `sacct -a -X -S {since.isoformat()}`; cluster state in {cluster.state_dir}")
    if cleanup:
        _step("cleanup")
        cluster.down(purge=True)
    click.echo(f"demo finished in {time.time() - started:.0f} s")
