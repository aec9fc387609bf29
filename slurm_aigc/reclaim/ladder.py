"""Pure planning: a job's verdict, facts and action history in, its next step out.

A planned action is a value (`PlannedAction`); `Wait` says why nothing happens now and,
when known, what comes next. The actuator applies plans; nothing here touches Slurm.

Each step of a class's ladder for a verdict runs at most once per waste episode of a run of
the job: the observation key is `<job>/r<restarts>/<verdict>/<step>:<action>` (prefixed `dry:`
in dry-run), unique in the `actions` table. A step escalates past the previous one only when
that one was recorded within the current episode (at or after the verdict's `since_ts`); a
later episode of the same run starts the ladder again with a fresh notify under
`<job>/r<restarts>/<verdict>@<episode start>/...`. A step that failed without anything
happening in Slurm (`PastAction.not_acted`) is tried again after the cool-down under
`...:<action>#<attempt>`, at most MAX_ATTEMPTS times. After a requeue the job's restart count
grows and its ladder starts again; `max_actions_per_job` bounds the total, retries included.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.detect import Verdict
from slurm_aigc.reclaim.gpuconflict import GPU_CONFLICT
from slurm_aigc.reclaim.memguard import OVER_MEMORY
from slurm_aigc.tags import UNKNOWN_CLASS, trusted_class, trusted_opt_out, trusted_tags

ADMIN_COMMENT_TAG = "aigc-reclaim:"
# Tries of one ladder step whose failures provably changed nothing (a transient slurmctld error).
MAX_ATTEMPTS = 3
# Their `since_ts` is no episode start: the memory guard's follows its short read window, a
# conflict's is now. Their ladders stay once per run, as before.
_NO_EPISODES = frozenset({OVER_MEMORY, GPU_CONFLICT})
# What planning trusts about a job comes from the hook's stamp at the start of its AdminComment
# (`aigc_class=X aigc_reclaim=no aigc_signal=B.USR1`, slurm_aigc.tags), never from its comment.


@dataclass(frozen=True)
class JobFacts:
    """What Slurm says about a running job (from `scontrol show job`), as planning needs it."""

    job_id: str
    user: str
    account: str
    qos: str
    job_class: str
    batch: bool
    requeue_allowed: bool
    restarts: int
    num_nodes: int
    gpus: int
    opt_out: bool = False
    # When its time limit runs out (epoch s), None when unlimited or unknown: facts do not move
    # with the clock, so a tick keeps them while the job's record is unchanged.
    limit_end_ts: float | None = None
    shrinkable: bool = True  # its GPU request is one we can rewrite (see jobs.shrink_updates)
    shard_gpus: float = 0.0  # its shards as GPU fractions (shards / shards per GPU of its node's type)
    # The signal the job declared it handles (`aigc:signal=B.USR1` at submit), from the stamp only
    # slurmctld/admins can write (`aigc_signal=B.USR1` in the AdminComment, read as `B:USR1`:
    # see jobs.declared_signal); "" when none.
    declared_signal: str = ""


@dataclass(frozen=True)
class PastAction:
    """One row of the `actions` table, as planning needs it."""

    observation_key: str
    job_id: str
    verdict: str
    action: str
    state: str  # intent | done | failed | skipped
    dry_run: bool
    ts_intent: float
    ts_outcome: float | None
    # A `failed` row whose action provably did not happen in Slurm (its detail says `acted: false`):
    # the step may be tried again. The store leaves it False; the controller sets it from the detail.
    not_acted: bool = False


@dataclass(frozen=True)
class PlannedAction:
    """An action to apply now: what, to which job, why, and its unique observation key."""

    observation_key: str
    job_id: str
    user: str
    account: str
    job_class: str
    verdict: str
    action: str
    step: int
    dry_run: bool
    restarts_before: int
    gpus_before: int
    gpus_after: int
    gpu_hours_recovered: float | None
    message: str
    skipped: tuple[str, ...] = ()  # earlier rungs of the ladder passed over, each with its reason


@dataclass(frozen=True)
class Wait:
    """No action now for this job, why, and the next step when there is one."""

    job_id: str
    reason: str
    next_action: str | None = None
    not_before_ts: float | None = None


def parse_job_tags(admin_comment: str) -> dict[str, str]:
    """The hook's stamp in the AdminComment (`aigc_class=train aigc_reclaim=no`); never the user's comment."""
    return trusted_tags(admin_comment)


def job_class_of(admin_comment: str, default: str) -> str:
    """The AIGC class the hook stamped into the AdminComment (slurm_aigc.tags), else `default`."""
    found = trusted_class(admin_comment)
    return default if found == UNKNOWN_CLASS else found


def opted_out(admin_comment: str) -> bool:
    """True when the hook recorded the user's `aigc:reclaim=no` as `aigc_reclaim=no`."""
    return trusted_opt_out(admin_comment)


