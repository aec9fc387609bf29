"""The feature/weight publisher: tells Slurm how busy, how fragmented and what is served where.

Each cycle (`Publisher.tick`, run by `slurm-aigc controller`):

1. read the nodes (`scontrol -d show node -o`: only `-d` prints `GresUsed`), the jobs
   (`scontrol show job -o`) and the mean GPU utilization of every node over the recent samples;
2. compute per node, in a pure core (`plan_cycle`), a Slurm `Weight` from the scoring
   plugins and the dynamic features `nvfree<k>` and `model_<id>` (names in `features.py`);
3. write a node through `scontrol update` only when its feature set differs or its weight
   moved by at least the hysteresis band, and always when Slurm lost what we wrote (after
   `scontrol reconfigure` or a slurmctld restart, Slurm forgets `scontrol update`);
4. record each change in `node_publications`. In dry-run nothing is written to Slurm: the
   change is logged and recorded with `dry_run` set, and remembered so it is logged once.

Features are merged into what Slurm reports just before the write, so an admin's own
features and the agent's static ones are never dropped.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from slurm_aigc.errors import AigcError
from slurm_aigc.slurm import (
    JobInfo,
    NodeInfo,
    SlurmCli,
)
from slurm_aigc.tags import UNKNOWN_CLASS, comment_tags, trusted_class
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
from slurm_aigc.telemetry.store import Publication, TelemetryStore

LOG = logging.getLogger(__name__)

# Islands of a node as GPU index lists, when something better than the features is known.
IslandSource = Callable[[str], "Sequence[Sequence[int]] | None"]

_NVLINK_SIZE_RE = re.compile(r"^nvlink(\d+)$")
_RUNNING_STATES = frozenset({"RUNNING"})


# --------------------------------------------------------------------------- job comments


def parse_comment_tags(comment: str) -> dict[str, str]:
    """`... aigc:type=infer,model=llama3-8b ...` -> {'type': 'infer', 'model': 'llama3-8b'} (slurm_aigc.tags)."""
    return comment_tags(comment)


def served_model(job: JobInfo, serving_classes: Iterable[str]) -> str | None:
    """The model a running job serves: its `model=` tag, unless its class is not a serving one."""
    model = parse_comment_tags(job.comment).get("model")
    if not model:
        return None
    job_class = trusted_class(job.admin_comment)  # the hook's stamp (slurm_aigc.tags), never the comment
    if job_class != UNKNOWN_CLASS and job_class not in set(serving_classes):
        return None
    return model


def models_by_node(jobs: Iterable[JobInfo], serving_classes: Sequence[str]) -> dict[str, frozenset[str]]:
    """Model features per node from the running jobs' comment tags."""
    found: dict[str, set[str]] = {}
    for job in jobs:
        if job.state not in _RUNNING_STATES:
            continue
        model = served_model(job, serving_classes)
        name = feat.model_feature(model) if model else None
        if name is None:
            continue
        for node in expand_nodes(job.node_list):
            found.setdefault(node, set()).add(name)
    return {node: frozenset(names) for node, names in found.items()}


# --------------------------------------------------------------------------- views


def islands_from_features(gpus_total: int, features: Sequence[str]) -> list[list[int]]:
    """NVLink islands implied by the agent's `nvlink<N>` feature.

    Without a better source we assume islands of N consecutive indices (how NVSwitch
    boards, NV4 quads and NVLink-bridge pairs are numbered); no feature: all singletons.
    """
    sizes = [int(m.group(1)) for f in features if (m := _NVLINK_SIZE_RE.match(f))]
    size = max(sizes, default=1)
    size = max(1, min(size, gpus_total)) if gpus_total else 1
    return [list(range(start, min(start + size, gpus_total))) for start in range(0, gpus_total, size)]


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
    layout = islands if islands is not None else islands_from_features(total, node.available_features)
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

    @property
    def changes(self) -> bool:
        return self.features_after is not None or self.weight_after is not None


