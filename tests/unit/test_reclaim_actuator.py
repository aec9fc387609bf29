"""The actuator: intent before, outcome after, dry-run, duplicates, shrink, reconciliation."""

from __future__ import annotations

from dataclasses import replace
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
from slurm_aigc.reclaim.ladder import PlannedAction
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.slurm import CommandResult, JobInfo, SlurmCli
from tests.fakes.slurm import FakeJob, FakeSlurm

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
    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, monotonic=clock, sleep=clock.sleep,
                        command_runner=mailer)
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
    assert [c for c in fake.mutations() if c[1] == "requeue"] == [["scontrol", "requeue", "Incomplete", "7"]]


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
    assert rows[1].detail["commands"] == ["scontrol requeue Incomplete 7"]
    assert rows[2].detail["commands"] == ["scontrol requeuehold Incomplete 7", "scontrol update JobId=7 Gres=gpu:a100:1",
                                          "scontrol release 7"]


def test_shrink_waits_for_pending_updates_gres_and_releases(store: ReclaimStore) -> None:
    fake, actuator, clock, _ = setup(store)
    fake.pending_after_polls = 6  # job reads until the requeued job leaves COMPLETING
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


def test_reconcile_of_a_notify_needs_this_intents_note_not_an_earlier_runs(store: ReclaimStore) -> None:
    fake, _, clock, _ = setup(store)
    live = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock)
    assert live.apply(plan("notify", step=0), show(fake)).state == "done"  # run 0 was warned
    fake.jobs["7"].restarts = 1  # ... and requeued; in run 1 the same verdict, the same note

    def crash(_: PlannedAction) -> None:
        raise ActuatorCrash("killed")

    run1 = PlannedAction("7/r1/idle/0:notify", "7", "aigc-alice", "aigc", "train", "idle", "notify", 0, False, 1, 4, 0,
                         None, "aigc-reclaim: job 7 idle: because; notify")
    crashing = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, after_intent=crash)
    with pytest.raises(ActuatorCrash):
        crashing.apply(run1, show(fake))
    [result] = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock).reconcile()
    assert (result.observation_key, result.state) == ("7/r1/idle/0:notify", "failed")

    store.record_intent(replace(run1, observation_key="7/r1/idle/1:notify", message="aigc-reclaim: job 7 idle: still"),
                        {"restarts_before": 1, "admin_comment_before": fake.jobs["7"].admin_comment,
                         "message": "aigc-reclaim: job 7 idle: still"}, clock())
    fake.jobs["7"].admin_comment = merge_admin_comment(fake.jobs["7"].admin_comment, "aigc-reclaim: job 7 idle: still")
    [written] = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock).reconcile()  # the write ran, then the crash
    assert written.state == "done"


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
    job.restarts, job.state, job.priority = 1, "PENDING", 0
    job.reason, job.description = "JobHeldUser", "job requeued in held state"  # what requeuehold shows
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


def test_signal_goes_where_the_job_declared_it_handles_it(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store, admin_comment="aigc_class=train aigc_signal=B.USR1")
    assert planned_commands(plan("signal"), show(fake), CONFIG) == [["scancel", "--signal=USR1", "--batch", "7"]]
    assert actuator.apply(plan("signal"), show(fake)).state == "done"
    assert fake.jobs["7"].state == "RUNNING"
    fake.jobs["7"].admin_comment = "aigc_class=train aigc_signal=10"  # --signal=USR1: the steps, not the shell
    assert planned_commands(plan("signal"), show(fake), CONFIG) == [["scancel", "--signal=USR1", "7"]]


def test_signal_to_a_job_that_did_not_declare_it_is_skipped_with_its_reason(store: ReclaimStore) -> None:
    # SIGUSR1's default action ends a batch script that does not trap it.
    fake, actuator, _, _ = setup(store, comment="aigc_signal=B.USR1")  # user text proves nothing
    result = actuator.apply(plan("signal"), show(fake))
    assert result.state == "skipped"
    assert "did not declare it handles SIGUSR1" in store.audit()[0].detail["skipped"]
    assert fake.mutations() == []


def test_actions_store_syncs_every_commit_to_disk(tmp_path: Path) -> None:
    # synchronous=NORMAL in WAL mode can lose the last commits (a recorded intent) on power loss.
    factory = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    with factory() as session:
        assert session.connection().exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL


def finish_epilog(fake: FakeSlurm, job_id: str = "7") -> None:
    """The requeued job's epilog ends: Slurm shows it PENDING, still held."""
    job = fake.jobs[job_id]
    assert (job.state, job.priority) == ("COMPLETING", 0)
    job.state = "PENDING"