def observation_key(job_id: str, restarts: int, verdict: str, step: int, action: str, dry_run: bool,
                    episode: str = "", attempt: int = 1) -> str:
    """`episode`: "" for the run's first episode of this verdict, else `@<start>`; attempt 2+ adds `#<n>`."""
    key = f"{job_id}/r{restarts}/{verdict}{episode}/{step}:{action}"
    if attempt > 1:
        key += f"#{attempt}"
    return f"dry:{key}" if dry_run else key


def _verdict_part(key: str) -> str:
    """`idle@1700000000` of `dry:7/r0/idle@1700000000/0:notify`."""
    parts = key.removeprefix("dry:").split("/")
    return parts[2] if len(parts) > 3 else ""


def exemption(facts: JobFacts, config: ReclaimConfig) -> str | None:
    """Why reclaim must leave this job alone, or None."""
    exempt = config.exempt
    checks = (
        (facts.job_class in exempt.classes, f"class {facts.job_class}"),
        (facts.account in exempt.accounts, f"account {facts.account}"),
        (facts.qos in exempt.qos, f"QOS {facts.qos}"),
        (facts.user in exempt.users, f"user {facts.user}"),
        (facts.opt_out and config.opt_out == "allow", "opted out (aigc:reclaim=no)"),
    )
    return next((f"exempt: {why}" for hit, why in checks if hit), None)


def applicable(action: str, facts: JobFacts, verdict: Verdict, config: ReclaimConfig) -> bool:
    """Whether a ladder step may touch this job at all (else the ladder skips it)."""
    return not_applicable(action, facts, verdict, config) is None


def not_applicable(action: str, facts: JobFacts, verdict: Verdict, config: ReclaimConfig) -> str | None:
    """Why a ladder step must not touch this job (the ladder then skips it), or None."""
    if action in {"requeue", "shrink"} and not (facts.batch and facts.requeue_allowed):
        return "not a batch job that allows requeue"
    if action == "shrink":
        used = verdict.gpus_used or 0
        fits = facts.shrinkable and facts.num_nodes == 1 and 0 < used < facts.gpus
        return None if fits else "GPU request cannot be lowered"
    if action == "signal":
        return signal_refusal(facts, config.signal)
    if action == "cancel":
        return None if config.cancel_enabled else "cancel_enabled is false"
    return None


def signal_refusal(facts: JobFacts, signal: str) -> str | None:
    """Why the `signal` step must not run: a job that does not trap the signal dies of it.

    SIGUSR1's default action terminates a process, so only a job that declared it handles
    the signal gets it: its `aigc:signal=` tag at submit, which the hook stamps as
    `aigc_signal=` into the AdminComment (job owners cannot write that field).
    """
    if not facts.batch:
        return "not a batch job"
    declared = facts.declared_signal.rsplit(":", 1)[-1]
    if not declared:
        return f"job did not declare it handles SIG{signal} (no aigc:signal= tag at submit)"
    if declared != signal:
        return f"job declared SIG{declared}, not SIG{signal}"
    return None