def plan_node(node: NodeInfo, view: NodeView, last_weight: int | None, config: ScoringConfig) -> NodePlan | None:
    """Decide what, if anything, to write to `node`."""
    reasons: list[str] = []
    dynamic = dynamic_features(view, config)
    current = node.available_features
    merged = feat.merge_features(current, dynamic, feat.is_dynamic_feature)
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
    return NodePlan(node.name, current, features_after, node.weight, weight_after, "; ".join(reasons), dynamic)


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
) -> list[NodePlan]:
    """The pure core of one publisher cycle: every GPU node's plan, unchanged nodes left out.

    `lingering`: model features to keep per node although no running job serves them now.
    """
    models = dict(lingering or {})
    for node_name, served in models_by_node(jobs, config.serving_classes).items():
        models[node_name] = models.get(node_name, frozenset()) | served
    plans = []
    for node in nodes:
        islands = islands_of(node.name) if islands_of else None
        view = node_view(node, utils.get(node.name), models.get(node.name, frozenset()), islands)
        if view.gpus_total <= 0:
            continue  # not a GPU node: its weight and features are none of our business
        plan = plan_node(node, view, last_weights.get(node.name), config)
        if plan is not None:
            plans.append(plan)
    return plans


# --------------------------------------------------------------------------- model lingering


ModelSightings = dict[tuple[str, str], float]


def record_sightings(sightings: ModelSightings, served: Mapping[str, frozenset[str]], nodes: Sequence[NodeInfo],
                     now: float, linger_s: float) -> ModelSightings:
    """Last time each (node, model feature) was served; features found on nodes without a
    record (a publisher restart) count as last served one linger ago, so they are unlisted
    now and removed only after the unlist grace."""
    updated = dict(sightings)
    for node in nodes:
        for feature in node.available_features:
            if feature.startswith("model_"):
                updated.setdefault((node.name, feature), now - linger_s)
    for node_name, features in served.items():
        for feature in features:
            updated[(node_name, feature)] = now
    return updated


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


# --------------------------------------------------------------------------- the daemon part


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


