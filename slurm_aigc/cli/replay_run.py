"""`slurm-aigc replay --workload FILE` and `slurm-aigc replay compare`: run workloads on the local cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from slurm_aigc.cli.replay_traces import GeneratorChoice, generator_options, workload_from_traces
from slurm_aigc.localcluster.config import NOOP_HOOK_LUA, TEST_USERS
from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.paths import default_policy
from slurm_aigc.replay.compare import comparison_json, comparison_rows, metrics_of, plot_utilization, render_table
from slurm_aigc.replay.runner import MODES, RunSettings, run_modes
from slurm_aigc.replay.timescale import compression_report
from slurm_aigc.replay.workload import Workload
from slurm_aigc.replay.workload_files import read_workload, write_workload

COMPARE_SHAPE = "a100:8x6,t4:4x10"


def _progress(message: str) -> None:
    click.echo(f"[replay] {message}", err=True)


def compression_lines(workload: Workload, policy: Path | None, replay_s: float | None = None) -> list[str]:
    """Which compression applies and whether the site's reclaim windows, scaled by it, can fire."""
    try:
        return compression_report(workload, load_policy(policy).reclaim, replay_s)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--workload") from error


def local_run_settings(policy: Path | None, out_dir: Path, timeout_s: float = 1800.0, mode: str = MODES[0]) -> RunSettings:
    """Run settings for the local cluster: its test users submit, its no-op hook is stock mode's."""
    return RunSettings(mode=mode, policy=policy or default_policy(), out_dir=out_dir, users=TEST_USERS,
                       passthrough_hook=NOOP_HOOK_LUA, timeout_s=timeout_s)


@click.command("run")
@click.option("--workload", "workload_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True)
@click.option("--mode", type=click.Choice(MODES), default="aigc", show_default=True,
              help="aigc: hook + policy + agents + controller; stock: pass-through hook, agents only observe.")
@click.option("--policy", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Policy file (default: the installed one).")
@click.option("--out-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("replay-out"), show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True, help="Give up waiting after this many seconds.")
def run_workload_command(workload_path: Path, mode: str, policy: Path | None, out_dir: Path, timeout_s: float) -> None:
    """Run one workload file on the running local cluster and print its figures."""
    cluster = LocalCluster(progress=_progress)
    workload = read_workload(workload_path)
    for line in compression_lines(workload, policy):
        click.echo(line, err=True)
    [record] = run_modes(workload, [mode], local_run_settings(policy, out_dir, timeout_s), cluster, _progress)
    metrics = metrics_of(record)
    (out_dir / f"{mode}-metrics.json").write_text(json.dumps(metrics.to_dict(), indent=1))
    for key, value in metrics.to_dict().items():
        if key != "waits":
            click.echo(f"{key:24} {value}")


@click.command("compare")
@generator_options
@click.option("--workload", "workload_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Run this workload file instead of generating one from --trace.")
@click.option("--shape", default=COMPARE_SHAPE, show_default=True, help="Cluster shape for both runs (TYPE:GPUSxNODES,...).")
@click.option("--policy", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="slurm-aigc policy for the aigc run (default: the installed one).")
@click.option("--out-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("replay-out"), show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True, help="Per run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def compare(workload_path: Path | None, shape: str, policy: Path | None, out_dir: Path, timeout_s: float,
            as_json: bool, **generator: Any) -> None:
    """Run the same workload on stock Slurm and on slurm-aigc; print the figures side by side."""
    cluster = LocalCluster(progress=_progress)
    cluster.up(shape, install=False, replace=True)
    workload = _workload(workload_path, generator, cluster)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_workload(workload, out_dir / "workload.csv")
    reach = compression_lines(workload, policy)
    for line in reach:
        click.echo(line, err=True)
    stock, aigc = run_modes(workload, MODES, local_run_settings(policy, out_dir, timeout_s), cluster, _progress)
    stock_metrics, aigc_metrics = metrics_of(stock), metrics_of(aigc)
    plot = plot_utilization([stock, aigc], out_dir / "utilization.png")
    document = comparison_json(stock_metrics, aigc_metrics, {
        "shape": shape, "jobs": len(workload.jobs), "workload": str(out_dir / "workload.csv"),
        "workload_meta": {k: v for k, v in workload.meta.items() if k != "params"}, "plot": str(plot),
        "compression": reach[0], "warnings": reach[1:],
    })
    (out_dir / "compare.json").write_text(json.dumps(document, indent=1))
    if as_json:
        click.echo(json.dumps(document))
        return
    click.echo(render_table(comparison_rows(stock_metrics, aigc_metrics)))
    click.echo(f"\nplot: {plot}\njson: {out_dir / 'compare.json'}")


def _workload(workload_path: Path | None, generator: dict[str, Any], cluster: LocalCluster) -> Workload:
    if workload_path is not None:
        return read_workload(workload_path)
    if generator.get("capacity_gpus") is None:
        generator["capacity_gpus"] = cluster.shape().total_gpus
    if generator.get("max_jobs") is None:
        # The generator's default cap (150) suits the 24-GPU cluster; keep the same jobs per GPU on bigger shapes.
        generator["max_jobs"] = max(150, 3 * generator["capacity_gpus"])
    if generator.get("trace") is None:
        generator["trace"] = "mix"
    workload, _ = workload_from_traces(GeneratorChoice(**generator))
    return workload
