"""The publisher's pure planner: from Slurm's nodes and jobs and the recent GPU use, what to
write to each node (features and `Weight`), and which model lines the hook may read.

No I/O: `publisher.Publisher` (the daemon part) reads Slurm and the database, calls
`plan_cycle`, and writes. Names of the features are in `features.py`; the scoring plugins
in `scoring.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slurm_aigc.slurmrecords import JobInfo, NodeInfo
from slurm_aigc.tags import comment_tags, trusted_tags
from slurm_aigc.telemetry import features as feat
from slurm_aigc.telemetry.config import ScoringConfig
from slurm_aigc.telemetry.gres import (
    alloc_tres_gpus,
    expand_nodes,
    gres_busy_gpus,
    gres_gpu_total,
)
from slurm_aigc.telemetry.scoring import (
    IslandUse,
    NodeView,
    combined_score,
    slurm_weight,
)

# Islands of a node as GPU index lists, when something better than the features is known.
IslandSource = Callable[[str], "Sequence[Sequence[int]] | None"]

NVLINK_SIZE_RE = re.compile(r"^nvlink(\d+)$")
_RUNNING_STATES = frozenset({"RUNNING"})


# --------------------------------------------------------------------------- job comments


def parse_comment_tags(comment: str) -> dict[str, str]:
    """`... aigc:type=infer,model=llama3-8b ...` -> {'type': 'infer', 'model': 'llama3-8b'} (slurm_aigc.tags)."""
    return comment_tags(comment)


def served_model(job: JobInfo, serving_classes: Iterable[str]) -> str | None:
    """The model a running job serves: its `model=` tag, when its class is a serving one.

    The class is the hook's stamp (slurm_aigc.tags), never the comment. A job the hook stamped
    `unknown` does not serve: it has no `type=` tag and no detection rule called it serving,
    while its owner can rewrite the comment's `model=` as it runs. A job without any stamp
    (the hook is not installed, or the job predates it) counts, as before: there the class is
    not known at all, and `max_models_per_node` bounds what such jobs can add.
    """
    model = parse_comment_tags(job.comment).get("model")
    if not model:
        return None
    job_class = trusted_tags(job.admin_comment).get("class")
    if job_class is not None and job_class not in set(serving_classes):
        return None
    return model


def model_jobs_by_node(jobs: Iterable[JobInfo], serving_classes: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per node, each model feature its running jobs serve and how many of them serve it."""
    found: dict[str, dict[str, int]] = {}
    for job in jobs:
        if job.state not in _RUNNING_STATES:
            continue
        model = served_model(job, serving_classes)
        name = feat.model_feature(model) if model else None
        if name is None:
            continue
        for node in expand_nodes(job.node_list):
            counts = found.setdefault(node, {})
            counts[name] = counts.get(name, 0) + 1
    return found


def top_models(counts: Mapping[str, int], limit: int) -> frozenset[str]:
    """The `limit` models with the most jobs (ties by name): a node's cap without history."""
    return frozenset(sorted(counts, key=lambda name: (-counts[name], name))[:limit])


# --------------------------------------------------------------------------- views


def islands_from_features(gpus_total: int, features: Sequence[str]) -> list[list[int]]:
    """NVLink islands implied by the agent's `nvlink<N>` feature.

    Without a better source we assume islands of N consecutive indices (how NVSwitch
    boards, NV4 quads and NVLink-bridge pairs are numbered); no feature: all singletons.
    A `mig` node: all singletons too, whatever else it says, since Slurm's GPU indices count
    MIG instances there, not NVML's GPUs, and no index is known to sit on an island.
    """
    if feat.MIG_FEATURE in features:
        return [[index] for index in range(gpus_total)]
    sizes = [int(m.group(1)) for f in features if (m := NVLINK_SIZE_RE.match(f))]
    size = max(sizes, default=1)
    size = max(1, min(size, gpus_total)) if gpus_total else 1
    return [list(range(start, min(start + size, gpus_total))) for start in range(0, gpus_total, size)]


