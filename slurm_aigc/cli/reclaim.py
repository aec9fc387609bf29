"""Reclaim commands: `slurm-aigc controller`, `slurm-aigc idle list|explain`, `slurm-aigc audit`."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import click

from slurm_aigc.db import DB_LONG_TIMEOUT_S, open_database
from slurm_aigc.errors import DatabaseError
from slurm_aigc.lease import LEARNER, PUBLISHER, RECLAIM, Leases, only_while_held
from slurm_aigc.policy.paths import find_policy
from slurm_aigc.reclaim.actuator import ActionResult
from slurm_aigc.reclaim.config import ReclaimConfig, load_reclaim_config
from slurm_aigc.reclaim.controller import (
    Controller,
    JobView,
    PublisherHooks,
    load_publisher,
    summary,
)
from slurm_aigc.reclaim.detect import GpuEvidence
from slurm_aigc.reclaim.ladder import PlannedAction
from slurm_aigc.reclaim.store import ActionRow, ReclaimStore
from slurm_aigc.slurm import SlurmCli
from slurm_aigc.textfmt import text_table

LOG = logging.getLogger(__name__)
_SHORT_SINCE_RE = re.compile(r"^\d+[smhdw]$")


def _policy_file(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """--config, else the file the environment names; None: none anywhere (the model's defaults).

    Found once at start-up: a SIGHUP re-reads this file, as the loaders below are handed it.
    """
    found = find_policy(value, required=False)
    return None if found is None else str(found)


config_option = click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
                             callback=_policy_file,
                             help="Policy file (default: $SLURM_AIGC_CONFIG, /etc/slurm-aigc/slurm-aigc.yaml, the shipped one).")
db_option = click.option("--db", "db_url", default=None,
                         help="Database URL (default: $SLURM_AIGC_DB_URL or sqlite:////var/lib/slurm-aigc/state.db).")
dry_run_option = click.option("--dry-run/--no-dry-run", "dry_run", default=None,
                              help="Override reclaim.dry_run of the policy (shipped default: dry-run).")


def _controller(config_file: str | None, db_url: str | None, dry_run: bool | None, publisher: bool,
                jobs: Sequence[str] = (), learner: bool = False, create: bool = True,
                lease_tick_s: float | None = None,
                config: ReclaimConfig | None = None) -> tuple[Controller, PublisherHooks | None, Leases | None]:
    """`create=False`: `idle`, which only reads, opens no database that is not there (a typo in --db).

    `lease_tick_s`: the controller takes the leases of its parts (slurm_aigc/lease.py), ticking
    this often; None: it takes none (it changes nothing in Slurm, or only reads). `config`: the
    file's `reclaim:` when the caller has read it already.
    """
    config = config or load_reclaim_config(config_file)
    factory = open_database(db_url, create=create)
    slurm = SlurmCli()
    dry = config.dry_run if dry_run is None else dry_run
    leases = None if lease_tick_s is None else Leases(factory, config.lease_s(lease_tick_s), dry_run=dry)
    hooks = load_publisher(slurm, db_url, config_file, dry) if publisher else None
    if hooks is not None:
        hooks = replace(hooks, tick=only_while_held(leases, PUBLISHER, hooks.tick))
    # Not tied to the publisher: the learner needs sacct and the database only, not the right to
    # update nodes, and the shipped unit runs --no-publisher.
    hooks = _with_learner(hooks, slurm, db_url, config_file, dry, leases) if learner else hooks
    controller = Controller(slurm, ReclaimStore(factory), config, dry_run=dry, publisher_tick=hooks.tick if hooks else None,
                            only_jobs=frozenset(jobs) if jobs else None, nodes_seen=hooks.nodes_seen if hooks else None,
                            leases=leases)
    return controller, hooks, leases


def _reload(ctl: Controller, hooks: PublisherHooks | None, config_file: str | None, dry_run: bool | None,
            leases: Leases | None = None) -> None:
    """SIGHUP: the policy again, and with it `reclaim.dry_run`, unless the command line set the mode."""
    config = load_reclaim_config(config_file)
    dry = config.dry_run if dry_run is None else dry_run
    if dry != ctl.dry_run:
        LOG.warning("slurm-aigc controller: now %s", _mode(dry))
    if leases is not None:  # first: the leases of the mode the controller acts in, whatever fails below
        leases.set_dry_run(dry)
    ctl.set_config(config, dry_run=dry)
    if hooks is not None:
        hooks.reload(dry)


def _mode(dry_run: bool) -> str:
    return "DRY-RUN (nothing is changed in Slurm)" if dry_run else "LIVE"


def _with_learner(hooks: PublisherHooks | None, slurm: SlurmCli, db_url: str | None, config_file: str | None,
                  dry_run: bool, leases: Leases | None = None) -> PublisherHooks | None:
    """The publisher's hooks (None: no publisher) with the learner of `learned:` after them
    (docs/policy.md), when enabled.

    `slurm` is the loop's own `SlurmCli`: the learner runs in the reclaim loop's thread, so its
    sacct calls take the loop's timeout, one window per tick (telemetry/learnpublish.py).
    """
    from slurm_aigc.policy.loader import load_policy
    from slurm_aigc.telemetry.learnpublish import LOOP_WINDOWS_PER_TICK, open_learner, with_learner

    policy = load_policy(config_file, hook_sections=False)
    if not policy.learned.enabled:
        return hooks
    learner = open_learner(policy.learned, policy.classes, db_url, slurm, dry_run=dry_run,
                           windows_per_tick=LOOP_WINDOWS_PER_TICK)
    LOG.info("learner: learning every %gs into %s", policy.learned.interval_s, policy.learned.file)

    def reload(dry: bool) -> None:
        if hooks is not None:
            hooks.reload(dry)
        fresh = load_policy(config_file, hook_sections=False)
        learner.set_config(fresh.learned, tuple(fresh.classes) or learner.classes, dry_run=dry)

    return PublisherHooks(with_learner(hooks.tick if hooks else None, only_while_held(leases, LEARNER, learner.tick_when_due)),
                          reload,
                          hooks.nodes_seen if hooks else (lambda: None))


def _retention(config_file: str | None, db_url: str | None) -> Callable[[], object]:
    """Hourly rollup and pruning of raw samples (`storage.raw_retention_hours`; docs/deploy.md)."""
    from slurm_aigc.policy.loader import load_policy
    from slurm_aigc.report.retention import Retention, RetentionSchedule

    hours = load_policy(config_file, hook_sections=False).storage.raw_retention_hours
    # Its own engine and the long statement timeout: a budgeted run's transactions are short, but
    # one may still wait on locks; the run stops at Retention's time budget, inside an hour too.
    return RetentionSchedule(Retention(open_database(db_url, timeout_s=DB_LONG_TIMEOUT_S), hours), log=LOG.info)


@click.command("controller")
@config_option
@db_option
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.1), default=None,
              help="Seconds between ticks (default: reclaim.poll_interval_s).")
@click.option("--once", is_flag=True, help="Run one tick, print what it did, exit (1 when the tick failed).")
@dry_run_option
@click.option("--publisher/--no-publisher", default=True, show_default=True,
              help="Also run the feature/weight publisher's tick.")
@click.option("--job", "jobs", multiple=True, help="Only judge and act on this job (repeatable).")
def controller(config_file: str | None, db_url: str | None, interval_s: float | None, once: bool,
               dry_run: bool | None, publisher: bool, jobs: tuple[str, ...]) -> None:
    """Detect wasted GPU allocations and act on them (notify, signal, requeue, shrink)."""
    from slurm_aigc.daemonloop import DaemonLoop

    # The learner, like the retention, belongs to the daemon, not to a one-off or one-job run.
    # The daemon takes the leases in either mode; a one-off run only when it may change Slurm.
    one_off = once or bool(jobs)
    config = load_reclaim_config(config_file)
    tick_s = interval_s or config.poll_interval_s
    dry = config.dry_run if dry_run is None else dry_run
    ctl, hooks, leases = _controller(config_file, db_url, dry_run, publisher, jobs, learner=not one_off,
                                     lease_tick_s=None if one_off and dry else tick_s, config=config)
    click.echo(f"slurm-aigc controller: {_mode(ctl.dry_run)}", err=True)
    if publisher and interval_s is not None:
        from slurm_aigc.policy.loader import load_policy
        from slurm_aigc.policy.render import listing_interval_warning

        # The daemons' loader: a daemon-only file has no hook sections, and a warning must not stop it.
        warning = listing_interval_warning(load_policy(config_file, hook_sections=False), interval_s)
        if warning:
            LOG.warning("%s", warning)
    retention = None if one_off else _retention(config_file, db_url)
    refused: list[str] = []  # a one-off run's tick that another controller's lease kept from running

    def tick() -> None:
        report = ctl.tick()
        # Retention goes with reclaim's lease, judged again after the tick: one that ran past its
        # lease's margin (a slow slurmctld) may have left it to a standby, which runs it now.
        if retention is not None and not report.standby and (leases is None or leases.still_held(RECLAIM)):
            retention()
        for result in report.reconciled + report.results:
            (click.echo if once else LOG.warning)(result.line())
        if once and report.standby:
            refused.append(report.standby)
            click.echo(f"not run: {report.standby} (another controller; stop it, or add --dry-run)", err=True)
        elif once:
            counts = ", ".join(f"{k}={v}" for k, v in sorted(summary(report.assessment.views).items())) or "no GPU jobs"
            click.echo(f"{len(report.assessment.views)} running GPU job(s): {counts}; {len(report.results)} action(s)")

    loop = DaemonLoop(tick, tick_s, lambda: _reload(ctl, hooks, config_file, dry_run, leases), name="slurm-aigc controller")
    ctl.stop_when(lambda: loop.stop_requested)
    try:
        status = loop.run(once=once)
    finally:
        if leases is not None:
            _give_back(leases)
    raise SystemExit(1 if refused else status)


def _give_back(leases: Leases) -> None:
    """Release at exit; a database out of reach then only delays the standby until the leases
    run out, and must not replace the run's exit status or the error that ended it."""
    try:
        leases.release()
    except DatabaseError as error:
        LOG.warning("slurm-aigc controller: leases not given back (they run out in %.0f s): %s", leases.lease_s, error)


@click.group("idle")
def idle() -> None:
    """Current idle/waste verdicts of running GPU jobs."""


@idle.command("list")
@config_option
@db_option
@dry_run_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per job).")
@click.option("--all", "show_all", is_flag=True, help="Also list jobs without a finding.")
@click.option("--job", "jobs", multiple=True, help="Only this job (repeatable).")
def idle_list(config_file: str | None, db_url: str | None, dry_run: bool | None, as_json: bool, show_all: bool,
              jobs: tuple[str, ...]) -> None:
    """Verdicts with their evidence and the next step, per running GPU job."""
    views = _controller(config_file, db_url, dry_run, False, jobs, create=False)[0].assess().views
    shown = [v for v in views if show_all or v.verdict.kind]
    if as_json:
        click.echo(json.dumps([view_json(v) for v in shown], indent=2))
        return
    if not shown:
        click.echo(f"no findings among {len(views)} running GPU job(s)")
        return
    header = ("JOBID", "USER", "CLASS", "GPUS", "VERDICT", "SINCE", "EVIDENCE", "NEXT")
    rows = [(v.job.job_id, v.job.user, v.facts.job_class, str(v.verdict.gpus_total), v.verdict.kind or "-",
             _clock(v.verdict.since_ts), _evidence_short(v.verdict.gpus, v.verdict.window_s), _next(v)) for v in shown]
    click.echo(_table(header, rows))


