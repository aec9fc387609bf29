"""The one place reclaim changes anything: applies planned actions through `SlurmCli`.

Each action is written to the `actions` table as an intent *before* Slurm is touched and
closed with its outcome after, so a controller killed in between (kill -9 included) never
repeats the action: the intent's observation key stays taken, and `reconcile` asks Slurm
what happened (restart count, state, admin comment) and records it without redoing
anything. Right before acting, the job is read again: a job that ended, restarted or
became exempt since the tick read it is skipped, and the skip recorded with its reason.
On Slurm 23.02+ that is one single-job read per action; 22.05 has none (its `squeue --json`
lists every job, ~0.1 s over 10,000 jobs), so there the actions of a batch share one listing
taken right before the first of them, listed again once it is RECHECK_LISTING_MAX_AGE_S old.
Requeues use `scontrol requeue[hold] Incomplete`, so a job that ends in the instant
between that re-read and the requeue is not run again either.

A shrink holds the job (`requeuehold`) until it is PENDING, lowers its GPU request and
releases it. When the job is not PENDING in time (a slow epilog), the intent stays open
and every later tick (and a restarted controller) finishes it: a hold always ends released.
Reconcile finishes only its own hold: one restart since the intent and the hold requeuehold
leaves (`jobs.requeue_held`); any other hold is left alone and the intent closed failed.

A failure after which nothing provably happened in Slurm (the re-read before acting failed,
or the restart count is unchanged after a requeue or requeuehold did not take) is recorded
with `acted: false`: the ladder may try that step again after the cool-down.

In dry-run the intent is recorded and closed as `skipped` with the exact commands it would
have run, and reconciliation only reports; Slurm is not touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_aigc.errors import AigcError, SlurmCommandError, SlurmParseError
from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.jobs import (
    declared_signal,
    is_held,
    job_facts,
    requested_gpus,
    requeue_held,
    shrink_updates,
)
from slurm_aigc.reclaim.ladder import ADMIN_COMMENT_TAG, PlannedAction, exemption, signal_refusal
from slurm_aigc.reclaim.store import ActionRow, ReclaimStore
from slurm_aigc.slurm import JobInfo, Runner, SlurmCli, quote_argv, run_command
from slurm_aigc.tags import admin_comment_with

LOG = logging.getLogger(__name__)
ADMIN_COMMENT_MAX = 480  # keep our note short: AdminComment is shared with the site's tools
PENDING_WAIT_S = 60.0  # how long one tick waits for a requeue-held job to become PENDING
# States after which a job holds nothing any more (a shrink's hold has nothing left to release).
ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
_SETTLED_STATES = ENDED_STATES | {"RUNNING", "PENDING"}  # a requeued job is no longer completing


class ActuatorCrash(AigcError):
    """Raised by a test hook between intent and outcome to simulate a killed controller."""


@dataclass(frozen=True)
class ActionResult:
    """What happened to one planned action (or reconciled intent)."""

    observation_key: str
    job_id: str
    action: str
    state: str  # done | failed | skipped (dry-run, or no longer applies) | duplicate | intent (still open)
    dry_run: bool
    commands: tuple[str, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        head = "dry-run: would" if self.dry_run else self.state + ":"
        why = self.detail.get("skipped") or self.detail.get("open")
        text = f"{head} {self.action} job {self.job_id} [{self.observation_key}]: " + "; ".join(self.commands)
        return f"{text} ({why})" if why else text


def merge_admin_comment(existing: str, note: str) -> str:
    """Replace our previous note with `note`, keeping the hook's stamp in front and the site's text."""
    return admin_comment_with(existing, note, ADMIN_COMMENT_MAX)


def _notified(intent: Mapping[str, Any], comment: str) -> bool:
    """Did this intent's note reach the AdminComment? Any `aigc-reclaim:` note is not enough:
    notes outlive requeues, and the run before may have left the very same text."""
    before, message = intent.get("admin_comment_before"), intent.get("message")
    if not isinstance(before, str) or not isinstance(message, str):
        return ADMIN_COMMENT_TAG in comment  # an intent recorded before these were kept
    written = merge_admin_comment("", message)  # the note as the write shapes it (defused, capped)
    return comment != before and comment.endswith(written[-64:])


def recheck(plan: PlannedAction, job: JobInfo | None, config: ReclaimConfig) -> str | None:
    """Why the job as Slurm shows it now no longer allows the planned action, or None."""
    if job is None:
        return "job no longer known to Slurm"
    if job.state != "RUNNING":
        return f"job is {job.state} now, no longer RUNNING"
    if job.restarts != plan.restarts_before:
        return f"job was restarted meanwhile (restarts {plan.restarts_before} -> {job.restarts})"
    facts = job_facts(job)
    why_exempt = exemption(facts, config)
    if why_exempt:
        return f"{why_exempt} now"
    return signal_refusal(facts, config.signal) if plan.action == "signal" else None


def planned_commands(plan: PlannedAction, job: JobInfo, config: ReclaimConfig) -> list[list[str]]:
    """The argv lists an action runs, in order, as an admin would type them."""
    job_id = plan.job_id
    if plan.action == "notify":
        commands = [["scontrol", "update", f"JobId={job_id}", f"AdminComment={merge_admin_comment(job.admin_comment, plan.message)}"]]
        if config.notify.scontrol_notify:
            commands.append(["scontrol", "notify", job_id, plan.message])
        if config.notify.command:
            commands.append(notify_command(config.notify.command, plan))
        return commands
    if plan.action == "signal":
        batch = ["--batch"] if declared_signal(job).startswith("B:") else []
        return [["scancel", f"--signal={config.signal}", *batch, job_id]]
    if plan.action == "requeue":
        return [["scontrol", "requeue", "Incomplete", job_id]]
    if plan.action == "cancel":
        return [["scancel", job_id]]
    if plan.action == "shrink":
        first = shrink_updates(job, plan.gpus_after)[:1]
        update = [f"{k}={v}" for k, v in first[0].items()] if first else ["<no rewritable GPU request>"]
        return [["scontrol", "requeuehold", "Incomplete", job_id], ["scontrol", "update", f"JobId={job_id}", *update],
                ["scontrol", "release", job_id]]
    raise ValueError(f"unknown action {plan.action!r}")


def notify_command(template: Sequence[str], plan: PlannedAction) -> list[str]:
    """The configured notification argv with {user} {job_id} {verdict} {message} filled in."""
    values = {"user": plan.user, "job_id": plan.job_id, "verdict": plan.verdict, "message": plan.message}
    return [part.format(**values) for part in template]



class Actuator:
    """Applies `PlannedAction`s; see the module docstring."""

    # How long the re-checks of a batch may share one listing of every job (Slurm 22.05 only):
    # notifications take ~0.05 s each, so a batch of them lists once; a slow action (a shrink
    # waiting for PENDING, a slow notify command) makes the next re-check list again.
    RECHECK_LISTING_MAX_AGE_S = 1.0

    def __init__(
        self,
        slurm: SlurmCli,
        store: ReclaimStore,
        config: ReclaimConfig,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        command_runner: Runner = run_command,
        after_intent: Callable[[PlannedAction], None] | None = None,
        pending_wait_s: float = PENDING_WAIT_S,
    ) -> None:
        self._slurm = slurm
        self._store = store
        self.config = config
        self._clock = clock  # timestamps for the audit trail
        # Elapsed time (waits, listing age): an NTP step of the wall clock would stretch a wait
        # (stalling the tick) or cut it short.
        self._monotonic = monotonic
        self._sleep = sleep
        self._command_runner = command_runner
        # Test hook, called after the intent is recorded and the job re-read, right before acting.
        self._after_intent = after_intent
        self._pending_wait_s = pending_wait_s
        self._recheck_listing: tuple[float, dict[str, JobInfo]] | None = None  # (when listed, jobs by id)
        self._stopping: Callable[[], bool] = lambda: False
        self._fenced: Callable[[], bool] = lambda: False

    def stop_when(self, stopping: Callable[[], bool]) -> None:
        """Start no further action of a batch once `stopping()` (the daemon got SIGTERM): a tick of
        ten shrinks, each waiting for its epilog, outlasts systemd's stop timeout, and a SIGKILL
        in the middle of an action leaves it for reconcile (a shrink's job held until then)."""
        self._stopping = stopping

    def fence_when(self, fenced: Callable[[], bool]) -> None:
        """Leave a shrink's wait for PENDING once `fenced()` (the reclaim lease ran out): the
        wait can outlast the lease's margin, and the controller that takes the lease over then
        reconciles the same shrink, so this one must neither lower the GPUs nor release the job.
        A SIGTERM (`stop_when`) lets the shrink under way finish: left open, the job would stay
        held until a controller runs again."""
        self._fenced = fenced

    def apply_batch(self, batch: Sequence[tuple[PlannedAction, JobInfo]]) -> list[ActionResult]:
        """`apply` each (plan, job the tick decided on), in order; their re-checks may share a listing."""
        self._recheck_listing = None
        results: list[ActionResult] = []
        try:
            for plan, job in batch:
                if self._stopping():  # nothing recorded for the rest: planned again after the restart
                    LOG.warning("stopping: %d planned action(s) left for the next start", len(batch) - len(results))
                    break
                results.append(self._apply(plan, job))
            return results
        finally:
            self._recheck_listing = None

    def apply(self, plan: PlannedAction, job: JobInfo) -> ActionResult:
        """Record the intent, re-read the job, run the action (unless dry-run or stale), record the outcome."""
        [result] = self.apply_batch([(plan, job)]) or [ActionResult(plan.observation_key, plan.job_id, plan.action,
                                                                     "skipped", plan.dry_run, (), {"skipped": "stopping"})]
        return result

    def _apply(self, plan: PlannedAction, job: JobInfo) -> ActionResult:
        commands = self._commands(plan, job)
        intent: dict[str, Any] = {"restarts_before": job.restarts, "state_before": job.state,
                                  "commands": list(commands), "message": plan.message}
        if plan.skipped:
            intent["skipped_steps"] = list(plan.skipped)
        if plan.action == "notify":
            # Reconcile tells our write from an earlier run's identical note by the change.
            intent["admin_comment_before"] = job.admin_comment
        action_id = self._store.record_intent(plan, intent, self._clock())
        if action_id is None:
            return ActionResult(plan.observation_key, plan.job_id, plan.action, "duplicate", plan.dry_run, commands)
        result = self._checked_run(plan)
        # A skip ran nothing: the intent keeps the commands that were planned.
        detail = {**result.detail, "commands": list(result.commands)} if result.commands else dict(result.detail)
        if result.state == "intent":
            self._store.record_progress(action_id, detail)
        else:
            self._store.record_outcome(action_id, result.state, detail, self._clock())
        LOG.info("%s", result.line())
        return result

    def _checked_run(self, plan: PlannedAction) -> ActionResult:
        """Re-read the job right before acting; act only when the plan still holds."""
        def outcome(state: str, commands: tuple[str, ...], detail: Mapping[str, Any]) -> ActionResult:
            return ActionResult(plan.observation_key, plan.job_id, plan.action, state, plan.dry_run, commands, detail)

        try:
            current = self._reread(plan.job_id)
        except (SlurmCommandError, SlurmParseError) as error:  # an answer it cannot read: nothing sent either
            # Nothing was sent to Slurm: the step may be tried again (`acted: false`, see ladder).
            return outcome("failed", (), {"error": f"could not re-read the job before acting: {error}; not acted",
                                          "acted": False})
        why_not = recheck(plan, current, self.config)
        if self._after_intent is not None:
            self._after_intent(plan)
        if why_not is not None or current is None:
            return outcome("skipped", (), {"skipped": why_not or "job no longer known to Slurm",
                                           "state_now": current.state if current else None})
        commands = self._commands(plan, current)
        if plan.dry_run:
            return outcome("skipped", commands, {"result": "dry-run: nothing changed in Slurm"})
        try:
            detail = self._perform(plan, current)
        except SlurmCommandError as error:
            return outcome("failed", commands, {"error": str(error)})
        return outcome(_state_of(detail), commands, detail)

    def _reread(self, job_id: str) -> JobInfo | None:
        """The job as Slurm shows it now: a single-job read (23.02+), else (22.05) from a listing
        taken in this batch at most RECHECK_LISTING_MAX_AGE_S ago."""
        if not self._slurm.job_read_lists_all():
            return self._slurm.job(job_id)
        now = self._monotonic()
        listed = self._recheck_listing
        if listed is None or now - listed[0] > self.RECHECK_LISTING_MAX_AGE_S:
            listed = self._recheck_listing = (now, {job.job_id: job for job in self._slurm.jobs()})
        return listed[1].get(job_id)

    def _commands(self, plan: PlannedAction, job: JobInfo) -> tuple[str, ...]:
        return tuple(quote_argv(argv) for argv in planned_commands(plan, job, self.config))

    def _perform(self, plan: PlannedAction, job: JobInfo) -> dict[str, Any]:
        if plan.action == "notify":
            return self._notify(plan, job)
        if plan.action == "signal":
            batch = declared_signal(job).startswith("B:")
            self._slurm.cancel(plan.job_id, signal=self.config.signal, batch_only=batch)
            return {"result": f"sent SIG{self.config.signal} to the {'batch shell' if batch else 'job steps'}"}
        if plan.action == "requeue":
            return self._requeue(plan.job_id, job)
        if plan.action == "cancel":
            self._slurm.cancel(plan.job_id)
            return {"result": "cancelled"}
        if plan.action == "shrink":
            return self._shrink(plan, job)
        raise ValueError(f"unknown action {plan.action!r}")

    def _shrink(self, plan: PlannedAction, job: JobInfo) -> dict[str, Any]:
        """`requeuehold`, then finish; any Slurm error from here on keeps the intent open.

        Even a failed `requeuehold` may have held the job (a timeout after slurmctld acted),
        so reconciliation decides from the restart count, never this process.
        """
        try:
            self._slurm.requeue(plan.job_id, hold=True, incomplete_only=True)
            if not self._restarted(plan.job_id, job.restarts):
                return {"skipped": "Slurm did not requeue it: the job had ended (requeuehold Incomplete); nothing held"}
            return self._finish_shrink(plan.job_id, job, plan.gpus_after, self._pending_wait_s)
        except SlurmCommandError as error:
            return {"open": f"interrupted after requeuehold ({error}); settled on a later tick", "phase": "unknown"}

    def _requeue(self, job_id: str, job: JobInfo) -> dict[str, Any]:
        """`requeue Incomplete`, judged by the restart count read after it, whatever the command said."""
        try:
            self._slurm.requeue(job_id, incomplete_only=True)
        except SlurmCommandError as error:
            # A timeout may come after slurmctld acted: the restart count tells.
            try:
                after = self._slurm.job(job_id)
            except SlurmCommandError:
                return {"open": f"requeue failed ({error}) and the job could not be read; settled by reconcile",
                        "phase": "unconfirmed"}
            if after is not None and after.restarts > job.restarts:
                return {"result": f"requeued (the command reported: {error})"}
            if after is not None and after.restarts == job.restarts:
                return {"error": str(error), "acted": False}  # provably not requeued: may be tried again
            return {"error": str(error)}
        try:
            restarted = self._restarted(job_id, job.restarts)
        except SlurmCommandError as error:
            # The requeue was sent and may have worked: reconcile decides from the restart count.
            return {"open": f"requeue sent, the read confirming it failed ({error}); settled by reconcile",
                    "phase": "unconfirmed"}
        if not restarted:
            return {"skipped": "Slurm did not requeue it: the job had ended (requeue Incomplete)"}
        return {"result": "requeued"}

    def _restarted(self, job_id: str, restarts_before: int) -> bool:
        """Did the requeue take? `Incomplete` makes slurmctld skip an ended job silently (exit 0)."""
        after = self._slurm.job(job_id)
        return after is not None and after.restarts > restarts_before

    def _notify(self, plan: PlannedAction, job: JobInfo) -> dict[str, Any]:
        # The admin comment is the record that must exist; the other channels are best effort.
        try:
            self._slurm.update_job(plan.job_id, AdminComment=merge_admin_comment(job.admin_comment, plan.message))
        except SlurmCommandError as error:
            # A timeout may come after slurmctld wrote it: the comment tells. Not written, nothing
            # was sent (it goes first), and the warning is tried again rather than taken as given.
            landed = self._comment_landed(plan, job)
            if landed is not True:
                return {"error": str(error), **({"acted": False} if landed is False else {})}
        channels, problems = ["admin_comment"], []
        if self.config.notify.scontrol_notify:
            try:
                self._slurm.notify(plan.job_id, plan.message)
                channels.append("scontrol_notify")
            except SlurmCommandError as error:
                problems.append(str(error))
        if self.config.notify.command:
            argv = notify_command(self.config.notify.command, plan)
            try:
                result = self._command_runner(argv, 30.0)
                if result.returncode == 0:
                    channels.append("command")
                else:
                    problems.append(f"{quote_argv(argv)} exited {result.returncode}: {result.stderr.strip()[:200]}")
            except AigcError as error:
                problems.append(str(error))
        return {"result": "notified via " + ", ".join(channels), "channel_errors": problems}

    def _comment_landed(self, plan: PlannedAction, job: JobInfo) -> bool | None:
        """Whether the notify's AdminComment is on the job now (None: the job cannot be read)."""
        try:
            after = self._slurm.job(plan.job_id)
        except AigcError:
            return None
        intent = {"admin_comment_before": job.admin_comment, "message": plan.message}
        return after is not None and _notified(intent, after.admin_comment)

    def _finish_shrink(self, job_id: str, before: JobInfo, gpus_after: int, wait_s: float,
                       restarts_before: int | None = None) -> dict[str, Any]:
        """After `scontrol requeuehold`: wait until held and PENDING, lower the GPU count, release.

        Not PENDING within `wait_s` (a slow epilog): the intent stays open ("open") and a later
        tick finishes it. Once held, the job is released whatever the update did; a release
        that fails also leaves the intent open, so it is retried. `restarts_before` (reconcile,
        where this process did not see its requeuehold succeed): finish only our own hold, and
        lower nothing of a job that became exempt meanwhile.
        """
        phase, job = self._wait_held(job_id, wait_s)
        if phase == "waiting":
            return {"open": f"requeued and held but not PENDING after {wait_s:.0f}s (epilog?); "
                            "released once it is (checked every tick)", "phase": "waiting_pending"}
        if phase == "fenced":
            return {"open": "requeued and held; this controller's lease ran out before the GPU update: "
                            "the controller holding the lease finishes it (reconcile)", "phase": "waiting_pending"}
        if phase != "held":
            return _unheld(phase, job, gpus_after)
        assert job is not None
        why_exempt = None
        if restarts_before is not None:
            foreign = _foreign_hold(job, restarts_before)
            if foreign is not None:
                return {"error": f"{foreign}: not our requeuehold; left as it is"}
            why_exempt = exemption(job_facts(job), self.config)
        tried: list[str] = []
        applied: dict[str, str] | None = None
        # Our hold is released either way; an exempt job keeps its GPU request.
        for update in [] if why_exempt else shrink_updates(before, gpus_after):
            try:
                self._slurm.update_job(job_id, **update)
                applied = update
                break
            except SlurmCommandError as error:
                tried.append(f"{update}: {error.stderr.strip()[:200]}")
        try:
            self._slurm.release(job_id)
        except SlurmCommandError as error:
            return {"open": f"release failed ({error.stderr.strip()[:200]}); retried every tick",
                    "phase": "release_failed", "update": applied, "tried": tried}
        if why_exempt:
            return {"skipped": f"{why_exempt} now: released unchanged"}
        if applied is None:
            return {"error": "no GPU update accepted; released unchanged", "tried": tried}
        return {"result": f"requeued with {gpus_after} GPU(s) and released", "update": applied, "tried": tried}

    def _wait_held(self, job_id: str, wait_s: float) -> tuple[str, JobInfo | None]:
        """Poll until the requeue-held job leaves COMPLETING: (phase, job), phase as `hold_phase`,
        or ("fenced", None) once `fence_when`'s condition holds.

        Polls the state alone (`squeue -j ID -o %A|%T`, one job), then reads the job once.
        """
        deadline = self._monotonic() + wait_s
        while True:
            if self._fenced():
                return "fenced", None
            state = self._slurm.job_state(job_id)
            if state is None or state in _SETTLED_STATES or self._monotonic() >= deadline:
                job = self._slurm.job(job_id)
                return ("fenced", None) if self._fenced() else (hold_phase(job), job)
            self._sleep(1.0)

    def reconcile(self, *, dry_run: bool = False, only_jobs: frozenset[str] | None = None) -> list[ActionResult]:
        """Settle every live intent without outcome by asking Slurm what happened; never redo.

        Intents stay open while a shrink's job is not yet PENDING (finished on a later call).
        In dry-run nothing is changed, in Slurm or in the records: what would be done is reported.
        """
        results = []
        for row in self._store.open_intents():
            if only_jobs is not None and row.job_id not in only_jobs:
                continue
            state, detail = self._judge(row, act=not dry_run)
            if dry_run:
                results.append(ActionResult(row.observation_key, row.job_id, row.action, "skipped", True, (),
                                            {**detail, "reconciled": False}))
                continue
            if state == "intent":
                self._store.record_progress(row.id, detail)
            else:
                self._store.record_outcome(row.id, state, {**detail, "reconciled": True}, self._clock())
            LOG.warning("reconciled intent %s: %s %s", row.observation_key, state,
                        detail.get("result") or detail.get("error") or detail.get("open"))
            results.append(ActionResult(row.observation_key, row.job_id, row.action, state, False, (), detail))
        return results

    def _judge(self, row: ActionRow, act: bool) -> tuple[str, dict[str, Any]]:
        job = self._slurm.job(row.job_id)
        before = int(row.detail.get("restarts_before", 0))
        if job is None:
            return "failed", {"error": "job no longer known to Slurm; outcome unknown, not repeated"}
        restarted = job.restarts > before
        if row.action in ("requeue", "shrink") and job.restarts == before and job.state == "RUNNING":
            # Still running, never restarted: the requeue did not happen; the ladder may try again.
            return "failed", {"error": f"{row.action} did not take (restarts unchanged, job RUNNING); "
                                       "this attempt is not repeated", "acted": False}
        if row.action == "requeue":
            return _judged(restarted, f"requeue took effect (restarts {before} -> {job.restarts})")
        if row.action == "shrink":
            return self._judge_shrink(row, job, restarted, act)
        if row.action == "notify":
            if _notified(row.detail, job.admin_comment):
                return "done", {"result": "admin comment is set"}
            # The comment goes first: without it nothing was sent, and the step may be tried
            # again (taken as done, the job was requeued a cool-down later with no warning).
            return "failed", {"error": "the warning's admin comment is not on the job: not sent", "acted": False}
        if row.action == "cancel":
            return _judged(job.state.startswith("CANCELLED"), f"job is {job.state}")
        return "failed", {"error": f"{row.action}: outcome cannot be verified after a restart; not repeated"}

    def _judge_shrink(self, row: ActionRow, job: JobInfo, restarted: bool, act: bool) -> tuple[str, dict[str, Any]]:
        if not restarted:
            return _judged(False, "")
        target = row.gpus_after or 0
        before = int(row.detail.get("restarts_before", 0))
        phase = hold_phase(job)
        foreign = _foreign_hold(job, before) if phase in ("held", "waiting") else None
        if foreign is not None:
            # Requeued or held by someone else (a node failure, the owner's `scontrol hold`):
            # releasing it would undo their hold. The intent is closed without touching the job.
            return "failed", {"error": f"{foreign}: not our requeuehold; left as it is"}
        if phase in ("held", "waiting") and not act:
            return "skipped", {"result": f"dry-run: would finish the shrink of job {row.job_id} "
                                         f"(update to {target} GPU(s), release) once it is PENDING"}
        if phase in ("held", "waiting"):
            # Our requeuehold happened and nothing released it yet: finish, so it is not left held.
            detail = self._finish_shrink(row.job_id, job, target, 0.0, restarts_before=before)
            return _state_of(detail), {**detail, "completed_after_restart": True}
        if phase == "gone":
            detail = _unheld(phase, job, target)
            return _state_of(detail), detail
        return _judged(requested_gpus(job) == target, f"job restarted with {target} GPU(s)")


def hold_phase(job: JobInfo | None) -> str:
    """Where a job requeue-held by a shrink stands.

    `held`: PENDING with the hold, ready for the update and release; `waiting`: not PENDING
    yet (COMPLETING while its epilog runs); `released`: running or pending without a hold;
    `gone`: ended or forgotten, nothing left held.
    """
    if job is None or job.state in ENDED_STATES:
        return "gone"
    if is_held(job):
        return "held"
    if job.state in ("RUNNING", "PENDING"):
        return "released"
    return "waiting"


def _foreign_hold(job: JobInfo, restarts_before: int) -> str | None:
    """Why this held (or completing) job is not held by the shrink whose intent says `restarts_before`."""
    if job.restarts != restarts_before + 1:
        return f"job restarted {job.restarts - restarts_before} times since the intent"
    if is_held(job) and not requeue_held(job):
        return f"job is held for another reason ({job.reason})"
    return None


def _unheld(phase: str, job: JobInfo | None, gpus_after: int) -> dict[str, Any]:
    """A shrink whose job is no longer held by us: nothing to release."""
    if phase == "gone":
        state = job.state if job else "forgotten by Slurm"
        return {"error": f"job ended ({state}) before the GPU update; nothing left held"}
    assert job is not None
    if requested_gpus(job) == gpus_after:
        return {"result": f"job runs with {gpus_after} GPU(s); released by someone else"}
    return {"error": f"job was released before the GPU update (now {job.state}); not shrunk"}


def _state_of(detail: Mapping[str, Any]) -> str:
    """The record state a performed action's detail means."""
    if detail.get("open"):
        return "intent"
    if detail.get("error"):
        return "failed"
    return "skipped" if detail.get("skipped") else "done"


def _judged(applied: bool, what: str) -> tuple[str, dict[str, Any]]:
    if applied:
        return "done", {"result": what}
    return "failed", {"error": "not applied before the controller stopped; not repeated"}
