"""Planning the next step: ladders, exemptions, applicability, caps and cool-down."""

from __future__ import annotations

from dataclasses import replace

from slurm_aigc.reclaim.config import ClassPolicy, Exemptions, ReclaimConfig
from slurm_aigc.reclaim.detect import Verdict
from slurm_aigc.reclaim.jobs import job_facts
from slurm_aigc.reclaim.ladder import (
    JobFacts,
    PastAction,
    PlannedAction,
    Wait,
    job_class_of,
    limit_per_tick,
    observation_key,
    opted_out,
    parse_job_tags,
    plan_job,
)
from tests.fakes.slurm import FakeJob

NOW = 10_000.0
CONFIG = ReclaimConfig(dry_run=False, cooldown_s=60.0, max_actions_per_job=4)
FACTS = JobFacts("7", "aigc-alice", "aigc", "normal", "train", batch=True, requeue_allowed=True,
                 restarts=0, num_nodes=1, gpus=4, limit_end_ts=NOW + 7200.0)


def verdict(kind: str | None, used: int | None = None) -> Verdict:
    return Verdict("7", "train", kind, "because", NOW, 60.0, NOW - 60.0, 4, used, ())


def done(plan: PlannedAction, ts: float) -> PastAction:
    return PastAction(plan.observation_key, plan.job_id, plan.verdict, plan.action, "done", plan.dry_run, ts, ts)


def test_no_verdict_no_action() -> None:
    assert plan_job(verdict(None), FACTS, (), CONFIG, NOW) == Wait("7", "because")


def test_ladder_notify_then_requeue_after_cooldown() -> None:
    first = plan_job(verdict("idle"), FACTS, (), CONFIG, NOW)
    assert isinstance(first, PlannedAction)
    assert (first.action, first.step, first.observation_key) == ("notify", 0, "7/r0/idle/0:notify")
    assert "next step requeue" in first.message
    history = [done(first, NOW)]
    waiting = plan_job(verdict("idle"), FACTS, history, CONFIG, NOW + 59.0)
    assert isinstance(waiting, Wait) and waiting.next_action == "requeue" and waiting.not_before_ts == NOW + 60.0
    second = plan_job(verdict("idle"), FACTS, history, CONFIG, NOW + 60.0)
    assert isinstance(second, PlannedAction)
    assert (second.action, second.observation_key, second.gpus_after) == ("requeue", "7/r0/idle/1:requeue", 0)
    assert second.gpu_hours_recovered == round(4 * (7200.0 - 60.0) / 3600.0, 3)  # the time left at NOW + 60
    finished = plan_job(verdict("idle"), FACTS, history + [done(second, NOW + 60.0)], CONFIG, NOW + 600.0)
    assert isinstance(finished, Wait) and "ladder finished" in finished.reason


def test_new_run_after_requeue_starts_the_ladder_again() -> None:
    history = [PastAction("7/r0/idle/0:notify", "7", "idle", "notify", "done", False, NOW - 500, NOW - 500),
               PastAction("7/r0/idle/1:requeue", "7", "idle", "requeue", "done", False, NOW - 400, NOW - 400)]
    plan = plan_job(verdict("idle"), replace(FACTS, restarts=1), history, CONFIG, NOW)
    assert isinstance(plan, PlannedAction) and plan.observation_key == "7/r1/idle/0:notify"


def test_per_job_cap() -> None:
    history = [PastAction(f"7/r{r}/idle/{s}:x", "7", "idle", "x", "done", False, 0.0, 0.0) for r in range(2) for s in range(2)]
    plan = plan_job(verdict("idle"), replace(FACTS, restarts=2), history, CONFIG, NOW)
    assert isinstance(plan, Wait) and "per-job cap of 4" in plan.reason


def test_unreconciled_intent_blocks_the_job() -> None:
    history = [PastAction("7/r0/idle/1:requeue", "7", "idle", "requeue", "intent", False, NOW - 500, None)]
    plan = plan_job(verdict("idle"), FACTS, history, CONFIG, NOW)
    assert isinstance(plan, Wait) and "no outcome" in plan.reason


