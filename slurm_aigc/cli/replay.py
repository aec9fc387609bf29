"""`slurm-aigc replay ...`: turn traces or a site's sacct history into workload files, show them.

`replay convert` and `replay show` need no cluster; `replay --from-sacct --since ... --output
FILE` reads sacct (and the samples database when present). Running a workload
(`replay --workload FILE`, `replay compare`) is the runner's (slurm_aigc/replay/runner.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.errors import AigcError, DatabaseError
from slurm_aigc.replay import generator, traces
from slurm_aigc.replay.from_sacct import FromSacctParams, workload_from_sacct
from slurm_aigc.replay.workload import (
    Workload,
    read_workload,
    span_s,
    summarize,
    write_workload,
)
from slurm_aigc.report.sacct import (
    JobRecord,
    SacctQuery,
    SacctReader,
    SacctRunner,
    SkippedRow,
)
from slurm_aigc.report.samples import SampleSlice, SampleStore
from slurm_aigc.report.timespec import parse_when

log = logging.getLogger(__name__)

TRACE_CHOICES = (*traces.TRACES, "mix")


@dataclass(frozen=True)
class ReplayEnv:
    """Side effects of `replay` (tests hand their own in through `CliRunner.invoke(obj=...)`)."""

    slurm: Callable[[], SacctRunner]
    database: Callable[[str | None], sessionmaker[Session]]
    now: Callable[[], datetime]


def _default_env() -> ReplayEnv:
    from slurm_aigc.db import open_database
    from slurm_aigc.slurm import SlurmCli

    return ReplayEnv(slurm=lambda: SlurmCli(timeout_s=300.0), database=open_database, now=datetime.now)


def _env(ctx: click.Context) -> ReplayEnv:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, ReplayEnv) else _default_env()


@click.group(invoke_without_command=True)
@click.option("--workload", "workload_path", type=click.Path(path_type=Path, dir_okay=False), help="Run this workload file.")
@click.option("--from-sacct", is_flag=True, help="Build the workload from this site's sacct history (and samples).")
@click.option("--since", "-S", default="now-1days", show_default=True, help="With --from-sacct: start (like sacct -S).")
@click.option("--until", "-E", default="now", show_default=True, help="With --from-sacct: end (like sacct -E).")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), help="With --from-sacct: write the workload here.")
@click.option("--compression", type=float, default=1.0, show_default=True, help="With --from-sacct: divide offsets and durations by this.")
@click.option("--max-jobs", type=int, default=0, show_default=True, help="With --from-sacct: keep the first N jobs (0: all).")
@click.option("--db", "db_url", default=None, help="Samples database URL (default: SLURM_AIGC_DB_URL or the local SQLite file).")
@click.option("--no-samples", is_flag=True, help="With --from-sacct: ignore the samples database.")
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
        _run_workload(ctx, workload_path)
        return
    click.echo(ctx.get_help())


def _from_sacct(
    ctx: click.Context, since: str, until: str, output: Path | None, params: FromSacctParams, db_url: str | None, no_samples: bool
) -> None:
    if output is None:
        raise click.UsageError("--from-sacct needs --output FILE (running it directly comes with the replay runner)")
    if params.compression <= 0:
        raise click.BadParameter("must be > 0", param_hint="--compression")
    env = _env(ctx)
    now = env.now()
    query = SacctQuery(since=_when(since, now, "--since"), until=_when(until, now, "--until"))
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


def _run_workload(ctx: click.Context, path: Path) -> None:
    """Validate the file, then run it on the local cluster (`replay run --workload FILE` with defaults)."""
    from slurm_aigc.cli.replay_run import run_workload_command

    read_workload(path)
    ctx.invoke(run_workload_command, workload_path=path)


# ---------------------------------------------------------------- convert


def default_trace_input() -> Path:
    """The shared traces folder beside the checkout, else the project's small fixtures."""
    repo = Path(__file__).resolve().parents[2]
    shared = repo.parent / "shared" / "traces"
    return shared if shared.is_dir() else repo / "tests" / "fixtures" / "traces"


FIXTURE_FILES = {
    "alibaba-2023": "openb_pod_list_small.csv",
    "genai-2026": "lora_request_trace_small.csv",
    "philly": "pollux_philly_jobs_small.csv",
}


def _trace_file(name: str, input_path: Path) -> Path:
    fixture = input_path / FIXTURE_FILES[name]
    return fixture if input_path.is_dir() and fixture.is_file() else input_path


