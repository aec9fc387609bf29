"""`slurm-aigc replay --workload FILE` and `slurm-aigc replay compare`: run workloads on the local cluster."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from slurm_aigc.cli.replay_traces import GeneratorChoice, generator_options, positive_float, workload_from_traces
from slurm_aigc.errors import ClusterError
from slurm_aigc.localcluster.config import NOOP_HOOK_LUA, TEST_USERS
from slurm_aigc.localcluster.manager import LocalCluster
from slurm_aigc.localcluster.shape import parse_shape
from slurm_aigc.policy.paths import default_policy
from slurm_aigc.policy.site import load_site_policy
from slurm_aigc.replay.compare import (
    backlog_json,
    backlog_of,
    backlog_rows,
    comparison_json,
    comparison_rows,
    metrics_of,
    plot_utilization,
    render_table,
)
from slurm_aigc.replay.runner import MODES, RunSettings, run_modes
from slurm_aigc.replay.timescale import compression_report
from slurm_aigc.replay.workload import MAX_SECONDS, Workload
from slurm_aigc.replay.workload_files import read_workload, write_workload
from slurm_aigc.report.figures import UsefulRule, useful_rules

COMPARE_SHAPE = "a100:8x6,t4:4x10"
# A backlogged run must not run out of jobs: the stream is generated with this much demand over
# the window (x capacity) unless --load says otherwise; `stream_exhausted` reports a shortfall.
BACKLOG_LOAD = 4.0

backlog_option = click.option(
    "--backlog", type=click.IntRange(min=1), default=None,
    help="Backlogged mode: keep K jobs pending (the next job of the stream is submitted whenever fewer are) "
         "for --duration-s seconds, then cancel what is left; figures cover that window.")


def _progress(message: str) -> None:
    click.echo(f"[replay] {message}", err=True)


def compression_lines(workload: Workload, policy: Path | None, replay_s: float | None = None) -> list[str]:
    """Which compression applies and whether the site's reclaim windows, scaled by it, can fire."""
    try:
        return compression_report(workload, load_site_policy(policy).reclaim, replay_s)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--workload") from error


def local_run_settings(policy: Path | None, out_dir: Path, timeout_s: float = 1800.0, mode: str = MODES[0],
                       backlog: int | None = None, duration_s: float | None = None, db: str | None = None) -> RunSettings:
    """Run settings for the local cluster: its test users submit, its no-op hook is stock mode's."""
    if backlog is not None and not duration_s:
        raise click.UsageError("--backlog needs --duration-s (how long to keep the backlog)")
    if duration_s is not None and duration_s <= 0:
        raise click.BadParameter("must be > 0", param_hint="--duration-s")
    return RunSettings(mode=mode, policy=policy or default_policy(), out_dir=out_dir, users=TEST_USERS,
                       passthrough_hook=NOOP_HOOK_LUA, timeout_s=timeout_s, backlog=backlog or 0,
                       duration_s=(duration_s or 0.0) if backlog else 0.0, db=db)


def useful_rule(policy: Path | None) -> tuple[UsefulRule, list[str]]:
    """What counts as useful SM time: the reclaim defaults' thresholds of the policy (the same for
    both runs), and a warning when classes set their own: the replay's samples are per GPU, and a
    shared GPU's jobs can be of several classes, so only the report judges by class."""
    default, by_class = useful_rules(load_site_policy(policy).reclaim)
    if not by_class:
        return default, []
    return default, [f"warning: useful utilization judges every GPU by reclaim.defaults' thresholds; "
                     f"{', '.join(sorted(by_class))} set their own (reclaim and `slurm-aigc report` use them)"]


def per_mode(settings: RunSettings) -> list[tuple[str, RunSettings]]:
    """`compare`'s runs in MODES order. A given database is the slurm-aigc run's alone: stock Slurm
    runs no controller to use a learned table, and its agents' samples must not join that history."""
    return [(mode, dataclasses.replace(settings, mode=mode, db=settings.db if mode == "aigc" else None)) for mode in MODES]