def test_no_requeue_job_is_only_notified() -> None:
    facts = replace(FACTS, requeue_allowed=False)
    first = plan_job(verdict("idle"), facts, (), CONFIG, NOW)
    assert isinstance(first, PlannedAction) and first.action == "notify"
    assert "next step" not in first.message
    after = plan_job(verdict("idle"), facts, [done(first, NOW)], CONFIG, NOW + 1000)
    assert isinstance(after, Wait) and "ladder finished" in after.reason


def test_non_batch_job_is_never_signalled_or_requeued() -> None:
    config = replace(CONFIG, defaults=replace(CONFIG.defaults, ladder={"fake_busy": ("signal", "requeue")}))
    plan = plan_job(verdict("fake_busy"), replace(FACTS, batch=False), (), config, NOW)
    assert isinstance(plan, Wait) and "ladder finished" in plan.reason


def test_exemptions() -> None:
    config = replace(CONFIG, exempt=Exemptions(classes=frozenset({"interactive"}), accounts=frozenset({"vip"}),
                                               qos=frozenset({"urgent"}), users=frozenset({"boss"})))
    for facts, why in [
        (replace(FACTS, job_class="interactive"), "class interactive"),
        (replace(FACTS, account="vip"), "account vip"),
        (replace(FACTS, qos="urgent"), "QOS urgent"),
        (replace(FACTS, user="boss"), "user boss"),
        (replace(FACTS, opt_out=True), "opted out"),
    ]:
        plan = plan_job(verdict("idle"), facts, (), config, NOW)
        assert isinstance(plan, Wait) and why in plan.reason


def test_policy_may_deny_the_opt_out() -> None:
    plan = plan_job(verdict("idle"), replace(FACTS, opt_out=True), (), replace(CONFIG, opt_out="deny"), NOW)
    assert isinstance(plan, PlannedAction)


def test_shrink_to_used_gpus_single_node_only() -> None:
    notify = plan_job(verdict("over_allocated", used=1), FACTS, (), CONFIG, NOW)
    assert isinstance(notify, PlannedAction)
    # Notified within this episode (the verdict's stretch began at NOW - 60), a cool-down ago.
    shrink = plan_job(verdict("over_allocated", used=1), FACTS, [done(notify, NOW - 60)], CONFIG, NOW)
    assert isinstance(shrink, PlannedAction)
    assert (shrink.action, shrink.gpus_before, shrink.gpus_after) == ("shrink", 4, 1)
    multi = plan_job(verdict("over_allocated", used=1), replace(FACTS, num_nodes=2), [done(notify, NOW - 60)], CONFIG, NOW)
    assert isinstance(multi, Wait)


def test_dry_run_uses_its_own_keys_and_history() -> None:
    live_notify = PastAction("7/r0/idle/0:notify", "7", "idle", "notify", "done", False, NOW - 500, NOW - 500)
    plan = plan_job(verdict("idle"), FACTS, [live_notify], CONFIG, NOW, dry_run=True)
    assert isinstance(plan, PlannedAction)
    assert (plan.observation_key, plan.dry_run) == ("dry:7/r0/idle/0:notify", True)


def test_inapplicable_step_keeps_its_index_in_the_key() -> None:
    config = replace(CONFIG, defaults=replace(CONFIG.defaults, ladder={"idle": ("signal", "notify")}))
    plan = plan_job(verdict("idle"), replace(FACTS, batch=False), (), config, NOW)
    assert isinstance(plan, PlannedAction) and plan.observation_key == observation_key("7", 0, "idle", 1, "notify", False)


def test_class_ladder_is_used() -> None:
    config = replace(CONFIG, classes={"infer": ClassPolicy(ladder={"memory_held": ("notify",)})})
    first = plan_job(verdict("memory_held"), replace(FACTS, job_class="infer"), (), config, NOW)
    assert isinstance(first, PlannedAction) and "next step" not in first.message


def test_per_tick_cap_keeps_escalations_first() -> None:
    plans = []
    for job, step in [("1", 0), ("2", 1), ("3", 0)]:
        plan = plan_job(verdict("idle"), replace(FACTS, job_id=job), (), CONFIG, NOW)
        assert isinstance(plan, PlannedAction)
        plans.append(replace(plan, step=step))
    kept, dropped = limit_per_tick(plans, 2)
    assert [p.job_id for p in kept] == ["2", "1"]
    assert [w.job_id for w in dropped] == ["3"] and "per-tick cap" in dropped[0].reason