def generator_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The options that turn a trace into a workload (shared by `convert` and `compare`)."""
    options = [
        click.option("--trace", "trace", type=click.Choice(TRACE_CHOICES), default=None,
                     help="Which trace (mix: all three, by mix_weights)."),
        click.option("--input", "input_path", type=click.Path(path_type=Path, exists=True), default=None,
                     help="Trace file, or a folder holding it (for mix: the traces folder with the three subfolders); "
                          "default ../shared/traces, else the project's small fixtures."),
        click.option("--seed", type=int, default=None, help="Random seed (default 1)."),
        click.option("--compression", type=float, default=None,
                     help="Trace seconds per replay second, for arrivals and durations (default 60)."),
        click.option("--duration-s", type=float, default=None, help="Replay seconds over which jobs arrive (default 150)."),
        click.option("--minutes", type=float, default=None, help="Same as --duration-s, in minutes."),
        click.option("--max-jobs", type=int, default=None, help="At most this many jobs (default 150)."),
        click.option("--capacity-gpus", type=int, default=None, help="GPUs of the cluster the load is sized for (default 24)."),
        click.option("--load", "load_target", type=float, default=None, help="Whole-GPU demand / capacity over the window (default 2.0)."),
        click.option("--window-start-s", type=float, default=None, help="Trace seconds after its first arrival where the window starts."),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Any generator parameter (e.g. infer.loading_s=5)."),
        click.option("--show-skipped", type=int, default=5, show_default=True, help="Print this many skipped trace rows."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@dataclass(frozen=True)
class GeneratorChoice:
    """What the generator options asked for."""

    trace: str | None
    input_path: Path | None
    seed: int | None = None
    compression: float | None = None
    duration_s: float | None = None
    minutes: float | None = None
    max_jobs: int | None = None
    capacity_gpus: int | None = None
    load_target: float | None = None
    window_start_s: float | None = None
    overrides: tuple[str, ...] = ()
    show_skipped: int = 5


def workload_from_traces(choice: GeneratorChoice) -> tuple[Workload, generator.GeneratorParams]:
    """Read the chosen trace(s) (reporting skipped rows) and generate the seeded workload."""
    if choice.trace is None:
        raise click.UsageError("give --trace (alibaba-2023, genai-2026, philly or mix)")
    if choice.duration_s is not None and choice.minutes is not None:
        raise click.UsageError("give --duration-s or --minutes, not both")
    params = generator.with_overrides(generator.GeneratorParams(), _pairs(choice.overrides))
    named: dict[str, Any] = {
        "seed": choice.seed,
        "compression": choice.compression,
        "arrival_window_s": choice.duration_s if choice.minutes is None else choice.minutes * 60,
        "max_jobs": choice.max_jobs,
        "capacity_gpus": choice.capacity_gpus,
        "load_target": choice.load_target,
        "window_start_s": choice.window_start_s,
    }
    params = replace(params, **{k: v for k, v in named.items() if v is not None})
    input_path = choice.input_path or default_trace_input()
    names = traces.TRACES if choice.trace == "mix" else (choice.trace,)
    sources = {}
    for name in names:
        read = traces.read_trace(name, _trace_file(name, input_path))
        _report_skipped(name, read, choice.show_skipped)
        sources[name] = read.jobs
    return generator.generate(sources, params), params


@replay.command("convert")
@generator_options
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), required=True, help="Workload CSV to write.")
def convert(output: Path, **options: Any) -> None:
    """Turn a public trace into a timed AIGC workload file for the local cluster."""
    workload, params = workload_from_traces(GeneratorChoice(**options))
    write_workload(workload, output)
    click.echo(f"wrote {len(workload.jobs)} jobs to {output} (seed {params.seed}, compression {params.compression:g})")
    click.echo(_table(workload))


def _pairs(items: Sequence[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        pairs[key.strip()] = value.strip()
    return pairs


def _report_skipped(name: str, read: traces.TraceRead, limit: int) -> None:
    if not read.skipped:
        return
    click.echo(f"{name}: skipped {len(read.skipped)} malformed row(s) of {len(read.skipped) + len(read.jobs)}", err=True)
    for row in read.skipped[:limit]:
        click.echo(f"  line {row.line}: {row.reason}", err=True)


# ---------------------------------------------------------------- show


@replay.command("show")
@click.option("--workload", "workload_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
def show(workload_path: Path, as_json: bool) -> None:
    """Summarize a workload file per class (validates it on the way)."""
    workload = read_workload(workload_path)
    if as_json:
        click.echo(json.dumps(_summary_dict(workload), indent=2, sort_keys=True))
    else:
        click.echo(_table(workload))


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
    rows = [header]
    for c in summarize(workload.jobs):
        rows.append((
            c.job_class, str(c.jobs), str(c.gpus_requested), f"{c.gpu_seconds_requested:.0f}",
            f"{c.mean_duration_s:.0f}", str(c.shareable), str(c.idle_tail), str(c.hung), str(c.over_allocated),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    last = max(j.submit_offset_s for j in workload.jobs)
    lines.append(f"{len(workload.jobs)} jobs; last submit at {last:.0f} s; all done by >= {span_s(workload.jobs):.0f} s if never queued")
    return "\n".join(lines)


def _attach_runner_commands() -> None:
    from slurm_aigc.cli.replay_run import compare, run_workload_command

    replay.add_command(compare)
    replay.add_command(run_workload_command)


_attach_runner_commands()