@idle.command("explain")
@click.argument("job_id")
@config_option
@db_option
@dry_run_option
def idle_explain(job_id: str, config_file: str | None, db_url: str | None, dry_run: bool | None) -> None:
    """Why a job has (or has not) a verdict, GPU by GPU, and what happens next."""
    ctl = _controller(config_file, db_url, dry_run, False, (job_id,), create=False)[0]
    view = next((v for v in ctl.assess().views if v.job.job_id == job_id), None)
    if view is None:
        raise click.ClickException(f"job {job_id} is not a running GPU job")
    policy = ctl.config.policy_for(view.facts.job_class)
    verdict = view.verdict
    lines = [
        f"job {job_id}  user {view.job.user}  account {view.job.account}  qos {view.job.qos}  class {view.facts.job_class}",
        (f"  batch {view.facts.batch}  requeue allowed {view.facts.requeue_allowed}  restarts {view.facts.restarts}  "
        f"GPUs {view.facts.gpus}  opt-out tag {view.facts.opt_out}"),
        (f"  policy: grace {policy.grace_s:.0f}s  window {policy.window_s:.0f}s  min samples {policy.min_samples}  "
        f"idle <= {policy.idle_util_pct}% util & <= {policy.idle_memory_mib:.0f} MiB  "
        f"fake busy >= {policy.busy_util_pct}% util at <= {policy.low_power_pct}% power"),
        f"  ladder for {verdict.kind or '-'}: {', '.join(policy.ladder.get(verdict.kind or '', ())) or '-'}",
        f"verdict: {verdict.kind or 'none'} — {verdict.reason}" + (f" (since {_clock(verdict.since_ts)})" if verdict.since_ts else ""),
    ]
    header = ("NODE", "GPU", "SAMPLES", "WINDOW", "MAX UTIL%", "MAX MEM MiB", "MEAN POWER%", "IDLE FOR", "WASTED FOR")
    rows = [(e.node, str(e.gpu_index), str(e.samples), f"{_clock(e.first_ts)}-{_clock(e.last_ts)}", _num(e.max_util_pct),
             _num(e.max_memory_mib), _num(e.mean_power_pct), f"{e.idle_s:.0f}s", f"{e.wasted_s:.0f}s") for e in verdict.gpus]
    lines.append(_table(header, rows) if rows else "  (no samples)")
    history = ReclaimStore(open_database(db_url, create=False)).audit(job_id=job_id)
    lines.append("actions so far: " + ("none" if not history else ""))
    lines.extend(f"  {_clock(r.ts_intent)} {r.action} ({r.verdict}) -> {r.state}{' [dry-run]' if r.dry_run else ''}" for r in history)
    lines.append(f"next: {_next(view)}")
    click.echo("\n".join(lines))