def features_tell_islands(features: Sequence[str]) -> bool:
    """Whether `islands_from_features` reads the islands from something the agent published
    (`mig` or `nvlink<N>`), rather than assuming singletons for want of a feature."""
    return feat.MIG_FEATURE in features or any(NVLINK_SIZE_RE.match(f) for f in features)


def island_layout(gpus_total: int, features: Sequence[str],
                  known: Sequence[Sequence[int]] | None) -> Sequence[Sequence[int]]:
    """A node's islands: `known` ones (from topology, or remembered) unless the node's
    features say `mig`, whose Slurm indices `known` islands do not describe."""
    if known is None or feat.MIG_FEATURE in features:
        return islands_from_features(gpus_total, features)
    return known


def island_use(islands: Sequence[Sequence[int]], busy: frozenset[int], busy_count: int) -> tuple[IslandUse, ...]:
    """Which GPUs of each island are free; busy GPUs without known indices fill the last islands."""
    unknown = max(busy_count - len(busy), 0)
    result = []
    for island in reversed(islands):
        free = [i for i in island if i not in busy]
        taken = min(unknown, len(free))
        unknown -= taken
        result.append(IslandUse(tuple(island), tuple(free[: len(free) - taken])))
    return tuple(reversed(result))


def node_view(node: NodeInfo, mean_util_pct: float | None, models: frozenset[str],
              islands: Sequence[Sequence[int]] | None = None) -> NodeView:
    """Everything the scorers see of one node."""
    total = gres_gpu_total(node.gres)
    busy_count, busy = gres_busy_gpus(node.gres_used)
    if not node.gres_used:  # GresUsed is printed only by `scontrol -d`: fall back to counts
        busy_count = alloc_tres_gpus(node.fields.get("AllocTRES", ""))
    layout = island_layout(total, node.available_features, islands)
    return NodeView(
        name=node.name, gpus_total=total, gpus_alloc=min(busy_count, total),
        islands=island_use(layout, busy, busy_count), mean_util_pct=mean_util_pct, models_serving=models,
    )


def dynamic_features(view: NodeView, config: ScoringConfig) -> tuple[str, ...]:
    """The publisher's features for a node: nvfree ladder and model_<id>."""
    names: list[str] = []
    if config.publish_nvfree:
        names += feat.nvfree_features(view.free_nvlink_set)
    if config.publish_models:
        names += sorted(view.models_serving)
    return tuple(names)


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class NodePlan:
    """What to write to one node; a None `*_after` leaves that attribute alone."""

    node: str
    features_before: tuple[str, ...]
    features_after: tuple[str, ...] | None
    weight_before: int
    weight_after: int | None
    reason: str
    dynamic: tuple[str, ...] = field(default=())
    restore: tuple[str, ...] = field(default=())

    @property
    def changes(self) -> bool:
        return self.features_after is not None or self.weight_after is not None


def plan_node(node: NodeInfo, view: NodeView, last_weight: int | None, config: ScoringConfig,
              restore: Sequence[str] = ()) -> NodePlan | None:
    """Decide what, if anything, to write to `node`; `restore`: static features Slurm lost."""
    reasons: list[str] = []
    dynamic = dynamic_features(view, config)
    current = node.available_features
    merged = merge_ours(current, dynamic, restore)
    features_after = None if feat.same_features(merged, current) else merged
    if features_after is not None:
        reasons.append(_feature_diff(current, merged))
    score = combined_score(view, config.policy_weights())
    desired = slurm_weight(score, config.weight_min, config.weight_max)
    weight_after = _weight_to_write(node.weight, desired, last_weight, config.hysteresis)
    if weight_after is not None:
        lost = last_weight is not None and node.weight != last_weight
        why = f"Slurm shows {node.weight}, we wrote {last_weight}: re-assert" if lost else f"score {score:.1f}"
        reasons.append(f"weight {node.weight}->{weight_after} ({why})")
    if features_after is None and weight_after is None:
        return None
    return NodePlan(node.name, current, features_after, node.weight, weight_after, "; ".join(reasons), dynamic,
                    tuple(restore))