def slow_epilog(store: ReclaimStore) -> tuple[FakeSlurm, Actuator, Clock]:
    fake, _, clock, _ = setup(store)
    fake.pending_after_polls = 10_000  # stays COMPLETING until finish_epilog
    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, monotonic=clock, sleep=clock.sleep,
                        pending_wait_s=5.0)
    return fake, actuator, clock


@pytest.mark.parametrize("step_s", [-3600.0, 3600.0])
def test_the_wait_for_pending_lasts_its_time_whatever_the_wall_clock_does(store: ReclaimStore, step_s: float) -> None:
    # An NTP step of the wall clock mid-wait: back, the wait lasted an hour more (the tick
    # stalled); forward, it ended after one poll.
    fake, _, _, _ = setup(store)
    fake.pending_after_polls = 10_000  # stays COMPLETING: the wait runs its full time
    monotonic, wall = Clock(), Clock()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        monotonic.sleep(seconds)
        wall.sleep(seconds + (step_s if len(sleeps) == 1 else 0.0))

    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=wall, monotonic=monotonic, sleep=sleep,
                        pending_wait_s=5.0)
    result = actuator.apply(plan("shrink", gpus_after=1), show(fake))
    assert result.state == "intent" and result.detail["phase"] == "waiting_pending"
    assert sum(sleeps) == 5.0


def test_requeue_of_a_job_that_ended_since_the_tick_read_it_is_skipped(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    decided_on = show(fake)
    fake.jobs["7"].state = "COMPLETED"
    result = actuator.apply(plan("requeue"), decided_on)
    assert (result.state, result.detail["skipped"]) == ("skipped", "job is COMPLETED now, no longer RUNNING")
    assert fake.mutations() == [] and fake.jobs["7"].restarts == 0
    assert store.audit()[0].state == "skipped"


def test_requeue_of_a_job_that_ends_right_before_the_command_does_not_run_it_again(store: ReclaimStore) -> None:
    fake, _, clock, _ = setup(store)

    def job_ends(_: PlannedAction) -> None:  # between the re-read and `scontrol requeue`
        fake.jobs["7"].state = "COMPLETED"

    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, after_intent=job_ends)
    result = actuator.apply(plan("requeue"), show(fake))
    assert fake.mutations() == [["scontrol", "requeue", "Incomplete", "7"]]
    assert (fake.jobs["7"].state, fake.jobs["7"].restarts) == ("COMPLETED", 0)
    assert result.state == "skipped" and "had ended" in result.detail["skipped"]


