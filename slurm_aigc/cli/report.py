"""`slurm-aigc report [...]` and `slurm-aigc report job JOBID`: where the GPU-hours went."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import click

from slurm_aigc.cli.env import CliEnv, command_env
from slurm_aigc.errors import AigcError, DatabaseError
from slurm_aigc.fsio import atomic_write_text
from slurm_aigc.policy.model import Policy
from slurm_aigc.policy.site import load_site_policy
from slurm_aigc.report import figures, render
from slurm_aigc.report.records import DEFAULT_INTERVAL_S
from slurm_aigc.report.sacct import (
    MAX_WINDOWS,
    ReportSlurm,
    SacctQuery,
    SacctReader,
    SkippedRow,
    filter_classes,
    too_many_windows,
    with_live_comments,
)
from slurm_aigc.report.samples import SampleStore
from slurm_aigc.report.timespec import parse_when

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

# sacct windows: at least 6 minutes (a year is then 87,600 calls), at most ~11 years (one call).
MIN_CHUNK_HOURS = 0.1
MAX_CHUNK_HOURS = 100_000.0

ReportEnv = CliEnv[ReportSlurm]  # reports read sacct and look up live jobs


def _env(ctx: click.Context) -> ReportEnv:
    """The env a test passed, else the real one (whose database is only read, never created)."""
    return command_env(ctx)


def _split(values: Iterable[str]) -> tuple[str, ...]:
    """Repeatable options that also take comma lists, like sacct's."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def parse_shards(text: str) -> dict[str, int]:
    """`a100=80,t4=16` -> {'a100': 80, 't4': 16}."""
    result: dict[str, int] = {}
    for part in _split([text]):
        name, sep, count = part.partition("=")
        if not sep or not count.isdigit() or int(count) <= 0:
            raise click.BadParameter(f"{part!r}: expected TYPE=SHARDS_PER_GPU, e.g. a100=80")
        result[name.strip()] = int(count)
    return result


def inventory_shards(policy: Policy) -> dict[str, int]:
    """The policy inventory's shards per GPU of each type (types without shards left out)."""
    return {t.name: t.shards_per_gpu for t in policy.inventory.gpu_types if t.shards_per_gpu}


def _shards(text: str | None, policy: Policy) -> dict[str, int]:
    """`--shards-per-gpu` when given (the whole table), else the policy's inventory.

    The inventory is the one place shard counts are set, so the report cannot drift from the hook.
    """
    return parse_shards(text) if text is not None else inventory_shards(policy)


def _when(text: str, now: datetime, name: str) -> datetime:
    try:
        return parse_when(text, now)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=name) from None


def _chunk_hours(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    if not (math.isfinite(value) and MIN_CHUNK_HOURS <= value <= MAX_CHUNK_HOURS):  # nan compares False
        raise click.BadParameter(f"{value:g}: give hours from {MIN_CHUNK_HOURS:g} to {MAX_CHUNK_HOURS:g}")
    return value


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        _write(output, text)
    except OSError as error:
        where = f": {error.filename}" if error.filename and str(error.filename) != str(output) else ""
        raise AigcError(f"cannot write the report to {output}: {error.strerror or error}{where}") from error
    click.echo(f"wrote {output}", err=True)


def _write(output: Path, text: str) -> None:
    """A file is replaced whole (a failure leaves no truncated report), through a symlink; a
    pipe or device (`/dev/null`, `>(gzip > r.csv.gz)`) is written to: it must not be replaced."""
    if output.exists() and not output.is_file():
        with output.open("w", encoding="utf-8") as handle:
            handle.write(text)
        return
    path = output.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def _store(env: ReportEnv, db_url: str | None) -> SampleStore | None:
    try:
        return SampleStore(env.database(db_url), default_interval_s=DEFAULT_INTERVAL_S)
    except DatabaseError as error:
        click.echo(f"slurm-aigc report: no sample database ({error}); GPU-hours used are unknown", err=True)
        return None


format_option = click.option("--format", "fmt", type=click.Choice(render.FORMATS), default="table", show_default=True)
output_option = click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
                             help="Write the report here instead of stdout.")
db_option = click.option("--db", "db_url", default=None, help="Database URL (default $SLURM_AIGC_DB_URL or the SQLite state file).")
shards_option = click.option("--shards-per-gpu", default=None, metavar="TYPE=N[,...]",
                             help="Shards one GPU of each type holds, e.g. a100=80,t4=16; a shard counts as 1/N GPU "
                                  "(default: shards_per_gpu of the policy's inventory).")


@click.group(invoke_without_command=True)
@click.option("--since", "-S", default="midnight", show_default=True, help="Start of the window (like sacct -S).")
@click.option("--until", "-E", default="now", show_default=True, help="End of the window (like sacct -E).")
@click.option("--user", "-u", multiple=True, help="Only these users (repeatable or comma list).")
@click.option("--account", "-A", multiple=True, help="Only these accounts.")
@click.option("--partition", "-r", multiple=True, help="Only these partitions.")
@click.option("--name", "names", multiple=True, help="Only jobs with these names (like sacct --name).")
@click.option("--class", "classes", multiple=True,
              help="Only these AIGC classes (the class the job_submit hook stamped into the AdminComment; never the job comment).")
@click.option("--group-by", "-g", multiple=True, help=f"Group by {', '.join(figures.GROUP_KEYS)} (repeatable or comma list).")
@click.option("--chunk-hours", type=float, default=24.0, show_default=True, callback=_chunk_hours,
              help=f"sacct is read in windows of this many hours ({MIN_CHUNK_HOURS:g} to {MAX_CHUNK_HOURS:g}).")
