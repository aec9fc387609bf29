"""`slurm-aigc replay ...`: turn traces or a site's sacct history into workload files, show them.

`replay convert` and `replay show` need no cluster; `replay --from-sacct --since ... --output
FILE` reads sacct (and the samples database when present). Running a workload
(`replay --workload FILE`, `replay compare`) is the runner's (slurm_aigc/replay/runner.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from slurm_aigc.cli.env import CliEnv, command_env
from slurm_aigc.cli.replay_run import backlog_option, compare, compression_lines, run_workload_command
from slurm_aigc.cli.replay_traces import COMPRESSION_TYPE, GeneratorChoice, generator_options, positive_float, workload_from_traces
from slurm_aigc.errors import AigcError, DatabaseError
from slurm_aigc.replay.from_sacct import FromSacctParams, workload_from_sacct
from slurm_aigc.replay.generator import MAX_COMPRESSION
from slurm_aigc.replay.workload import MAX_SECONDS, Workload, span_s, summarize
from slurm_aigc.replay.workload_files import read_workload, write_workload
from slurm_aigc.report.records import SampleSlice
from slurm_aigc.report.sacct import (
    JobRecord,
    SacctQuery,
    SacctReader,
    SacctRunner,
    SkippedRow,
)
from slurm_aigc.report.samples import SampleStore
from slurm_aigc.report.timespec import parse_when
from slurm_aigc.textfmt import text_table

log = logging.getLogger(__name__)



ReplayEnv = CliEnv[SacctRunner]  # `replay --from-sacct` reads sacct only


def _env(ctx: click.Context) -> ReplayEnv:
    return command_env(ctx)


@click.group(invoke_without_command=True)
@click.option("--workload", "workload_path", type=click.Path(path_type=Path, dir_okay=False), help="Run this workload file.")
@click.option("--from-sacct", is_flag=True, help="Build the workload from this site's sacct history (and samples).")
@click.option("--since", "-S", default="now-1days", show_default=True, help="With --from-sacct: start (like sacct -S).")
@click.option("--until", "-E", default="now", show_default=True, help="With --from-sacct: end (like sacct -E).")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), help="With --from-sacct: write the workload here.")
@click.option("--compression", type=COMPRESSION_TYPE, default=1.0, show_default=True,
              help="With --from-sacct: divide offsets and durations by this.")
@click.option("--max-jobs", type=click.IntRange(min=0), default=0, show_default=True, help="With --from-sacct: keep the first N jobs (0: all).")
@click.option("--db", "db_url", default=None, help="Samples database URL (default: SLURM_AIGC_DB_URL or the local SQLite file).")
@click.option("--no-samples", is_flag=True, help="With --from-sacct: ignore the samples database.")
@backlog_option
@click.option("--duration-s", type=positive_float(MAX_SECONDS), default=None, help="With --workload --backlog: how long to keep the backlog.")
@click.pass_context
def replay(
    ctx: click.Context,
    workload_path: Path | None,
    from_sacct: bool,
    since: str,
    until: str,
    output: Path | None,
    compression: float,
    max_jobs: int,
    db_url: str | None,
    no_samples: bool,
    backlog: int | None,
    duration_s: float | None,
) -> None:
    """Replay AIGC workloads from public traces or this site's history, with and without slurm-aigc."""
    if ctx.invoked_subcommand is not None:
        if workload_path or from_sacct:
            raise click.UsageError("--workload/--from-sacct go without a subcommand")
        return
    if from_sacct:
        if workload_path:
            raise click.UsageError("use either --workload or --from-sacct")
        params = FromSacctParams(compression=compression, max_jobs=max_jobs)
        _from_sacct(ctx, since, until, output, params, db_url, no_samples)
        return
    if workload_path:
        _run_workload(ctx, workload_path, backlog, duration_s)
        return
    click.echo(ctx.get_help())