def test_action_on_a_job_restarted_or_opted_out_since_the_tick_is_skipped(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    decided_on = show(fake)
    fake.jobs["7"].restarts = 1
    assert "restarted meanwhile" in actuator.apply(plan("requeue"), decided_on).detail["skipped"]
    fake.jobs["7"].restarts = 0
    fake.jobs["7"].admin_comment = "aigc_class=train aigc_reclaim=no"
    assert "opted out" in actuator.apply(plan("notify", step=0), decided_on).detail["skipped"]
    assert fake.mutations() == []


def test_notify_keeps_the_hooks_stamp_in_front(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store, admin_comment="aigc_class=train; site: " + "x" * 600)
    actuator.apply(plan("notify", step=0), show(fake))
    written = fake.jobs["7"].admin_comment
    assert written.startswith("aigc_class=train; ") and written.endswith("because; notify")
    assert len(written) <= 480


def test_shrink_not_pending_in_time_stays_open_and_is_released_on_a_later_tick(store: ReclaimStore) -> None:
    fake, actuator, _ = slow_epilog(store)
    result = actuator.apply(plan("shrink", gpus_after=1), show(fake))
    assert result.state == "intent" and "not PENDING" in result.detail["open"]
    [row] = store.audit()
    assert (row.state, row.detail["phase"]) == ("intent", "waiting_pending")
    assert [r.state for r in actuator.reconcile()] == ["intent"]  # epilog still running: wait
    finish_epilog(fake)
    [settled] = actuator.reconcile()
    assert settled.state == "done", settled.detail
    job = fake.jobs["7"]
    assert (job.gpus, job.priority, job.restarts) == (1, 100, 1)
    assert [c[1] for c in fake.mutations()] == ["requeuehold", "update", "release"]
    assert actuator.reconcile() == []


@pytest.mark.parametrize("lost_after_polls", [0, 3])
def test_a_shrink_whose_lease_runs_out_mid_wait_is_left_to_the_holder(store: ReclaimStore, lost_after_polls: int) -> None:
    # The wait for PENDING (up to pending_wait_s, 60 s shipped) can outlast the lease's margin;
    # once the lease is gone another controller may reconcile the same shrink, so this one must
    # neither lower the GPUs nor release the job: the intent stays open for the holder.
    fake, actuator, _ = slow_epilog(store)
    polls = {"n": 0}
    original = fake.pending_after_polls

    def lease_lost() -> bool:
        polls["n"] += 1
        return polls["n"] > lost_after_polls

    actuator.fence_when(lease_lost)
    fake.pending_after_polls = original if lost_after_polls else 0  # 0: PENDING at the first poll
    result = actuator.apply(plan("shrink", gpus_after=1), show(fake))
    assert result.state == "intent" and "lease ran out" in result.detail["open"]
    assert [c[1] for c in fake.mutations()] == ["requeuehold"]
    [row] = store.audit()
    assert (row.state, row.detail["phase"]) == ("intent", "waiting_pending")
    if fake.jobs["7"].state == "COMPLETING":
        finish_epilog(fake)
    actuator.fence_when(lambda: False)  # the holder's reconcile finishes it
    [settled] = actuator.reconcile()
    assert settled.state == "done", settled.detail
    assert [c[1] for c in fake.mutations()] == ["requeuehold", "update", "release"]


def test_a_sigterm_lets_the_shrink_under_way_finish(store: ReclaimStore) -> None:
    # Left open, the job would stay held until a controller runs again (an admin stopping the
    # daemon for maintenance): the stop only keeps the batch's next actions from starting.
    fake, _, clock, _ = setup(store)
    fake.pending_after_polls = 3
    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, monotonic=clock, sleep=clock.sleep,
                        pending_wait_s=5.0)
    calls = {"n": 0}

    def stopping() -> bool:
        calls["n"] += 1
        return calls["n"] > 1  # SIGTERM right after the shrink started

    actuator.stop_when(stopping)
    results = actuator.apply_batch([(plan("shrink", gpus_after=1), show(fake)), (plan("requeue", step=2), show(fake))])
    assert [r.state for r in results] == ["done"], results
    assert [c[1] for c in fake.mutations()] == ["requeuehold", "update", "release"]


def test_a_restarted_controller_releases_the_hold_of_a_shrink_it_left_waiting(store: ReclaimStore) -> None:
    fake, actuator, clock = slow_epilog(store)
    actuator.apply(plan("shrink", gpus_after=1), show(fake))
    finish_epilog(fake)
    restarted = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock)
    [settled] = restarted.reconcile()
    assert (settled.state, fake.jobs["7"].priority, fake.jobs["7"].gpus) == ("done", 100, 1)