def merge_ours(current: Sequence[str], dynamic: Sequence[str], restore: Sequence[str]) -> tuple[str, ...]:
    """`current` with our dynamic features replaced by `dynamic` and the lost static ones added."""
    merged = feat.merge_features(current, dynamic, feat.is_dynamic_feature)
    return tuple(merged) + tuple(sorted(set(restore) - set(merged)))


def remember_static(seen: Mapping[str, tuple[str, ...]], nodes: Sequence[NodeInfo],
                    ) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """(static features last seen per node, those to re-assert per node).

    `scontrol reconfigure` and a slurmctld restart make Slurm forget what the agents wrote;
    the publisher lists every node anyway, so it puts back, in bulk, static features that
    vanished (the node shows a strict subset of what it showed), and the agents need to
    check their own only rarely (`agent.feature_check_s`). A node showing any static
    feature it did not show before took a new set from its agent: that set is remembered.
    """
    updated, restore = dict(seen), {}
    for node in nodes:
        now = frozenset(f for f in node.available_features if feat.is_static_feature(f))
        before = frozenset(updated.get(node.name, ()))
        if now < before:
            restore[node.name] = tuple(sorted(before - now))
        elif now:
            updated[node.name] = tuple(sorted(now))
    return updated, restore


def _weight_to_write(current: int, desired: int, last_written: int | None, hysteresis: int) -> int | None:
    if last_written is not None and current != last_written:
        return desired  # Slurm forgot our weight (reconfigure/restart) or someone changed it
    if desired == current:
        return None
    if last_written is None or abs(desired - current) >= hysteresis:
        return desired
    return None


def _feature_diff(before: Sequence[str], after: Sequence[str]) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    parts = [f"+{f}" for f in added] + [f"-{f}" for f in removed]
    return "features " + " ".join(parts)


def plan_cycle(
    nodes: Sequence[NodeInfo],
    jobs: Sequence[JobInfo],
    utils: Mapping[str, float],
    last_weights: Mapping[str, int],
    config: ScoringConfig,
    islands_of: IslandSource | None = None,
    lingering: Mapping[str, frozenset[str]] | None = None,
    restore: Mapping[str, Sequence[str]] | None = None,
) -> list[NodePlan]:
    """The pure core of one publisher cycle: every GPU node's plan, unchanged nodes left out.

    `lingering`: every model feature to publish per node, served or lingering, already capped
    (the publisher's `cap_sightings`); None: the models `jobs` serve, at most
    `max_models_per_node` per node, those with the most jobs. `restore`: static features to
    put back per node (`remember_static`).
    """
    if lingering is None:
        served = model_jobs_by_node(jobs, config.serving_classes)
        models = {name: top_models(counts, config.max_models_per_node) for name, counts in served.items()}
    else:
        models = dict(lingering)
    plans = []
    for node in nodes:
        islands = islands_of(node.name) if islands_of else None
        view = node_view(node, utils.get(node.name), models.get(node.name, frozenset()), islands)
        if view.gpus_total <= 0:
            continue  # not a GPU node: its weight and features are none of our business
        plan = plan_node(node, view, last_weights.get(node.name), config, (restore or {}).get(node.name, ()))
        if plan is not None:
            plans.append(plan)
    return plans


# --------------------------------------------------------------------------- model lingering


ModelSightings = dict[tuple[str, str], float]


def record_sightings(sightings: ModelSightings, nodes: Sequence[NodeInfo], now: float, linger_s: float) -> ModelSightings:
    """`sightings` with the model features found on nodes without a record (a publisher restart),
    counted as last served one linger ago, so they are unlisted now and removed only after the
    unlist grace. What is served now is recorded by `cap_sightings`."""
    updated = dict(sightings)
    for node in nodes:
        for feature in node.available_features:
            if feature.startswith("model_"):
                updated.setdefault((node.name, feature), now - linger_s)
    return updated