def _from_sacct(
    ctx: click.Context, since: str, until: str, output: Path | None, params: FromSacctParams, db_url: str | None, no_samples: bool
) -> None:
    if output is None:
        raise click.UsageError("--from-sacct needs --output FILE (running it directly comes with the replay runner)")
    if not (0 < params.compression <= MAX_COMPRESSION):  # nan fails this too
        raise click.BadParameter(f"must be a finite number > 0 and <= {MAX_COMPRESSION}", param_hint="--compression")
    env = _env(ctx)
    now = env.now()
    # With steps: their gres/gpuutil and gres/gpumem stand in for a job's samples where none are kept.
    # The end capped at now, as in `report`: each day-long window up to a far --until is a sacct call.
    query = SacctQuery(since=_when(since, now, "--since"), until=min(_when(until, now, "--until"), now), steps=True)
    records: list[JobRecord] = []
    for row in SacctReader(env.slurm()).rows(query):
        if isinstance(row, SkippedRow):
            click.echo(f"skipped sacct line {row.line_no}: {row.reason}", err=True)
        else:
            records.append(row)
    slices = [] if no_samples else _samples(env, db_url, query, records)
    meta = {"sacct_since": query.since.isoformat(), "sacct_until": query.until.isoformat()}
    workload, omitted = workload_from_sacct(records, slices, params, meta)
    for item in omitted:
        click.echo(f"left out job {item.job_id}: {item.reason}", err=True)
    if not workload.jobs:
        raise AigcError(f"no finished GPU jobs between {query.since} and {query.until}; nothing written")
    write_workload(workload, output)
    click.echo(f"wrote {len(workload.jobs)} jobs to {output} ({len(omitted)} left out, samples for {len({s.job_id for s in slices})} jobs)")


def _samples(env: ReplayEnv, db_url: str | None, query: SacctQuery, records: Sequence[JobRecord]) -> list[SampleSlice]:
    """The jobs' samples; a missing or unreachable database means no samples (said on stderr)."""
    if not records:
        return []
    try:
        store = SampleStore(env.database(db_url))
        since = min(r.submit_ts for r in records if r.submit_ts is not None)
        until = max((r.end_ts or since) for r in records) + 1
        ids = sorted({r.job_id_raw for r in records})
        return list(store.job_slices(since, until, ids))
    except DatabaseError as error:
        click.echo(f"no samples ({error}); profiles assume busy throughout", err=True)
        return []


def _when(text: str, now: datetime, name: str) -> datetime:
    try:
        return parse_when(text, now)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=name) from error


def _run_workload(ctx: click.Context, path: Path, backlog: int | None, duration_s: float | None) -> None:
    """Validate the file, then run it on the local cluster (`replay run --workload FILE [--backlog K --duration-s D]`)."""
    from slurm_aigc.cli.replay_run import run_workload_command

    read_workload(path)
    ctx.invoke(run_workload_command, workload_path=path, backlog=backlog, duration_s=duration_s)


# ---------------------------------------------------------------- convert


@replay.command("convert")
@generator_options
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), required=True, help="Workload CSV to write.")
def convert(output: Path, **options: Any) -> None:
    """Turn a public trace into a timed AIGC workload file for the local cluster."""
    workload, params = workload_from_traces(GeneratorChoice(**options))
    write_workload(workload, output)
    click.echo(f"wrote {len(workload.jobs)} jobs to {output} (seed {params.seed}, compression {params.compression:g})")
    click.echo(_table(workload))


# ---------------------------------------------------------------- show


@replay.command("show")
@click.option("--workload", "workload_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
@click.option("--policy", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Site policy whose reclaim windows the replay scales (default: the installed one).")
def show(workload_path: Path, as_json: bool, policy: Path | None) -> None:
    """Summarize a workload file per class (validates it on the way); say which compression applies."""
    workload = read_workload(workload_path)
    lines = compression_lines(workload, policy)
    if as_json:
        summary = {**_summary_dict(workload), "compression": lines[0], "warnings": lines[1:]}
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    click.echo(_table(workload))
    click.echo(lines[0])
    for warning in lines[1:]:
        click.echo(warning, err=True)


def _summary_dict(workload: Workload) -> dict[str, object]:
    return {
        "jobs": len(workload.jobs),
        "gpus_requested": sum(j.gpus for j in workload.jobs),
        "last_submit_s": max(j.submit_offset_s for j in workload.jobs),
        "span_s": span_s(workload.jobs),
        "classes": [asdict(c) for c in summarize(workload.jobs)],
        "meta": {k: v for k, v in workload.meta.items() if k != "params"},
    }


def _table(workload: Workload) -> str:
    header = ("class", "jobs", "gpus", "gpu_s", "mean_s", "share", "idle_tail", "hung", "overalloc")
    rows = [
        (c.job_class, str(c.jobs), str(c.gpus_requested), f"{c.gpu_seconds_requested:.0f}", f"{c.mean_duration_s:.0f}",
         str(c.shareable), str(c.idle_tail), str(c.hung), str(c.over_allocated))
        for c in summarize(workload.jobs)
    ]
    lines = [text_table(header, rows, rule=False)]
    last = max(j.submit_offset_s for j in workload.jobs)
    lines.append(f"{len(workload.jobs)} jobs; last submit at {last:.0f} s; all done by >= {span_s(workload.jobs):.0f} s if never queued")
    return "\n".join(lines)


replay.add_command(compare)
replay.add_command(run_workload_command)