@click.command("run")
@click.option("--workload", "workload_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True)
@click.option("--mode", type=click.Choice(MODES), default="aigc", show_default=True,
              help="aigc: hook + policy + agents + controller; stock: pass-through hook, agents only observe.")
@click.option("--policy", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Policy file (default: the installed one).")
@click.option("--out-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("replay-out"), show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True, help="Give up waiting after this many seconds.")
@backlog_option
@click.option("--duration-s", type=positive_float(MAX_SECONDS), default=None,
              help="With --backlog: how long to keep the backlog.")
@click.option("--db", "db", default=None, metavar="URL|FILE",
              help="Daemons' database, kept as it is (e.g. an earlier run's, for a warm learned table); "
                   "default: a fresh one per run.")
def run_workload_command(workload_path: Path, mode: str, policy: Path | None, out_dir: Path, timeout_s: float,
                         backlog: int | None = None, duration_s: float | None = None, db: str | None = None) -> None:
    """Run one workload file on the running local cluster and print its figures."""
    settings = local_run_settings(policy, out_dir, timeout_s, backlog=backlog, duration_s=duration_s, db=db)
    workload = read_workload(workload_path)
    rule, rule_notes = useful_rule(policy)
    for line in [*compression_lines(workload, policy, duration_s if backlog else None), *rule_notes]:
        click.echo(line, err=True)
    cluster = LocalCluster(progress=_progress)
    [record] = run_modes(workload, [mode], settings, cluster, _progress)
    figures = (backlog_of(record, rule) if backlog else metrics_of(record, rule)).to_dict()
    (out_dir / f"{mode}-metrics.json").write_text(json.dumps(figures, indent=1))
    for key, value in figures.items():
        if key != "waits":
            click.echo(f"{key:28} {value}")


@click.command("compare")
@generator_options
@click.option("--workload", "workload_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Run this workload file instead of generating one from --trace.")
@click.option("--shape", default=COMPARE_SHAPE, show_default=True, help="Cluster shape for both runs (TYPE:GPUSxNODES,...).")
@click.option("--policy", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="slurm-aigc policy for the aigc run (default: the installed one).")
@click.option("--out-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("replay-out"), show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True, help="Per run.")
@backlog_option
@click.option("--db", "db", default=None, metavar="URL|FILE",
              help="The slurm-aigc run's database, kept as it is (e.g. an earlier run's, for a warm learned "
                   "table); the stock run always gets a fresh one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def compare(workload_path: Path | None, shape: str, policy: Path | None, out_dir: Path, timeout_s: float,
            backlog: int | None, as_json: bool, db: str | None = None, **generator: Any) -> None:
    """Run the same workload on stock Slurm and on slurm-aigc; print the figures side by side.

    With --backlog K --duration-s D both runs take the same ordered job stream and keep K jobs
    pending for D seconds (backlogged mode); without, jobs arrive at their workload offsets.
    """
    duration_s = generator["duration_s"] or (60 * generator["minutes"] if generator["minutes"] else None)
    settings = local_run_settings(policy, out_dir, timeout_s, backlog=backlog, duration_s=duration_s, db=db)
    if backlog and generator.get("load_target") is None:
        generator["load_target"] = BACKLOG_LOAD
    # Everything that can be refused is, before the cluster is replaced: the shape, the workload
    # (its `# compression:` line too) and the policy.
    try:
        capacity_gpus = parse_shape(shape).total_gpus
    except ClusterError as error:
        raise click.BadParameter(str(error), param_hint="--shape") from error
    workload = _workload(workload_path, generator, capacity_gpus)
    rule, rule_notes = useful_rule(policy)
    reach = [*compression_lines(workload, policy, duration_s if backlog else None), *rule_notes]
    for line in reach:
        click.echo(line, err=True)
    cluster = LocalCluster(progress=_progress)
    cluster.up(shape, install=False, replace=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_workload(workload, out_dir / "workload.csv")
    stock, aigc = [run_modes(workload, [mode], each, cluster, _progress)[0] for mode, each in per_mode(settings)]
    plot = plot_utilization([stock, aigc], out_dir / "utilization.png", useful=rule)
    extra = {
        "shape": shape, "jobs": len(workload.jobs), "workload": str(out_dir / "workload.csv"),
        "workload_meta": {k: v for k, v in workload.meta.items() if k != "params"}, "plot": str(plot),
        "compression": reach[0], "warnings": reach[1:], "useful_rule": dataclasses.asdict(rule),
    }
    if backlog:
        stock_window, aigc_window = backlog_of(stock, rule), backlog_of(aigc, rule)
        document = backlog_json(stock_window, aigc_window, {**extra, "backlog": backlog, "duration_s": duration_s})
        rows = backlog_rows(stock_window, aigc_window)
        if stock.stream_exhausted or aigc.stream_exhausted:
            click.echo("warning: the job stream ran out before the window ended; raise --load or --max-jobs", err=True)
    else:
        stock_metrics, aigc_metrics = metrics_of(stock, rule), metrics_of(aigc, rule)
        document = comparison_json(stock_metrics, aigc_metrics, extra)
        rows = comparison_rows(stock_metrics, aigc_metrics)
    (out_dir / "compare.json").write_text(json.dumps(document, indent=1))
    if as_json:
        click.echo(json.dumps(document))
        return
    click.echo(render_table(rows))
    click.echo(f"\nplot: {plot}\njson: {out_dir / 'compare.json'}")


def _workload(workload_path: Path | None, generator: dict[str, Any], capacity_gpus: int) -> Workload:
    if workload_path is not None:
        return read_workload(workload_path)
    if generator.get("capacity_gpus") is None:
        generator["capacity_gpus"] = capacity_gpus
    if generator.get("max_jobs") is None:
        # The generator's default cap (150) suits the 24-GPU cluster; keep the same jobs per GPU on bigger shapes.
        generator["max_jobs"] = max(150, 3 * generator["capacity_gpus"])
    if generator.get("trace") is None:
        generator["trace"] = "mix"
    workload, _ = workload_from_traces(GeneratorChoice(**generator))
    return workload