def test_tags_and_class_from_the_hooks_stamp_only() -> None:
    stamped = "aigc_class=train aigc_reclaim=no; aigc-reclaim: earlier note"
    assert parse_job_tags(stamped) == {"class": "train", "reclaim": "no"}
    assert job_class_of(stamped, "unclassified") == "train"
    # User text (the comment's tag, or a stamp-like word after the leading stamp) is never trusted.
    assert job_class_of("aigc:type=interactive,reclaim=no", "unclassified") == "unclassified"
    assert job_class_of("note; aigc_class=interactive", "unclassified") == "unclassified"
    assert job_class_of("", "unclassified") == "unclassified"
    assert opted_out(stamped) and not opted_out("aigc:type=infer,reclaim=no")


def test_requeue_of_a_shard_job_recovers_its_gpu_fraction() -> None:
    shard_job = replace(FACTS, gpus=0, shard_gpus=0.25, limit_end_ts=NOW + 61 + 3600.0)
    past = ()
    first = plan_job(verdict("idle"), shard_job, past, CONFIG, NOW)
    assert isinstance(first, PlannedAction) and first.action == "notify" and first.gpu_hours_recovered is None
    second = plan_job(verdict("idle"), shard_job, (done(first, NOW),), CONFIG, NOW + 61)
    assert isinstance(second, PlannedAction) and second.action == "requeue"
    assert second.gpu_hours_recovered == 0.25


def test_signal_step_only_for_jobs_that_declared_the_signal_else_skipped_with_reason() -> None:
    config = replace(CONFIG, defaults=replace(CONFIG.defaults, ladder={"fake_busy": ("signal", "requeue")}))
    plan = plan_job(verdict("fake_busy"), FACTS, (), config, NOW)
    assert isinstance(plan, PlannedAction) and plan.action == "requeue"
    assert plan.skipped == ("signal: job did not declare it handles SIGUSR1 (no aigc:signal= tag at submit)",)
    declared = plan_job(verdict("fake_busy"), replace(FACTS, declared_signal="B:USR1"), (), config, NOW)
    assert isinstance(declared, PlannedAction) and (declared.action, declared.skipped) == ("signal", ())
    other = plan_job(verdict("fake_busy"), replace(FACTS, declared_signal="TERM"), (), config, NOW)
    assert isinstance(other, PlannedAction) and other.skipped == ("signal: job declared SIGTERM, not SIGUSR1",)


def test_the_signal_declaration_is_read_from_the_leading_stamp_only() -> None:
    """A job that did not declare the signal at submit cannot claim it later through user text."""
    config = replace(CONFIG, defaults=replace(CONFIG.defaults, ladder={"fake_busy": ("signal", "requeue")}))

    def step(admin_comment: str, comment: str = "x") -> str:
        job = FakeJob("7", admin_comment=admin_comment, comment=comment).info()
        plan = plan_job(verdict("fake_busy"), job_facts(job), (), config, NOW)
        assert isinstance(plan, PlannedAction)
        return plan.action

    assert step("aigc_class=train aigc_signal=B.USR1; aigc-reclaim: job 7 fake_busy: notify") == "signal"
    assert step("aigc_class=train; aigc_signal=B.USR1") == "requeue"  # after the stamp: a note, not a stamp
    assert step("site text aigc_class=train aigc_signal=B.USR1") == "requeue"
    assert step("aigc_class=train", comment="aigc:signal=B.USR1 aigc_signal=B.USR1") == "requeue"  # the owner's comment