@click.command("audit")
@db_option
@click.option("--job", "job_id", default=None, help="Only this job.")
@click.option("--since", default=None, help="From this time: 2024-05-01T10:00, now-2hours, or 2h/30m/7d.")
@click.option("--action", type=click.Choice(["notify", "signal", "requeue", "shrink", "cancel"]), default=None)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def audit(db_url: str | None, job_id: str | None, since: str | None, action: str | None, fmt: str) -> None:
    """The reclaim audit trail: every action's intent, outcome and detail."""
    since_ts = _since_ts(since)  # a bad --since is told before the database is opened
    rows = ReclaimStore(open_database(db_url, create=False)).audit(job_id=job_id, since_ts=since_ts, action=action)
    if fmt == "json":
        click.echo(json.dumps([_row_json(r) for r in rows], indent=2))
        return
    header = ("TIME", "JOBID", "USER", "CLASS", "VERDICT", "ACTION", "STATE", "DRY", "GPUS", "DETAIL")
    table = [(_clock(r.ts_intent, date=True), r.job_id, r.user or "", r.job_class or "", r.verdict, r.action, r.state,
              "yes" if r.dry_run else "", f"{r.gpus_before}->{r.gpus_after}", _detail_short(r)) for r in rows]
    click.echo(_table(header, table) if table else "no actions recorded")