def test_a_failed_release_is_retried_until_the_job_is_free(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    fake.fail["scontrol release"] = "Unable to contact slurm controller"
    result = actuator.apply(plan("shrink", gpus_after=1), show(fake))
    assert result.state == "intent" and result.detail["phase"] == "release_failed"
    assert fake.jobs["7"].priority == 0
    del fake.fail["scontrol release"]
    [settled] = actuator.reconcile()
    assert settled.state == "done" and fake.jobs["7"].priority == 100


def test_a_shrink_whose_job_is_cancelled_while_held_is_closed(store: ReclaimStore) -> None:
    fake, actuator, _ = slow_epilog(store)
    actuator.apply(plan("shrink", gpus_after=1), show(fake))
    fake.jobs["7"].state = "CANCELLED"
    [settled] = actuator.reconcile()
    assert settled.state == "failed" and "nothing left held" in settled.detail["error"]
    assert actuator.reconcile() == []


def test_dry_run_reconcile_of_a_half_done_shrink_changes_nothing(store: ReclaimStore) -> None:
    fake, actuator, _ = slow_epilog(store)
    actuator.apply(plan("shrink", gpus_after=1), show(fake))
    finish_epilog(fake)
    before = len(fake.mutations())
    [report] = actuator.reconcile(dry_run=True)
    assert report.dry_run and "would finish the shrink" in report.detail["result"]
    assert len(fake.mutations()) == before and fake.jobs["7"].priority == 0
    assert [r.state for r in store.audit()] == ["intent"]


def test_a_shrink_interrupted_by_slurmctld_after_the_hold_stays_open_until_released(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    fake.fail["scontrol update"] = "slurm_update error: Unable to contact slurm controller"
    fake.fail["scontrol release"] = "slurm_update error: Unable to contact slurm controller"
    result = actuator.apply(plan("shrink", gpus_after=1), show(fake))
    assert result.state == "intent" and fake.jobs["7"].priority == 0
    fake.fail.clear()  # slurmctld answers again
    [settled] = actuator.reconcile()
    assert settled.state == "done" and (fake.jobs["7"].gpus, fake.jobs["7"].priority) == (1, 100)


def test_a_failed_requeuehold_that_did_nothing_is_closed_on_the_next_tick(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    fake.fail["scontrol requeuehold"] = "Requested operation is presently disabled"
    assert actuator.apply(plan("shrink", gpus_after=1), show(fake)).state == "intent"
    [settled] = actuator.reconcile()
    assert settled.state == "failed" and fake.jobs["7"].restarts == 0
    assert actuator.reconcile() == []


def test_a_skip_keeps_the_planned_commands_in_the_record(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    decided_on = show(fake)
    fake.jobs["7"].state = "COMPLETED"
    actuator.apply(plan("requeue"), decided_on)
    assert store.audit()[0].detail["commands"] == ["scontrol requeue Incomplete 7"]


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5"])
def test_a_batch_rechecks_from_one_listing_while_it_is_fresh_on_22_05_and_reads_each_job_on_24_11(
        store: ReclaimStore, version: str) -> None:
    fake = FakeSlurm(jobs={j: FakeJob(j, gpus=4) for j in ("7", "8", "9")}, version=version)
    clock = Clock()

    def slow_action(_: PlannedAction) -> None:  # each action takes 0.6 s: the third re-check lists again
        clock.now += 0.6

    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, monotonic=clock, after_intent=slow_action,
                        command_runner=lambda argv, timeout_s, stdin=None: CommandResult(tuple(argv), 0, "", ""))
    decided_on = {j.job_id: j for j in SlurmCli(runner=fake).jobs()}
    fake.calls.clear()
    results = actuator.apply_batch([(plan("notify", job_id=j, step=0), decided_on[j]) for j in ("7", "8", "9")])
    assert [r.state for r in results] == ["done", "done", "done"]
    reads = [c for c in fake.calls if c[0] == "squeue" or c[1:4] == ["-d", "--json", "show"]]
    if version == "22.05.8":
        assert reads == [["squeue", "--json"]] * 2
    else:
        assert reads == [["scontrol", "-d", "--json", "show", "job", j] for j in ("7", "8", "9")]


def test_a_wall_clock_step_back_does_not_keep_a_stale_listing_for_the_rechecks(store: ReclaimStore) -> None:
    # 1.5 s pass while the wall clock steps back 1 s: by the wall clock the listing was 0.5 s
    # old and the next re-check trusted a listing older than RECHECK_LISTING_MAX_AGE_S.
    fake = FakeSlurm(jobs={j: FakeJob(j, gpus=4) for j in ("7", "8")}, version="22.05.8")
    monotonic, wall = Clock(), Clock()

    def slow_action(_: PlannedAction) -> None:
        monotonic.now += 1.5
        wall.now += 1.5 - 1.0

    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=wall, monotonic=monotonic,
                        after_intent=slow_action,
                        command_runner=lambda argv, timeout_s, stdin=None: CommandResult(tuple(argv), 0, "", ""))
    decided_on = {j.job_id: j for j in SlurmCli(runner=fake).jobs()}
    fake.calls.clear()
    actuator.apply_batch([(plan("notify", job_id=j, step=0), decided_on[j]) for j in ("7", "8")])
    assert [c for c in fake.calls if c[0] == "squeue"] == [["squeue", "--json"]] * 2


def crashed_shrink_intent(store: ReclaimStore) -> FakeSlurm:
    """A shrink intent recorded, then the controller killed before its `requeuehold`."""
    fake, _, clock, _ = setup(store)

    def crash(_: PlannedAction) -> None:
        raise ActuatorCrash("killed before requeuehold")

    with pytest.raises(ActuatorCrash):
        Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, after_intent=crash).apply(
            plan("shrink", gpus_after=1), show(fake))
    assert fake.mutations() == []
    return fake


@pytest.mark.parametrize(("restarts", "reason", "description"), [
    (1, "JobHeldUser", ""), (2, "JobHeldUser", "job requeued in held state"), (1, "launch failed requeued held", ""),
    (1, "JobHeldAdmin", ""),  # an administrator's scontrol hold after a node failure's requeue
    (1, "JobHeldAdmin", "job requeued in held state"),  # ... or on top of the requeuehold (22.05.8 keeps the text)
])
def test_reconcile_leaves_a_hold_it_did_not_place_alone(store: ReclaimStore, restarts: int, reason: str,
                                                        description: str) -> None:
    """Requeued by a node failure and held by its owner or an administrator (or requeued twice, or
    held after a failed launch, or held by an administrator after the requeuehold) while the
    controller was down: not only our requeuehold, so not released or shrunk."""
    fake = crashed_shrink_intent(store)
    job = fake.jobs["7"]
    job.restarts, job.state, job.reason, job.priority = restarts, "PENDING", reason, 0
    job.description = description
    [result] = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=Clock()).reconcile()
    assert result.state == "failed" and "not our requeuehold" in result.detail["error"]
    assert fake.mutations() == [] and (job.gpus, job.priority) == (4, 0)


