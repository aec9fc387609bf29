"""The one place reclaim changes anything: applies planned actions through `SlurmCli`.

Each action is written to the `actions` table as an intent *before* Slurm is touched and
closed with its outcome after, so a controller killed in between (kill -9 included) never
repeats the action: the intent's observation key stays taken, and `reconcile` at start-up
asks Slurm what happened (restart count, state, admin comment) and records it without
redoing anything. In dry-run the intent is recorded and closed as `skipped` with the exact
commands it would have run; Slurm is not touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_aigc.errors import AigcError, SlurmCommandError
from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.jobs import is_held, requested_gpus, shrink_updates
from slurm_aigc.reclaim.ladder import ADMIN_COMMENT_TAG, PlannedAction
from slurm_aigc.reclaim.store import ActionRow, ReclaimStore
from slurm_aigc.slurm import JobInfo, Runner, SlurmCli, quote_argv, run_command

LOG = logging.getLogger(__name__)
ADMIN_COMMENT_MAX = 480  # keep our note short: AdminComment is shared with the site's tools
_PENDING_WAIT_S = 60.0


class ActuatorCrash(AigcError):
    """Raised by a test hook between intent and outcome to simulate a killed controller."""


@dataclass(frozen=True)
class ActionResult:
    """What happened to one planned action (or reconciled intent)."""

    observation_key: str
    job_id: str
    action: str
    state: str  # done | failed | skipped (dry-run) | duplicate (key already recorded)
    dry_run: bool
    commands: tuple[str, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        head = "dry-run: would" if self.dry_run else self.state + ":"
        return f"{head} {self.action} job {self.job_id} [{self.observation_key}]: " + "; ".join(self.commands)


def merge_admin_comment(existing: str, note: str) -> str:
    """Replace our previous note (from ADMIN_COMMENT_TAG on) with `note`, keeping the site's text."""
    kept = existing.split(ADMIN_COMMENT_TAG, 1)[0].rstrip(" ;")
    merged = f"{kept}; {note}" if kept else note
    return merged[-ADMIN_COMMENT_MAX:] if len(merged) > ADMIN_COMMENT_MAX else merged


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
        return [["scancel", f"--signal={config.signal}", "--batch", job_id]]
    if plan.action == "requeue":
        return [["scontrol", "requeue", job_id]]
    if plan.action == "cancel":
        return [["scancel", job_id]]
    if plan.action == "shrink":
        first = shrink_updates(job, plan.gpus_after)[:1]
        update = [f"{k}={v}" for k, v in first[0].items()] if first else ["<no rewritable GPU request>"]
        return [["scontrol", "requeuehold", job_id], ["scontrol", "update", f"JobId={job_id}", *update],
                ["scontrol", "release", job_id]]
    raise ValueError(f"unknown action {plan.action!r}")


def notify_command(template: Sequence[str], plan: PlannedAction) -> list[str]:
    """The configured notification argv with {user} {job_id} {verdict} {message} filled in."""
    values = {"user": plan.user, "job_id": plan.job_id, "verdict": plan.verdict, "message": plan.message}
    return [part.format(**values) for part in template]


