"""The actuator: intent before, outcome after, dry-run, duplicates, shrink, reconciliation."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_aigc.db import open_database
from slurm_aigc.reclaim.actuator import (
    Actuator,
    ActuatorCrash,
    merge_admin_comment,
    planned_commands,
)
from slurm_aigc.reclaim.config import NotifyConfig, ReclaimConfig
from slurm_aigc.reclaim.fakes import FakeJob, FakeSlurm
from slurm_aigc.reclaim.ladder import PlannedAction
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.slurm import CommandResult, JobInfo, SlurmCli

CONFIG = ReclaimConfig(dry_run=False, notify=NotifyConfig(scontrol_notify=True, command=("mailer", "{user}", "{message}")))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def plan(action: str, *, job_id: str = "7", dry_run: bool = False, gpus_after: int = 0, step: int = 1) -> PlannedAction:
    verdict = "over_allocated" if action == "shrink" else "idle"
    key = f"{'dry:' if dry_run else ''}{job_id}/r0/{verdict}/{step}:{action}"
    return PlannedAction(key, job_id, "aigc-alice", "aigc", "train", verdict, action, step, dry_run, 0, 4, gpus_after,
                         None, f"aigc-reclaim: job {job_id} {verdict}: because; {action}")


@pytest.fixture
def store(tmp_path: Path) -> ReclaimStore:
    return ReclaimStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"))


def setup(store: ReclaimStore, **job: object) -> tuple[FakeSlurm, Actuator, Clock, list[list[str]]]:
    fake = FakeSlurm(jobs={"7": FakeJob("7", gpus=4, **job)})  # type: ignore[arg-type]
    mails: list[list[str]] = []

    def mailer(argv: object, timeout_s: float, stdin: str | None = None) -> CommandResult:
        mails.append(list(argv))  # type: ignore[call-overload]
        return CommandResult(tuple(argv), 0, "", "")  # type: ignore[arg-type]

    clock = Clock()
    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, sleep=clock.sleep, command_runner=mailer)
    return fake, actuator, clock, mails


def show(fake: FakeSlurm, job_id: str = "7") -> JobInfo:
    job = SlurmCli(runner=fake).job(job_id)
    assert job is not None
    return job


def test_notify_sets_admin_comment_keeps_site_text_and_records_intent_then_outcome(store: ReclaimStore) -> None:
    fake, actuator, _, mails = setup(store, admin_comment="site: gpu-audit ok")
    result = actuator.apply(plan("notify", step=0), show(fake))
    assert result.state == "done"
    assert fake.jobs["7"].admin_comment == "site: gpu-audit ok; aigc-reclaim: job 7 idle: because; notify"
    assert ["scontrol", "notify", "7", "aigc-reclaim: job 7 idle: because; notify"] in fake.calls
    assert mails == [["mailer", "aigc-alice", "aigc-reclaim: job 7 idle: because; notify"]]
    [row] = store.audit()
    assert (row.state, row.ts_outcome, row.detail["restarts_before"]) == ("done", 1000.0, 0)
    assert row.detail["result"] == "notified via admin_comment, scontrol_notify, command"


def test_notify_channel_failure_is_recorded_but_not_fatal(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    fake.fail["scontrol notify"] = "scontrol_notify error: Job has no active steps"
    result = actuator.apply(plan("notify", step=0), show(fake))
    assert result.state == "done"
    assert "no active steps" in store.audit()[0].detail["channel_errors"][0]


def test_requeue_runs_once_per_observation(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    assert actuator.apply(plan("requeue"), show(fake)).state == "done"
    assert fake.jobs["7"].restarts == 1
    again = actuator.apply(plan("requeue"), show(fake))
    assert again.state == "duplicate"
    assert [c for c in fake.mutations() if c[1] == "requeue"] == [["scontrol", "requeue", "7"]]


def test_failed_command_is_recorded_as_failed(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    fake.fail["scontrol requeue"] = "Requested operation is presently disabled"
    result = actuator.apply(plan("requeue"), show(fake))
    assert result.state == "failed"
    assert "presently disabled" in store.audit()[0].detail["error"]


def test_dry_run_records_what_it_would_do_and_changes_nothing(store: ReclaimStore) -> None:
    fake, actuator, _, mails = setup(store)
    for action in ("notify", "requeue", "shrink"):
        result = actuator.apply(plan(action, dry_run=True, gpus_after=1), show(fake))
        assert result.state == "skipped"
        assert result.line().startswith(f"dry-run: would {action} job 7")
    assert fake.mutations() == [] and mails == []
    rows = store.audit()
    assert [r.dry_run for r in rows] == [True, True, True]
    assert rows[1].detail["commands"] == ["scontrol requeue 7"]
    assert rows[2].detail["commands"] == ["scontrol requeuehold 7", "scontrol update JobId=7 Gres=gpu:a100:1", "scontrol release 7"]


def test_shrink_waits_for_pending_updates_gres_and_releases(store: ReclaimStore) -> None:
    fake, actuator, clock, _ = setup(store)
    fake.pending_after_polls = 3
    result = actuator.apply(plan("shrink", gpus_after=1), show(fake))
    assert result.state == "done", result.detail
    job = fake.jobs["7"]
    assert (job.gpus, job.restarts, job.priority) == (1, 1, 100)
    verbs = [c[1] for c in fake.mutations()]
    assert verbs == ["requeuehold", "update", "release"]
    assert clock.now > 1000.0  # it polled until the job was pending


def test_shrink_tries_the_next_field_and_always_releases(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    fake.fail["scontrol update JobId=7 Gres="] = "Invalid generic resource (gres) specification"
    result = actuator.apply(plan("shrink", gpus_after=1), show(fake))
    assert result.state == "failed"
    assert result.detail["error"] == "no GPU update accepted; released unchanged"
    assert [c[1] for c in fake.mutations()][-1] == "release"
    assert any("TresPerNode=gres/gpu:a100:1" in " ".join(c) for c in fake.calls)


def test_crash_between_intent_and_outcome_then_reconcile_does_not_redo(store: ReclaimStore) -> None:
    fake, _, clock, _ = setup(store)

    def crash(_: PlannedAction) -> None:
        raise ActuatorCrash("killed")

    crashing = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, after_intent=crash)
    with pytest.raises(ActuatorCrash):
        crashing.apply(plan("requeue"), show(fake))
    assert [r.state for r in store.audit()] == ["intent"]
    restarted = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock)
    [result] = restarted.reconcile()
    assert result.state == "failed" and "not repeated" in result.detail["error"]
    assert fake.mutations() == []
    assert restarted.apply(plan("requeue"), show(fake)).state == "duplicate"
    assert fake.jobs["7"].restarts == 0


def test_reconcile_sees_a_requeue_that_happened(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    store.record_intent(plan("requeue"), {"restarts_before": 0}, 900.0)
    fake.jobs["7"].restarts = 1  # the requeue ran, the controller died before the outcome
    [result] = actuator.reconcile()
    assert result.state == "done"
    assert store.audit()[0].detail["reconciled"] is True
    assert fake.mutations() == []


def test_reconcile_finishes_an_interrupted_shrink(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    store.record_intent(plan("shrink", gpus_after=1), {"restarts_before": 0}, 900.0)
    job = fake.jobs["7"]
    job.restarts, job.state, job.reason, job.priority = 1, "PENDING", "JobHeldAdmin", 0
    [result] = actuator.reconcile()
    assert result.state == "done"
    assert (job.gpus, job.priority) == (1, 100)
    assert [c[1] for c in fake.mutations()] == ["update", "release"]


def test_reconcile_of_a_vanished_job_fails_without_action(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    store.record_intent(plan("requeue", job_id="99"), {"restarts_before": 0}, 900.0)
    [result] = actuator.reconcile()
    assert result.state == "failed" and "no longer known" in result.detail["error"]
    assert fake.mutations() == []


def test_merge_admin_comment_replaces_only_our_note() -> None:
    assert merge_admin_comment("", "aigc-reclaim: a") == "aigc-reclaim: a"
    assert merge_admin_comment("site x; aigc-reclaim: old", "aigc-reclaim: new") == "site x; aigc-reclaim: new"
    assert len(merge_admin_comment("x" * 1000, "aigc-reclaim: new")) == 480


def test_signal_goes_to_the_batch_step(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    assert planned_commands(plan("signal"), show(fake), CONFIG) == [["scancel", "--signal=USR1", "--batch", "7"]]
    assert actuator.apply(plan("signal"), show(fake)).state == "done"
    assert fake.jobs["7"].state == "RUNNING"


def test_actions_store_syncs_every_commit_to_disk(tmp_path: Path) -> None:
    # synchronous=NORMAL in WAL mode can lose the last commits (a recorded intent) on power loss.
    factory = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    with factory() as session:
        assert session.connection().exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