def test_a_warning_from_an_earlier_episode_does_not_arm_the_next_step() -> None:
    """Warned, busy for hours, idle again: warned again (a fresh key), not requeued at once."""
    old = PastAction("7/r0/idle/0:notify", "7", "idle", "notify", "done", False, NOW - 8 * 3600, NOW - 8 * 3600)
    fresh = plan_job(verdict("idle"), FACTS, [old], CONFIG, NOW)  # this episode began at NOW - 60
    assert isinstance(fresh, PlannedAction)
    assert (fresh.action, fresh.observation_key) == ("notify", f"7/r0/idle@{NOW - 60:.0f}/0:notify")
    # The same episode judged again (a restarted controller: same since_ts) plans the same key.
    again = plan_job(verdict("idle"), FACTS, [old], CONFIG, NOW + 5)
    assert isinstance(again, PlannedAction) and again.observation_key == fresh.observation_key
    history = [old, done(fresh, NOW)]
    requeue = plan_job(verdict("idle"), FACTS, history, CONFIG, NOW + 60)
    assert isinstance(requeue, PlannedAction)
    assert (requeue.action, requeue.observation_key) == ("requeue", f"7/r0/idle@{NOW - 60:.0f}/1:requeue")
    # The per-job cap still counts every episode's rows.
    capped = plan_job(verdict("idle"), FACTS, history, replace(CONFIG, max_actions_per_job=2), NOW + 60)
    assert isinstance(capped, Wait) and "per-job cap of 2" in capped.reason


def test_a_stretch_reaching_back_to_the_read_window_keeps_its_warning() -> None:
    """A `--once` controller (or the first tick after a restart) reads `lookback_s` back: a
    stretch that starts at that edge began earlier, unseen. Its warning still arms the next step;
    taking the edge for the episode's start re-warned the job at every tick and never went on."""
    config = replace(CONFIG, defaults=replace(CONFIG.defaults, window_s=300.0))
    lookback = config.lookback_s()
    notify = PastAction("7/r0/idle/0:notify", "7", "idle", "notify", "done", False, NOW - lookback - 100, NOW - lookback - 100)
    at_edge = replace(verdict("idle"), since_ts=NOW - lookback)  # all the controller read is idle
    plan = plan_job(at_edge, FACTS, [notify], config, NOW)
    assert isinstance(plan, PlannedAction)
    assert (plan.action, plan.observation_key) == ("requeue", "7/r0/idle/1:requeue")
    # A stretch that began inside the read (work seen after the warning) is a new episode.
    inside = replace(verdict("idle"), since_ts=NOW - lookback + 2 * config.gap_s)
    fresh = plan_job(inside, FACTS, [notify], config, NOW)
    assert isinstance(fresh, PlannedAction) and fresh.action == "notify"


def test_a_step_that_provably_did_nothing_is_retried_after_the_cooldown_a_bounded_number_of_times() -> None:
    notify = PastAction("7/r0/idle/0:notify", "7", "idle", "notify", "done", False, NOW - 60, NOW - 60)
    history = [notify]
    config = replace(CONFIG, max_actions_per_job=10)
    for attempt, suffix in [(1, ""), (2, "#2"), (3, "#3")]:
        ts = NOW + 100.0 * attempt
        plan = plan_job(verdict("idle"), FACTS, history, config, ts)
        assert isinstance(plan, PlannedAction) and plan.observation_key == f"7/r0/idle/1:requeue{suffix}", attempt
        history.append(PastAction(plan.observation_key, "7", "idle", "requeue", "failed", False, ts, ts, not_acted=True))
        waiting = plan_job(verdict("idle"), FACTS, history, config, ts + 59)
        assert isinstance(waiting, Wait)
        assert ("cool-down" if attempt < 3 else "ladder finished") in waiting.reason
    finished = plan_job(verdict("idle"), FACTS, history, config, NOW + 1000)
    assert isinstance(finished, Wait) and "ladder finished" in finished.reason
    # A failure whose outcome is unknown (the command may have acted) takes the step, as before.
    unknown = PastAction("7/r0/idle/1:requeue", "7", "idle", "requeue", "failed", False, NOW, NOW)
    after = plan_job(verdict("idle"), FACTS, [notify, unknown], config, NOW + 1000)
    assert isinstance(after, Wait) and "ladder finished" in after.reason


def test_a_dry_run_intent_left_open_does_not_stop_the_dry_run_ladder() -> None:
    dry_intent = PastAction("dry:7/r0/idle/0:notify", "7", "idle", "notify", "intent", True, NOW - 60, None)
    plan = plan_job(verdict("idle"), FACTS, [dry_intent], CONFIG, NOW, dry_run=True)
    assert isinstance(plan, PlannedAction) and plan.observation_key == "dry:7/r0/idle/1:requeue"