@click.option("--policy", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Policy whose reclaim thresholds say what is idle or fake-busy and whose inventory gives the "
                   "shards per GPU, also for `report job` (default: the installed one).")
@format_option
@output_option
@db_option
@shards_option
@click.pass_context
def report(ctx: click.Context, since: str, until: str, user: tuple[str, ...], account: tuple[str, ...],
           partition: tuple[str, ...], names: tuple[str, ...], classes: tuple[str, ...], group_by: tuple[str, ...], chunk_hours: float,
           fmt: str, output: Path | None, db_url: str | None, shards_per_gpu: str | None, policy: Path | None) -> None:
    """GPU-hours allocated, used, useful and idle per group, from sacct joined with slurm-aigc's samples."""
    if ctx.invoked_subcommand is not None:
        return
    env = _env(ctx)
    start, end = _window(since, until, env.now())
    chunk = timedelta(hours=chunk_hours)
    if (windows := too_many_windows(start, end, chunk)) is not None:  # the reader's refusal, said in options
        raise click.BadParameter(f"{since!r} to {until!r} is {windows:,} sacct windows of {chunk_hours:g} h; at most "
                                 f"{MAX_WINDOWS:,}: give a later --since or a larger --chunk-hours",
                                 param_hint="--since")
    query = SacctQuery(since=start, until=end, users=_split(user), accounts=_split(account), partitions=_split(partition),
                       names=_split(names), classes=_split(classes))
    site = load_site_policy(policy, hook_sections=False)
    useful, useful_by_class = figures.useful_rules(site.reclaim)
    params = figures.ReportParams(since_ts=query.since.timestamp(), until_ts=query.until.timestamp(),
                                  group_by=_group_keys(group_by), shards_per_gpu=_shards(shards_per_gpu, site),
                                  useful=useful, useful_by_class=useful_by_class)
    result = _summary(env, query, params, db_url, chunk)
    click.echo(render.skipped_summary(result.skipped), err=True, nl=False)
    _emit(render.render_report(result, fmt), output)


def _window(since: str, until: str, now: datetime) -> tuple[datetime, datetime]:
    """--since and --until, the end capped at now: sacct knows nothing later, and each
    window up to a far --until would be one more sacct call on slurmdbd."""
    start, end = _when(since, now, "--since"), min(_when(until, now, "--until"), now)
    if start >= now:
        raise click.BadParameter(f"{since!r} is not in the past (now is {now:%Y-%m-%dT%H:%M:%S})", param_hint="--since")
    if end <= start:
        raise click.BadParameter(f"{until!r} is not after --since {since!r}", param_hint="--until")
    return start, end


def _group_keys(values: tuple[str, ...]) -> tuple[str, ...]:
    keys = _split(values)
    bad = [k for k in keys if k not in figures.GROUP_KEYS]
    if bad:
        raise click.BadParameter(f"{', '.join(bad)}: choose from {', '.join(figures.GROUP_KEYS)}", param_hint="--group-by")
    return keys


def _summary(env: ReportEnv, query: SacctQuery, params: figures.ReportParams, db_url: str | None,
             chunk: timedelta) -> figures.Report:
    slurm = env.slurm()
    reader = SacctReader(slurm, chunk=chunk)
    aggregator = figures.Aggregator(params)
    rows = with_live_comments(reader.rows(query), slurm)
    aggregator.add_rows(filter_classes(rows, query.classes))
    store = _store(env, db_url)
    if store is not None:
        try:
            aggregator.add_slices(store.job_slices(params.since_ts, params.until_ts))
            aggregator.add_actions(store.actions(params.since_ts, params.until_ts))
        except AigcError:
            raise
        except Exception as error:  # SQLAlchemy errors on a foreign/old database
            raise DatabaseError(f"cannot read samples: {error}") from error
    return aggregator.result()


def _is_job(job_id: str, job_id_raw: str, wanted: str) -> bool:
    """sacct -j 123 also lists array tasks 123_4 and het components 123+1."""
    return wanted in (job_id, job_id_raw) or job_id.startswith((f"{wanted}_", f"{wanted}+"))


@report.command("job")
@click.argument("job_id")
@format_option
@output_option
@db_option
@shards_option
@click.pass_context
def job(ctx: click.Context, job_id: str, fmt: str, output: Path | None, db_url: str | None, shards_per_gpu: str | None) -> None:
    """Like `seff` for GPUs: one job's allocation, per-GPU use over time, verdicts and actions."""
    env = _env(ctx)
    group_policy = ctx.parent.params.get("policy") if ctx.parent is not None else None  # `report --policy P job ID`
    shards = _shards(shards_per_gpu, load_site_policy(group_policy, hook_sections=False))
    now = env.now()
    query = SacctQuery(since=datetime(1970, 1, 2), until=now, job_ids=(job_id,))
    slurm = env.slurm()
    rows = [r for r in with_live_comments(SacctReader(slurm).rows(query), slurm)
            if isinstance(r, SkippedRow) or _is_job(r.job_id, r.job_id_raw, job_id)]
    ids = {job_id} | {r.job_id_raw for r in rows if not isinstance(r, SkippedRow)}
    store = _store(env, db_url)
    slices = list(store.job_slices(0.0, now.timestamp() + 1.0, sorted(ids))) if store else []
    actions = store.actions(0.0, now.timestamp() + 1.0, sorted(ids)) if store else []
    view = figures.job_view(job_id, rows, slices, actions, now.timestamp(), shards)
    click.echo(render.skipped_summary(view.skipped), err=True, nl=False)
    if not view.segments and not view.series:
        raise AigcError(f"job {job_id}: sacct knows no such job and there are no samples for it")
    _emit(render.render_job(view, fmt), output)