class Actuator:
    """Applies `PlannedAction`s; see the module docstring."""

    def __init__(
        self,
        slurm: SlurmCli,
        store: ReclaimStore,
        config: ReclaimConfig,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        command_runner: Runner = run_command,
        after_intent: Callable[[PlannedAction], None] | None = None,
    ) -> None:
        self._slurm = slurm
        self._store = store
        self.config = config
        self._clock = clock
        self._sleep = sleep
        self._command_runner = command_runner
        self._after_intent = after_intent

    def apply(self, plan: PlannedAction, job: JobInfo) -> ActionResult:
        """Record the intent, run the action (unless dry-run), record the outcome."""
        commands = tuple(quote_argv(argv) for argv in planned_commands(plan, job, self.config))
        intent = {"restarts_before": job.restarts, "state_before": job.state, "commands": list(commands),
                  "message": plan.message}
        action_id = self._store.record_intent(plan, intent, self._clock())
        if action_id is None:
            return ActionResult(plan.observation_key, plan.job_id, plan.action, "duplicate", plan.dry_run, commands)
        if self._after_intent is not None:
            self._after_intent(plan)
        if plan.dry_run:
            result = ActionResult(plan.observation_key, plan.job_id, plan.action, "skipped", True, commands,
                                  {"result": "dry-run: nothing changed in Slurm"})
        else:
            result = self._run(plan, job, commands)
        self._store.record_outcome(action_id, result.state, result.detail, self._clock())
        LOG.info("%s", result.line())
        return result

    def _run(self, plan: PlannedAction, job: JobInfo, commands: tuple[str, ...]) -> ActionResult:
        try:
            detail = self._perform(plan, job)
            state = "failed" if detail.get("error") else "done"
        except SlurmCommandError as error:
            state, detail = "failed", {"error": str(error)}
        return ActionResult(plan.observation_key, plan.job_id, plan.action, state, False, commands, detail)

    def _perform(self, plan: PlannedAction, job: JobInfo) -> dict[str, Any]:
        if plan.action == "notify":
            return self._notify(plan, job)
        if plan.action == "signal":
            self._slurm.cancel(plan.job_id, signal=self.config.signal, batch_only=True)
            return {"result": f"sent SIG{self.config.signal} to the batch step"}
        if plan.action == "requeue":
            self._slurm.requeue(plan.job_id)
            return {"result": "requeued"}
        if plan.action == "cancel":
            self._slurm.cancel(plan.job_id)
            return {"result": "cancelled"}
        if plan.action == "shrink":
            self._slurm.requeue(plan.job_id, hold=True)
            return self._finish_shrink(plan.job_id, job, plan.gpus_after)
        raise ValueError(f"unknown action {plan.action!r}")

    def _notify(self, plan: PlannedAction, job: JobInfo) -> dict[str, Any]:
        # The admin comment is the record that must exist; the other channels are best effort.
        self._slurm.update_job(plan.job_id, AdminComment=merge_admin_comment(job.admin_comment, plan.message))
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

    def _finish_shrink(self, job_id: str, before: JobInfo, gpus_after: int) -> dict[str, Any]:
        """After `scontrol requeuehold`: wait until pending, lower the GPU count, release.

        The job is released whatever happens, so a failed update never leaves it held.
        """
        pending = self._wait_pending(job_id)
        if pending is None:
            return {"error": f"job {job_id} did not become pending within {_PENDING_WAIT_S:.0f}s; left held for an admin"}
        tried: list[str] = []
        applied: dict[str, str] | None = None
        for update in shrink_updates(before, gpus_after):
            try:
                self._slurm.update_job(job_id, **update)
                applied = update
                break
            except SlurmCommandError as error:
                tried.append(f"{update}: {error.stderr.strip()[:200]}")
        self._slurm.release(job_id)
        if applied is None:
            return {"error": "no GPU update accepted; released unchanged", "tried": tried}
        return {"result": f"requeued with {gpus_after} GPU(s) and released", "update": applied, "tried": tried}

    def _wait_pending(self, job_id: str) -> JobInfo | None:
        deadline = self._clock() + _PENDING_WAIT_S
        while True:
            job = self._slurm.job(job_id)
            if job is not None and job.state == "PENDING":
                return job
            if self._clock() >= deadline:
                return None
            self._sleep(1.0)

    def reconcile(self) -> list[ActionResult]:
        """Close every intent left without outcome by asking Slurm what happened; never redo."""
        results = []
        for row in self._store.open_intents():
            state, detail = self._judge(row)
            self._store.record_outcome(row.id, state, {**detail, "reconciled": True}, self._clock())
            result = ActionResult(row.observation_key, row.job_id, row.action, state, False, (), detail)
            LOG.warning("reconciled intent %s: %s %s", row.observation_key, state, detail.get("result") or detail.get("error"))
            results.append(result)
        return results

    def _judge(self, row: ActionRow) -> tuple[str, dict[str, Any]]:
        job = self._slurm.job(row.job_id)
        before = int(row.detail.get("restarts_before", 0))
        if job is None:
            return "failed", {"error": "job no longer known to Slurm; outcome unknown, not repeated"}
        restarted = job.restarts > before
        if row.action == "requeue":
            return _judged(restarted, f"requeue took effect (restarts {before} -> {job.restarts})")
        if row.action == "shrink":
            return self._judge_shrink(row, job, restarted)
        if row.action == "notify":
            return _judged(ADMIN_COMMENT_TAG in job.admin_comment, "admin comment is set")
        if row.action == "cancel":
            return _judged(job.state.startswith("CANCELLED"), f"job is {job.state}")
        return "failed", {"error": f"{row.action}: outcome cannot be verified after a restart; not repeated"}

    def _judge_shrink(self, row: ActionRow, job: JobInfo, restarted: bool) -> tuple[str, dict[str, Any]]:
        if not restarted:
            return _judged(False, "")
        target = row.gpus_after or 0
        if is_held(job):
            # Killed after our requeuehold: finish the shrink so the job is not left held forever.
            detail = self._finish_shrink(row.job_id, job, target)
            return ("failed" if detail.get("error") else "done"), {**detail, "completed_after_restart": True}
        return _judged(requested_gpus(job) == target, f"job restarted with {target} GPU(s)")


def _judged(applied: bool, what: str) -> tuple[str, dict[str, Any]]:
    if applied:
        return "done", {"result": what}
    return "failed", {"error": "not applied before the controller stopped; not repeated"}