def test_reconcile_finishes_its_own_requeuehold_as_slurm_shows_it(store: ReclaimStore) -> None:
    fake = crashed_shrink_intent(store)
    job = fake.jobs["7"]  # requeuehold ran, then the crash: slurmctld's description of that hold
    job.restarts, job.state, job.priority = 1, "PENDING", 0
    job.reason, job.description = "JobHeldUser", "job_requeued_in_held_state"  # the underscored form too
    [result] = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=Clock()).reconcile()
    assert result.state == "done" and (job.gpus, job.priority) == (1, 100)


def test_reconcile_releases_its_hold_on_a_job_exempt_since_without_lowering_its_gpus(store: ReclaimStore) -> None:
    fake = crashed_shrink_intent(store)
    job = fake.jobs["7"]
    job.restarts, job.state, job.priority = 1, "PENDING", 0
    job.reason, job.description = "JobHeldUser", "job requeued in held state"
    job.admin_comment = "aigc_class=train aigc_reclaim=no"  # opted out meanwhile
    [result] = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=Clock()).reconcile()
    assert result.state == "skipped" and "opted out" in result.detail["skipped"]
    assert [c[1] for c in fake.mutations()] == ["release"] and (job.gpus, job.priority) == (4, 100)


def test_a_requeue_whose_confirming_read_fails_stays_open_and_reconcile_records_it_done(store: ReclaimStore) -> None:
    fake, _, clock, _ = setup(store)
    requeued = {"yes": False}

    def runner(argv: object, timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = list(argv)  # type: ignore[call-overload]
        if requeued["yes"] and args[0] == "squeue":
            return CommandResult(tuple(args), 1, "", "squeue: error: Socket timed out on send/recv operation")
        result = fake(args, timeout_s, stdin)
        requeued["yes"] = requeued["yes"] or args[:2] == ["scontrol", "requeue"]
        return result

    actuator = Actuator(SlurmCli(runner=runner), store, CONFIG, clock=clock)
    result = actuator.apply(plan("requeue"), show(fake))
    assert result.state == "intent" and fake.jobs["7"].restarts == 1
    assert store.audit()[0].state == "intent"
    [settled] = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock).reconcile()
    assert settled.state == "done" and store.audit()[0].state == "done"