def view_json(view: JobView) -> dict[str, Any]:
    """A job's verdict, evidence and next step as plain data (`idle list --json`)."""
    verdict = view.verdict
    plan = view.plan
    next_step: dict[str, Any] = (
        {"action": plan.action, "now": True, "observation_key": plan.observation_key, "dry_run": plan.dry_run}
        if isinstance(plan, PlannedAction)
        else {"action": plan.next_action, "now": False, "reason": plan.reason, "not_before_ts": plan.not_before_ts}
    )
    return {
        "job_id": view.job.job_id, "user": view.job.user, "account": view.job.account, "class": view.facts.job_class,
        "gpus": view.facts.gpus, "verdict": verdict.kind, "reason": verdict.reason, "since_ts": verdict.since_ts,
        "window_s": verdict.window_s, "now_ts": verdict.now_ts, "gpus_used": verdict.gpus_used,
        "evidence": [_evidence_json(e) for e in verdict.gpus], "next": next_step,
    }


def _evidence_json(e: GpuEvidence) -> dict[str, Any]:
    return {"node": e.node, "gpu_index": e.gpu_index, "samples": e.samples, "first_ts": e.first_ts, "last_ts": e.last_ts,
            "max_util_pct": e.max_util_pct, "max_memory_mib": e.max_memory_mib, "mean_power_pct": e.mean_power_pct,
            "idle_s": e.idle_s, "wasted_s": e.wasted_s}