def plan_job(
    verdict: Verdict,
    facts: JobFacts,
    history: Sequence[PastAction],
    config: ReclaimConfig,
    now_ts: float,
    dry_run: bool | None = None,
) -> PlannedAction | Wait:
    """The next step for one job (pure: same inputs, same plan)."""
    dry = config.dry_run if dry_run is None else dry_run
    if verdict.kind is None:
        return Wait(facts.job_id, verdict.reason)
    why_exempt = exemption(facts, config)
    if why_exempt:
        return Wait(facts.job_id, why_exempt)
    mine = [a for a in history if a.job_id == facts.job_id and a.dry_run == dry]
    # Only a live intent waits for reconcile: a dry-run one a killed controller left open is never
    # reconciled (nothing was done) and would stop the job's dry-run ladder for good.
    if any(a.state == "intent" and not a.dry_run for a in mine):
        return Wait(facts.job_id, "an earlier action has no outcome yet (reconcile first)")
    if len(mine) >= config.max_actions_per_job:
        return Wait(facts.job_id, f"per-job cap of {config.max_actions_per_job} actions reached")
    step, skipped = _next_step(verdict, facts, mine, config, dry, now_ts)
    passed = "".join(f"; skipped {why}" for why in skipped)
    if step is None:
        return Wait(facts.job_id, f"{verdict.kind}: ladder finished for this run of the job{passed}")
    index, action, key = step
    # The cool-down gives a user time between our steps; a GPU conflict harms its other job now.
    ready_at = None if verdict.kind == GPU_CONFLICT else _cooldown_end(facts, mine, config)
    if ready_at is not None and now_ts < ready_at:
        return Wait(facts.job_id, f"cool-down after the previous step ({ready_at - now_ts:.0f}s left){passed}",
                    action, ready_at)
    return _planned(verdict, facts, index, action, key, config, now_ts, skipped)


def _episode(verdict: Verdict, facts: JobFacts, mine: Iterable[PastAction], config: ReclaimConfig,
             now_ts: float) -> tuple[str, list[PastAction]]:
    """This verdict's ladder in the current waste episode of this run: its key part and its rows.

    A warning belongs to the episode it was given in: a job warned, busy for hours, then idle
    again is warned again rather than requeued on the strength of the old warning. The first
    episode keeps the plain key; a later one is keyed by its start, so that a restarted
    controller judging the same episode (same `since_ts`) finds the same keys.

    A stretch that reaches back to where the controller's read began (`lookback_s`: a
    `--once` controller, or the first tick after a restart, reads no further) has an unknown
    start: every step of this run counts, as the stretch showed no work since the oldest
    sample read. Taking the read's edge for the start re-warned such a job at every tick once
    its episode outlasted the lookback, and never took the next step.
    """
    assert verdict.kind is not None
    run = f"{facts.job_id}/r{facts.restarts}/"
    ours = [a for a in mine if a.observation_key.removeprefix("dry:").startswith(run)
            and _verdict_part(a.observation_key).split("@")[0] == verdict.kind]
    start = None if verdict.kind in _NO_EPISODES else verdict.since_ts
    if start is not None and start <= now_ts - config.lookback_s() + config.gap_s:
        start = None
    current = ours if start is None else [a for a in ours if a.ts_intent >= start]
    if current:
        latest = max(current, key=lambda a: a.ts_intent)
        return _verdict_part(latest.observation_key).removeprefix(verdict.kind), current
    if ours:
        assert start is not None
        return f"@{start:.0f}", []
    return "", []