def test_failures_that_provably_did_nothing_say_so_for_the_ladder(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    fake.fail["scontrol requeue"] = "slurm_requeue error: Socket timed out on send/recv operation"
    assert actuator.apply(plan("requeue"), show(fake)).detail["acted"] is False  # restarts unchanged after it
    decided_on = show(fake)
    fake.fail["squeue"] = "squeue: error: Socket timed out on send/recv operation"  # the re-read before acting
    assert actuator.apply(plan("requeue", step=2), decided_on).detail["acted"] is False
    del fake.fail["squeue"]
    fake.fail["scontrol update"] = "slurm_update error: Socket timed out"  # the comment is not there after it
    assert actuator.apply(plan("notify", step=0), show(fake)).detail["acted"] is False
    del fake.fail["scontrol update"]
    assert [r.detail.get("acted") for r in store.audit()] == [False, False, False]


@pytest.mark.parametrize("readable", [True, False])
def test_a_notify_whose_update_timed_out_after_landing_is_judged_by_the_comment(store: ReclaimStore,
                                                                                readable: bool) -> None:
    fake, _, clock, _ = setup(store)
    updated: list[bool] = []

    def runner(argv: object, timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = list(argv)  # type: ignore[call-overload]
        if updated and not readable and args[0] in ("squeue", "scontrol") and args[1:2] != ["update"]:
            return CommandResult(tuple(args), 1, "", "squeue: error: Socket timed out on send/recv operation")
        result = fake(args, timeout_s, stdin)  # slurmctld writes it, then the answer is lost
        if args[:2] == ["scontrol", "update"]:
            updated.append(True)
            return CommandResult(tuple(args), 1, "", "slurm_update error: Socket timed out on send/recv operation")
        return result

    actuator = Actuator(SlurmCli(runner=runner), store, CONFIG, clock=clock, sleep=clock.sleep)
    result = actuator.apply(plan("notify", step=0), show(fake))
    if readable:  # the comment is there: the warning went out
        assert result.state == "done" and "acted" not in result.detail
    else:  # it may have: the step is taken, as before
        assert result.state == "failed" and "acted" not in result.detail


def test_reconcile_of_a_notify_that_never_reached_slurm_lets_the_ladder_warn_again(store: ReclaimStore) -> None:
    # The intent committed, then the controller died (or the tick aborted) before `scontrol
    # update`: closed as failed but taken as given, the ladder requeued the job a cool-down
    # later with no warning ever sent.
    from slurm_aigc.reclaim.ladder import plan_job
    from tests.unit.test_reclaim_ladder import CONFIG as LADDER_CONFIG
    from tests.unit.test_reclaim_ladder import FACTS, NOW, verdict

    fake, actuator, _, _ = setup(store)
    first = plan_job(verdict("idle"), FACTS, (), LADDER_CONFIG, NOW)
    assert isinstance(first, PlannedAction) and first.action == "notify"
    store.record_intent(first, {"restarts_before": 0, "admin_comment_before": "aigc_class=train",
                                "message": first.message}, NOW)
    [result] = actuator.reconcile()
    assert result.state == "failed" and result.detail["acted"] is False and fake.mutations() == []
    history = [replace(r.as_past(), not_acted=r.detail.get("acted") is False) for r in store.audit()]  # as the controller reads it
    again = plan_job(verdict("idle"), FACTS, history, LADDER_CONFIG, NOW + LADDER_CONFIG.cooldown_s + 1)
    assert isinstance(again, PlannedAction) and again.action == "notify" and again.observation_key.endswith("#2")


def test_reconcile_of_a_requeue_that_did_not_take_says_nothing_happened(store: ReclaimStore) -> None:
    fake, actuator, _, _ = setup(store)
    store.record_intent(plan("requeue"), {"restarts_before": 0}, 900.0)  # killed before the command
    [result] = actuator.reconcile()  # still RUNNING, restarts unchanged: provably not requeued
    assert result.state == "failed" and result.detail["acted"] is False and fake.mutations() == []


def test_a_reread_slurm_answers_unreadably_is_not_acted_on(store: ReclaimStore) -> None:
    # A listing that is not JSON (a truncated answer) raised past the actuator and aborted the
    # tick with the intent open; reconcile then took the step as given.
    fake, _, clock, _ = setup(store)
    decided_on = show(fake)

    def runner(argv: object, timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = list(argv)  # type: ignore[call-overload]
        if args[0] == "squeue":
            return CommandResult(tuple(args), 0, '{"jobs": [', "")
        return fake(args, timeout_s, stdin)

    result = Actuator(SlurmCli(runner=runner), store, CONFIG, clock=clock, sleep=clock.sleep).apply(
        plan("notify", step=0), decided_on)
    assert result.state == "failed" and result.detail["acted"] is False and fake.mutations() == []


def test_a_stop_asked_during_a_batch_starts_no_further_action(store: ReclaimStore) -> None:
    # SIGTERM mid-tick: ten shrinks, each waiting for its epilog, outlast TimeoutStopSec, and a
    # SIGKILL in the middle of one leaves its job held until a controller runs again.
    fake = FakeSlurm(jobs={j: FakeJob(j, gpus=4) for j in ("7", "8", "9")})
    stop = {"asked": False}

    def sigterm_now(_: PlannedAction) -> None:
        stop["asked"] = True

    clock = Clock()
    actuator = Actuator(SlurmCli(runner=fake), store, CONFIG, clock=clock, sleep=clock.sleep, after_intent=sigterm_now)
    actuator.stop_when(lambda: stop["asked"])
    batch = [(plan("notify", job_id=j, step=0), show(fake, j)) for j in ("7", "8", "9")]
    results = actuator.apply_batch(batch)
    assert [r.job_id for r in results] == ["7"] and results[0].state == "done"
    assert [r.job_id for r in store.audit()] == ["7"]  # nothing recorded for the two left: planned again
