"""The feature/weight publisher daemon: tells Slurm how busy, how fragmented and what is served where.

Each cycle (`Publisher.tick`, run by `slurm-aigc controller`):

1. read the nodes (one listing: `SlurmCli.nodes()`, with `GresUsed`), the jobs (one listing:
   `SlurmCli.jobs()`) and the mean GPU utilization of every node over the recent samples;
   the controller hands on its tick's job listing, and its node listing when it made one;
2. compute per node, in the pure planner (`publish_plan.plan_cycle`), a Slurm `Weight` from
   the scoring plugins and the dynamic features `nvfree<k>` and `model_<id>` (names in
   `features.py`), and put back the agents' static features Slurm lost (`remember_static`);
3. write a node through `scontrol update` only when its feature set differs or its weight
   moved by at least the hysteresis band, and always when Slurm lost what we wrote (after
   `scontrol reconfigure` or a slurmctld restart, Slurm forgets `scontrol update`);
4. record each change in `node_publications`, right before its write (and take the row out
   again when Slurm refuses the write). In dry-run nothing is
   written to Slurm: the cycle's changes are logged and recorded at once with `dry_run` set (one
   transaction: ~190 of them a cycle at 1,000 nodes cost 0.4-1 s of commits on MariaDB), and
   remembered so each is logged once.

Features are merged into what Slurm reports just before the writes (one more node listing
in a cycle that changes features, never one per node), so an admin's own features and the
agent's static ones are never dropped. slurmctld RPCs per cycle: two listings (fewer when the
controller passes its listings of the same tick), one more when features change, plus one
`scontrol update` per node whose features or weight change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from slurm_aigc.errors import AigcError
from slurm_aigc.fsio import atomic_write_text
from slurm_aigc.slurm import JobInfo, NodeInfo, SlurmCli
from slurm_aigc.telemetry import features as feat
from slurm_aigc.telemetry.config import ScoringConfig
from slurm_aigc.telemetry.gres import gres_gpu_total
from slurm_aigc.telemetry.publish_plan import (
    NVLINK_SIZE_RE,
    IslandSource,
    ModelSightings,
    NodePlan,
    dynamic_features,
    island_use,
    islands_from_features,
    lingering_models,
    listable_models,
    merge_ours,
    models_by_node,
    node_view,
    parse_comment_tags,
    plan_cycle,
    plan_node,
    published_lines,
    record_sightings,
    remember_static,
    served_model,
)
from slurm_aigc.telemetry.store import Publication, TelemetryStore

LOG = logging.getLogger(__name__)

# The planner's names, importable from here as before the split.
__all__ = [
    "IslandSource", "ModelSightings", "NodePlan", "Publisher", "dynamic_features", "island_use",
    "islands_from_features", "lingering_models", "listable_models", "models_by_node", "node_view",
    "open_publisher", "parse_comment_tags", "plan_cycle", "plan_node", "published_lines",
    "record_sightings", "served_model", "write_lines_atomically",
]


def write_lines_atomically(path: Path, lines: Sequence[str]) -> None:
    """Replace `path` by `lines` (temp file + rename), world-readable for slurmctld's hook."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(f"{line}\n" for line in lines), mode=0o644)


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
        self._static_seen: dict[str, tuple[str, ...]] = {}
        # The last cycle's node listing as Slurm gave it (a new tuple each cycle): the reclaim
        # controller takes its shards-per-GPU inventory from it instead of listing again.
        self.last_nodes: tuple[NodeInfo, ...] | None = None

    def set_config(self, config: ScoringConfig, dry_run: bool | None = None) -> None:
        """Use a new (already validated) scoring config from the next cycle on (SIGHUP).

        `dry_run` (None: unchanged) switches the mode. What one mode knew of Slurm is not the
        other's: the weights last written are read again from the database, the simulated
        features dropped and the published-features file written again.
        """
        self.config = config
        if dry_run is not None and dry_run != self._dry_run:
            self._dry_run = dry_run
            self._last_weights = None
            self._simulated = {}
            self._listed = {}

    def tick_when_due(self, jobs: Sequence[JobInfo] | None = None,
                      nodes: Sequence[NodeInfo] | None = None) -> list[NodePlan]:
        """`tick(jobs, nodes)` at most once per `scoring.interval_s`: for hosts whose loop runs faster."""
        now = self._monotonic()
        if self._last_cycle_at is not None and now - self._last_cycle_at < self.config.interval_s:
            return []
        self._last_cycle_at = now
        return self.tick(jobs, nodes)

    def tick(self, jobs: Sequence[JobInfo] | None = None, nodes: Sequence[NodeInfo] | None = None) -> list[NodePlan]:
        """One cycle; returns the plans it applied (or, in dry-run, would have applied).

        `jobs`, `nodes`: fresh listings of every job and node (the controller's, taken this
        tick), so that the cycle does not list them again; None: list them here.
        """
        if self._last_weights is None:
            self._last_weights = {} if self._dry_run else self._store.last_published_weights()
        now = self._clock()
        self.last_nodes = tuple(self._slurm.nodes() if nodes is None else nodes)
        nodes = [self._overlay(node) for node in self.last_nodes]
        if jobs is None:
            jobs = self._slurm.jobs()
        utils = self._store.mean_util_by_node(now - self.config.window_s)
        self._remember_islands(nodes)
        linger, grace = self.config.model_linger_s, self.config.model_unlist_grace_s
        served = models_by_node(jobs, self.config.serving_classes)
        self._sightings = record_sightings(self._sightings, served, nodes, now, linger)
        keep = lingering_models(self._sightings, now, linger + grace)
        self._sightings = {key: seen for key, seen in self._sightings.items() if now - seen < linger + grace}
        listable = listable_models(self._sightings, now, linger)
        self._static_seen, restore = remember_static(self._static_seen, nodes)
        plans = plan_cycle(nodes, jobs, utils, self._last_weights, self.config, self._islands, keep, restore)
        # The hook may --prefer only features some node has (else Slurm rejects the job):
        # unlist a vanishing model a grace before Slurm loses it, list a new one once Slurm has it.
        self._list_models(published_lines(nodes, plans, True, listable))
        applied: list[NodePlan] = []
        failures: list[AigcError] = []
        current = self._current_features(plans)
        for index, plan in enumerate(plans):
            if len(applied) >= self.config.max_writes_per_cycle:
                # Rate limit: the rest still differ from Slurm next cycle and are planned again.
                LOG.warning("up to %d node update(s) wait for the next cycle (scoring.max_writes_per_cycle = %d)",
                            len(plans) - index, self.config.max_writes_per_cycle)
                break
            try:
                done = self._apply(plan, now, current)
            except AigcError as error:  # one node's failure must not starve the others
                LOG.error("cannot update %s: %s", plan.node, error)
                failures.append(error)
                continue
            if done is not None:
                applied.append(done)
        if self._dry_run and applied:
            self._store.record_publications([self._publication(plan, now) for plan in applied])
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
            if any(NVLINK_SIZE_RE.match(f) for f in node.available_features):
                self._islands_seen[node.name] = islands_from_features(gres_gpu_total(node.gres), node.available_features)

    def _islands(self, name: str) -> Sequence[Sequence[int]] | None:
        known = self._islands_of(name) if self._islands_of else None
        return known if known is not None else self._islands_seen.get(name)

    def _apply(self, plan: NodePlan, now: float, current: Mapping[str, tuple[str, ...]]) -> NodePlan | None:
        if self._dry_run:
            LOG.info("dry-run: would update %s: %s", plan.node, plan.reason)
            self._remember_simulated(plan)
        else:
            plan = refreshed(plan, current)
            if not plan.changes:
                return None
            # Recorded before it is done (a database that cannot record stops the writes); a
            # write Slurm refuses is taken out of the record again. A crash in between leaves a
            # weight Slurm lacks on record, which the next start's cycle sees and writes.
            row_id = self._store.record_publication(self._publication(plan, now))
            try:
                self._slurm.update_node(plan.node, features=plan.features_after, weight=plan.weight_after)
            except AigcError:
                self._store.forget_publication(row_id)
                raise
            LOG.info("updated %s: %s", plan.node, plan.reason)
        if plan.weight_after is not None:
            assert self._last_weights is not None
            self._last_weights[plan.node] = plan.weight_after
        return plan

    def _publication(self, plan: NodePlan, now: float) -> Publication:
        return Publication(
            ts=now, node=plan.node, features_before=plan.features_before, features_after=plan.features_after,
            weight_before=plan.weight_before, weight_after=plan.weight_after, reason=plan.reason,
            dry_run=self._dry_run,
        )

    def _current_features(self, plans: Sequence[NodePlan]) -> dict[str, tuple[str, ...]]:
        """Every node's features as Slurm has them now (the agents may have just written): one
        listing for the whole cycle, only when some plan changes features and not in dry-run."""
        if self._dry_run or not any(plan.features_after is not None for plan in plans):
            return {}
        return {node.name: node.available_features for node in self._slurm.nodes()}

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


def refreshed(plan: NodePlan, current: Mapping[str, tuple[str, ...]]) -> NodePlan:
    """`plan` merged into the node's features as listed just before the writes."""
    if plan.features_after is None or plan.node not in current:
        return plan
    now = current[plan.node]
    merged = merge_ours(now, plan.dynamic, plan.restore)
    features_after = None if feat.same_features(merged, now) else merged
    return replace(plan, features_before=now, features_after=features_after)


def open_publisher(config: ScoringConfig, db_url: str | None = None, *, dry_run: bool = False,
                   slurm: SlurmCli | None = None) -> Publisher:
    """A production publisher for `slurm-aigc controller`: Slurm tools and the state database.

    The controller runs `publisher.tick()` on its own loop (at `config.interval_s`) and, on
    SIGHUP, `publisher.set_config(load_scoring_config(path))`.
    """
    from slurm_aigc.db import open_database

    return Publisher(slurm or SlurmCli(), TelemetryStore(open_database(db_url)), config, dry_run=dry_run)