def _row_json(row: ActionRow) -> dict[str, Any]:
    return {"id": row.id, "observation_key": row.observation_key, "ts_intent": row.ts_intent, "ts_outcome": row.ts_outcome,
            "job_id": row.job_id, "user": row.user, "account": row.account, "class": row.job_class, "verdict": row.verdict,
            "action": row.action, "step": row.step, "dry_run": row.dry_run, "state": row.state, "detail": dict(row.detail),
            "gpus_before": row.gpus_before, "gpus_after": row.gpus_after, "gpu_hours_recovered": row.gpu_hours_recovered}


def _next(view: JobView) -> str:
    plan = view.plan
    if isinstance(plan, PlannedAction):
        return f"{'would ' if plan.dry_run else ''}{plan.action} now"
    if plan.next_action:
        return f"{plan.next_action} at {_clock(plan.not_before_ts)} ({plan.reason})"
    return plan.reason


def _evidence_short(gpus: Sequence[GpuEvidence], window_s: float) -> str:
    if not gpus:
        return "no samples"
    util = max((e.max_util_pct for e in gpus if e.max_util_pct is not None), default=None)
    memory = max((e.max_memory_mib for e in gpus if e.max_memory_mib is not None), default=None)
    samples = min(e.samples for e in gpus)
    return f"{window_s:.0f}s window, >={samples} samples/GPU, max util {_num(util)}%, max mem {_num(memory)} MiB"


def _detail_short(row: ActionRow) -> str:
    detail = row.detail
    # A skip (the job ended, restarted, opted out) and a still open shrink say why.
    text = detail.get("error") or detail.get("skipped") or detail.get("open") or detail.get("result") or ""
    return str(text)[:80]


def _since_ts(text: str | None) -> float | None:
    if not text:
        return None
    from slurm_aigc.report.timespec import parse_when

    spec = f"now-{text}" if _SHORT_SINCE_RE.match(text.strip()) else text
    try:
        return parse_when(spec, datetime.now()).timestamp()
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--since") from None


def _clock(ts: float | None, date: bool = False) -> str:
    if ts is None:
        return "-"
    moment = datetime.fromtimestamp(ts, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ" if date else "%H:%M:%S")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return text_table(header, rows, rule=False)


__all__ = ["ActionResult", "ReclaimConfig", "audit", "controller", "idle"]