def _next_step(
    verdict: Verdict, facts: JobFacts, mine: Iterable[PastAction], config: ReclaimConfig, dry: bool, now_ts: float
) -> tuple[tuple[int, str, str] | None, tuple[str, ...]]:
    """The first step not yet taken in this episode (index, action, key), and the reasons of
    the signal steps passed over on the way."""
    assert verdict.kind is not None
    episode, rows = _episode(verdict, facts, mine, config, now_ts)
    ladder = config.policy_for(facts.job_class).ladder.get(verdict.kind, ())
    skipped: list[str] = []
    for index, action in enumerate(ladder):
        why_not = not_applicable(action, facts, verdict, config)
        if why_not is not None:
            if action == "signal":  # the others are structural (never applicable to this job)
                skipped.append(f"{action}: {why_not}")
            continue
        key = observation_key(facts.job_id, facts.restarts, verdict.kind, index, action, dry, episode)
        tries = [a for a in rows if a.observation_key == key or a.observation_key.startswith(key + "#")]
        # A try that may have acted (done, skipped, failed with an unknown outcome) takes the step;
        # tries that provably changed nothing leave it to be tried again, a bounded number of times.
        if not tries or (len(tries) < MAX_ATTEMPTS and all(a.state == "failed" and a.not_acted for a in tries)):
            attempt = len(tries) + 1
            return (index, action, observation_key(facts.job_id, facts.restarts, verdict.kind, index, action, dry,
                                                   episode, attempt)), tuple(skipped)
    return None, tuple(skipped)


def _cooldown_end(facts: JobFacts, mine: Iterable[PastAction], config: ReclaimConfig) -> float | None:
    prefix = f"{facts.job_id}/r{facts.restarts}/"
    this_run = [max(a.ts_intent, a.ts_outcome or 0.0) for a in mine if a.observation_key.removeprefix("dry:").startswith(prefix)]
    return max(this_run) + config.cooldown_s if this_run else None


def _planned(verdict: Verdict, facts: JobFacts, index: int, action: str, key: str, config: ReclaimConfig,
             now_ts: float, skipped: tuple[str, ...] = ()) -> PlannedAction:
    assert verdict.kind is not None
    gpus_after = {"shrink": verdict.gpus_used or facts.gpus, "requeue": 0, "cancel": 0}.get(action, facts.gpus)
    # Requeue/cancel free the shards too; a shrink frees whole GPUs only.
    freed = facts.gpus - gpus_after + (facts.shard_gpus if action in {"requeue", "cancel"} else 0.0)
    remaining_s = None if facts.limit_end_ts is None else max(0.0, facts.limit_end_ts - now_ts)
    # A conflict's requeue ends no waste: the GPU goes to the job that already holds it whole.
    wasted = verdict.kind != GPU_CONFLICT
    recovered = freed * remaining_s / 3600.0 if wasted and freed and remaining_s is not None else None
    return PlannedAction(
        observation_key=key,
        job_id=facts.job_id,
        user=facts.user,
        account=facts.account,
        job_class=facts.job_class,
        verdict=verdict.kind,
        action=action,
        step=index,
        dry_run=key.startswith("dry:"),
        restarts_before=facts.restarts,
        gpus_before=facts.gpus,
        gpus_after=gpus_after,
        gpu_hours_recovered=None if recovered is None else round(recovered, 3),
        message=_message(verdict, facts, action, index, config),
        skipped=skipped,
    )


def _message(verdict: Verdict, facts: JobFacts, action: str, index: int, config: ReclaimConfig) -> str:
    assert verdict.kind is not None
    ladder = config.policy_for(facts.job_class).ladder.get(verdict.kind, ())
    later = [a for a in ladder[index + 1:] if applicable(a, facts, verdict, config)]
    then = f"; next step {later[0]} in {config.cooldown_s:.0f}s if it persists" if later else ""
    return f"{ADMIN_COMMENT_TAG} job {facts.job_id} {verdict.kind}: {verdict.reason}; {action}{then}"


def limit_per_tick(plans: Sequence[PlannedAction], cap: int) -> tuple[list[PlannedAction], list[Wait]]:
    """Apply the per-tick cap: later escalation steps first (they free GPUs), then job order."""
    ordered = sorted(plans, key=lambda p: (-p.step, p.job_id))
    kept, dropped = ordered[:cap], ordered[cap:]
    return kept, [Wait(p.job_id, f"per-tick cap of {cap} actions reached", p.action) for p in dropped]