def write_lines_atomically(path: Path, lines: Sequence[str]) -> None:
    """Replace `path` by `lines` (temp file + rename), world-readable for slurmctld's hook."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    temp.chmod(0o644)
    os.replace(temp, path)


class Publisher:
    """Runs `plan_cycle` against Slurm and the database; `tick()` is one cycle."""

    def __init__(
        self,
        slurm: SlurmCli,
        store: TelemetryStore,
        config: ScoringConfig,
        *,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
        islands_of: IslandSource | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slurm = slurm
        self._monotonic = monotonic
        self._last_cycle_at: float | None = None
        self._store = store
        self.config = config
        self._dry_run = dry_run
        self._clock = clock
        self._islands_of = islands_of
        # Islands last seen in each node's `nvlink<N>` feature: after `scontrol reconfigure`
        # the agent's feature is gone for up to `feature_check_s`, the wiring is not.
        self._islands_seen: dict[str, list[list[int]]] = {}
        self._last_weights: dict[str, int] | None = None
        # Dry-run only: the dynamic features and weight we would have written per node, laid
        # over Slurm's view so that each would-be change is logged once.
        self._simulated: dict[str, tuple[tuple[str, ...] | None, int | None]] = {}
        self._listed: dict[str, frozenset[str]] = {}
        self._sightings: ModelSightings = {}

    def set_config(self, config: ScoringConfig) -> None:
        """Use a new (already validated) scoring config from the next cycle on (SIGHUP)."""
        self.config = config

    def tick_when_due(self) -> list[NodePlan]:
        """`tick()` at most once per `scoring.interval_s`: for hosts whose loop runs faster."""
        now = self._monotonic()
        if self._last_cycle_at is not None and now - self._last_cycle_at < self.config.interval_s:
            return []
        self._last_cycle_at = now
        return self.tick()

    def tick(self) -> list[NodePlan]:
        """One cycle; returns the plans it applied (or, in dry-run, would have applied)."""
        if self._last_weights is None:
            self._last_weights = {} if self._dry_run else self._store.last_published_weights()
        now = self._clock()
        nodes = [self._overlay(node) for node in self._slurm.nodes()]
        jobs = self._slurm.jobs()
        utils = self._store.mean_util_by_node(now - self.config.window_s)
        self._remember_islands(nodes)
        linger, grace = self.config.model_linger_s, self.config.model_unlist_grace_s
        served = models_by_node(jobs, self.config.serving_classes)
        self._sightings = record_sightings(self._sightings, served, nodes, now, linger)
        keep = lingering_models(self._sightings, now, linger + grace)
        self._sightings = {key: seen for key, seen in self._sightings.items() if now - seen < linger + grace}
        listable = listable_models(self._sightings, now, linger)
        plans = plan_cycle(nodes, jobs, utils, self._last_weights, self.config, self._islands, keep)
        # The hook may --prefer only features some node has (else Slurm rejects the job):
        # unlist a vanishing model a grace before Slurm loses it, list a new one once Slurm has it.
        self._list_models(published_lines(nodes, plans, True, listable))
        applied, failures = [], []
        for plan in plans:
            try:
                done = self._apply(plan, now)
            except AigcError as error:  # one node's failure must not starve the others
                LOG.error("cannot update %s: %s", plan.node, error)
                failures.append(error)
                continue
            if done is not None:
                applied.append(done)
        self._list_models(published_lines(nodes, applied, False, listable))
        if failures:
            raise failures[0]  # the loop logs it and backs off; the other nodes were written
        return applied

    def _list_models(self, lines: frozenset[str]) -> None:
        """Write `published_features_file` (see `published_lines`) when its content changes."""
        path = self.config.published_features_file
        if self._dry_run or path is None or lines == self._listed.get(path):
            return
        write_lines_atomically(Path(path), sorted(lines))
        self._listed[path] = lines

    def _remember_islands(self, nodes: Sequence[NodeInfo]) -> None:
        for node in nodes:
            if any(_NVLINK_SIZE_RE.match(f) for f in node.available_features):
                self._islands_seen[node.name] = islands_from_features(gres_gpu_total(node.gres), node.available_features)

    def _islands(self, name: str) -> Sequence[Sequence[int]] | None:
        known = self._islands_of(name) if self._islands_of else None
        return known if known is not None else self._islands_seen.get(name)

    def _apply(self, plan: NodePlan, now: float) -> NodePlan | None:
        if self._dry_run:
            LOG.info("dry-run: would update %s: %s", plan.node, plan.reason)
            self._remember_simulated(plan)
        else:
            plan = self._refresh(plan)
            if not plan.changes:
                return None
            self._slurm.update_node(plan.node, features=plan.features_after, weight=plan.weight_after)
            LOG.info("updated %s: %s", plan.node, plan.reason)
        if plan.weight_after is not None:
            assert self._last_weights is not None
            self._last_weights[plan.node] = plan.weight_after
        self._store.record_publication(Publication(
            ts=now, node=plan.node, features_before=plan.features_before, features_after=plan.features_after,
            weight_before=plan.weight_before, weight_after=plan.weight_after, reason=plan.reason,
            dry_run=self._dry_run,
        ))
        return plan

    def _refresh(self, plan: NodePlan) -> NodePlan:
        """Merge into the node's features as Slurm has them now (the agent may have just written)."""
        if plan.features_after is None:
            return plan
        current = self._slurm.node(plan.node).available_features
        merged = feat.merge_features(current, plan.dynamic, feat.is_dynamic_feature)
        features_after = None if feat.same_features(merged, current) else merged
        return replace(plan, features_before=current, features_after=features_after)

    def _remember_simulated(self, plan: NodePlan) -> None:
        dynamic, weight = self._simulated.get(plan.node, (None, None))
        if plan.features_after is not None:
            dynamic = plan.dynamic
        if plan.weight_after is not None:
            weight = plan.weight_after
        self._simulated[plan.node] = (dynamic, weight)

    def _overlay(self, node: NodeInfo) -> NodeInfo:
        """Dry-run: Slurm's view of `node` as if our earlier (not made) writes had happened."""
        dynamic, weight = self._simulated.get(node.name, (None, None))
        if dynamic is not None:
            merged = feat.merge_features(node.available_features, dynamic, feat.is_dynamic_feature)
            node = replace(node, available_features=merged, active_features=merged)
        return node if weight is None else replace(node, weight=weight)


def open_publisher(config: ScoringConfig, db_url: str | None = None, *, dry_run: bool = False,
                   slurm: SlurmCli | None = None) -> Publisher:
    """A production publisher for `slurm-aigc controller`: Slurm tools and the state database.

    The controller runs `publisher.tick()` on its own loop (at `config.interval_s`) and, on
    SIGHUP, `publisher.set_config(load_scoring_config(path))`.
    """
    from slurm_aigc.db import open_database

    return Publisher(slurm or SlurmCli(), TelemetryStore(open_database(db_url)), config, dry_run=dry_run)