def cap_sightings(sightings: ModelSightings, served: Mapping[str, Mapping[str, int]], now: float, linger_s: float,
                  grace_s: float, limit: int) -> ModelSightings:
    """`sightings` with this cycle's served models, at most `limit` model features per node.

    A node's candidates (its served models and those kept from before) are ranked: the most
    recently seen first (a served one is seen now), then the most jobs, then by name; the
    first `limit` are wanted. A served, wanted model is seen now. A kept model that is not
    wanted is treated as last seen one linger ago: unlisted at once and removed a grace
    later, as any model leaving (the hook may have read it a refresh ago; Slurm refuses a
    --prefer no node has). A new model is added only while the node holds fewer than `limit`,
    those leaving included, so Slurm never shows more than `limit` on a node we wrote. An
    owner who rewrites a running job's `model=` each cycle therefore cannot grow the list;
    at worst the newest of such names take the place of models no job serves any more.
    """
    by_node: dict[str, dict[str, float]] = {node: {} for node in served}
    for (node, feature), seen in sightings.items():
        if now - seen < linger_s + grace_s:
            by_node.setdefault(node, {})[feature] = seen
    return {(node, feature): seen for node, kept in by_node.items()
            for feature, seen in _cap_node(kept, served.get(node, {}), now, linger_s, limit).items()}


def _cap_node(kept: Mapping[str, float], counts: Mapping[str, int], now: float, linger_s: float,
              limit: int) -> dict[str, float]:
    """One node's part of `cap_sightings`: model feature -> when last seen."""
    def rank(feature: str) -> tuple[float, int, str]:
        return -(now if feature in counts else kept[feature]), -counts.get(feature, 0), feature

    wanted = sorted(set(kept) | set(counts), key=rank)[:limit]
    result = {feature: (now if feature in counts else seen) if feature in wanted else min(seen, now - linger_s)
              for feature, seen in kept.items()}
    arriving = [feature for feature in wanted if feature not in kept]
    result.update((feature, now) for feature in arriving[:max(limit - len(kept), 0)])
    return result


def lingering_models(sightings: ModelSightings, now: float, keep_s: float) -> dict[str, frozenset[str]]:
    """Per node, the model features last served less than `keep_s` ago."""
    kept: dict[str, set[str]] = {}
    for (node_name, feature), seen in sightings.items():
        if now - seen < keep_s:
            kept.setdefault(node_name, set()).add(feature)
    return {node_name: frozenset(features) for node_name, features in kept.items()}


def listable_models(sightings: ModelSightings, now: float, linger_s: float) -> frozenset[tuple[str, str]]:
    """(node, model feature) pairs the hook may --prefer: served there within the linger.

    Per node, not per model: a model still served on a t4 must not keep the line of an a100
    whose copy is lingering out, or a hook that read `a100&model_X` could --prefer it in the
    seconds after Slurm dropped it (Slurm rejects a --prefer no node satisfies). Removal
    comes a grace after unlisting, once every hook has re-read the list.
    """
    return frozenset(key for key, seen in sightings.items() if now - seen < linger_s)



def published_lines(nodes: Sequence[NodeInfo], plans: Sequence[NodePlan], keep_only_unchanged: bool,
                    listable: frozenset[tuple[str, str]] | None = None) -> frozenset[str]:
    """One line per (model feature, node) for the hook: the model, then the node's other features.

    The hook adds `--prefer A&model_X` only when a listed node has model_X with A, since Slurm
    refuses a job whose preference no node satisfies. With `keep_only_unchanged`, only
    features present both before and after the plans (safe to list while writes are under
    way). `nvfree*` features change every cycle and are left out of the lines.
    """
    after = {plan.node: plan.features_after for plan in plans if plan.features_after is not None}
    lines: set[str] = set()
    for node in nodes:
        before = set(node.available_features)
        new = set(after.get(node.name, node.available_features))
        present = (before & new) if keep_only_unchanged else new
        others = sorted(f for f in present if not f.startswith(("model_", "nvfree")))
        for model in sorted(f for f in present if f.startswith("model_")):
            if listable is None or (node.name, model) in listable:
                lines.add(" ".join([model, *others]))
    return frozenset(lines)
