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
   `scontrol reconfigure` or a slurmctld restart, Slurm forgets `scontrol update`); at most
   `max_writes_per_cycle` nodes a cycle, the least recently written first;
4. record each change in `node_publications`, right before its write (and take the row out
   again when Slurm refuses the write; after a timed-out write, only when one re-read of
   the node shows it did not take), and rewrite the hook's published-features file with
   the time in its header (a listing the hook finds too old prefers nothing). In dry-run nothing is
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
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from slurm_aigc.errors import AigcError, SlurmCommandError
from slurm_aigc.fsio import atomic_write_text
from slurm_aigc.slurm import JobInfo, NodeInfo, SlurmCli
from slurm_aigc.telemetry import features as feat
from slurm_aigc.telemetry.config import ScoringConfig
from slurm_aigc.telemetry.gres import gres_gpu_total
from slurm_aigc.telemetry.publish_plan import (
    IslandSource,
    ModelSightings,
    NodePlan,
    cap_sightings,
    dynamic_features,
    features_tell_islands,
    island_use,
    islands_from_features,
    lingering_models,
    listable_models,
    merge_ours,
    model_jobs_by_node,
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
    "LISTING_HEADER", "IslandSource", "ModelSightings", "NodePlan", "Publisher", "dynamic_features", "island_use",
    "islands_from_features", "lingering_models", "listable_models", "listing_lines", "node_view",
    "open_publisher", "parse_comment_tags", "plan_cycle", "plan_node", "published_lines",
    "record_sightings", "served_model", "write_lines_atomically",
]


# The listing's first line: when the publisher wrote it (whole seconds since the epoch, the
# hook's `os.time()`). The hook prefers nothing from a listing older than its bound or without
# this line: after a slurmctld restart or reconfigure Slurm has forgotten the model features,
# and only a live publisher puts them back (docs/hook.md, "Model preference").
LISTING_HEADER = "# written {epoch}"


def write_lines_atomically(path: Path, lines: Sequence[str]) -> None:
    """Replace `path` by `lines` (temp file + rename), world-readable for slurmctld's hook."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(f"{line}\n" for line in lines), mode=0o644)


def listing_lines(lines: frozenset[str], written_at: float) -> list[str]:
    """The published-features file: the header with `written_at`, then `lines` sorted."""
    return [LISTING_HEADER.format(epoch=int(written_at)), *sorted(lines)]


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
        # When each node was last written (or a write was tried): the rate limit serves the
        # least recently written first, so nodes late in Slurm's order are not starved. In
        # memory: a restart starts every node equal, in listing order.
        self._written_at: dict[str, float] = {}
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
        keep, listable = self._models(jobs, nodes, now)
        self._static_seen, restore = remember_static(self._static_seen, nodes)
        plans = plan_cycle(nodes, jobs, utils, self._last_weights, self.config, self._islands, keep, restore)
        # The hook may --prefer only features some node has (else Slurm rejects the job):
        # unlist a vanishing model a grace before Slurm loses it, list a new one once Slurm has it.
        self._list_models(published_lines(nodes, plans, True, listable), now)
        applied, failures = self._apply_all(plans, now, nodes)
        if self._dry_run and applied:
            self._store.record_publications([self._publication(plan, now) for plan in applied])
        # Always rewritten (one small file): its header says a live publisher ran this cycle.
        self._list_models(published_lines(nodes, applied, False, listable), now, always=True)
        if failures:
            raise failures[0]  # the loop logs it and backs off; the other nodes were written
        return applied

    def _models(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo], now: float,
                ) -> tuple[dict[str, frozenset[str]], frozenset[tuple[str, str]]]:
        """(model features to publish per node, (node, feature) pairs the hook may --prefer)."""
        linger, grace = self.config.model_linger_s, self.config.model_unlist_grace_s
        served = model_jobs_by_node(jobs, self.config.serving_classes)
        sightings = record_sightings(self._sightings, nodes, now, linger)
        self._sightings = cap_sightings(sightings, served, now, linger, grace, self.config.max_models_per_node)
        return lingering_models(self._sightings, now, linger + grace), listable_models(self._sightings, now, linger)

    def _apply_all(self, plans: Sequence[NodePlan], now: float, nodes: Sequence[NodeInfo],
                   ) -> tuple[list[NodePlan], list[AigcError]]:
        """Apply `plans`, the least recently written node first, at most `max_writes_per_cycle`."""
        applied: list[NodePlan] = []
        failures: list[AigcError] = []
        listed = {node.name: node for node in nodes} | self._current_nodes(plans)
        order = sorted(plans, key=lambda plan: self._written_at.get(plan.node, -math.inf))  # stable: ties keep Slurm's order
        for index, plan in enumerate(order):
            if len(applied) + len(failures) >= self.config.max_writes_per_cycle:
                # Rate limit: the rest still differ from Slurm next cycle and are planned again.
                LOG.warning("up to %d node update(s) wait for the next cycle (scoring.max_writes_per_cycle = %d)",
                            len(order) - index, self.config.max_writes_per_cycle)
                break
            try:
                done = self._apply(plan, now, listed)
            except AigcError as error:  # one node's failure must not starve the others
                LOG.error("cannot update %s: %s", plan.node, error)
                failures.append(error)
                self._written_at[plan.node] = now  # tried: a node Slurm keeps refusing must not hold a slot
                continue
            if done is not None:
                applied.append(done)
                self._written_at[plan.node] = now
        return applied, failures

    def _list_models(self, lines: frozenset[str], now: float, always: bool = False) -> None:
        """Write `published_features_file` (see `published_lines`) with its header: when its
        content changes, and `always` (once a cycle, at its end) to renew the header's time."""
        path = self.config.published_features_file
        if self._dry_run or path is None or (lines == self._listed.get(path) and not always):
            return
        write_lines_atomically(Path(path), listing_lines(lines, now))
        self._listed[path] = lines

    def _remember_islands(self, nodes: Sequence[NodeInfo]) -> None:
        for node in nodes:
            total = gres_gpu_total(node.gres)
            if features_tell_islands(node.available_features):
                # A `mig` node is remembered as without islands: after a reconfigure drops `mig`
                # with the rest, the islands of `nvlink<N>` would be read on Slurm indices that
                # count MIG instances.
                self._islands_seen[node.name] = islands_from_features(total, node.available_features)

    def _islands(self, name: str) -> Sequence[Sequence[int]] | None:
        known = self._islands_of(name) if self._islands_of else None
        return known if known is not None else self._islands_seen.get(name)

    def _apply(self, plan: NodePlan, now: float, listed: Mapping[str, NodeInfo]) -> NodePlan | None:
        """Write one plan; `listed`: every node as Slurm showed it last (right before the
        writes when features change), whose active features the write keeps (update_node)."""
        if self._dry_run:
            LOG.info("dry-run: would update %s: %s", plan.node, plan.reason)
            self._remember_simulated(plan)
        else:
            plan = refreshed(plan, {name: node.available_features for name, node in listed.items()})
            if not plan.changes:
                return None
            # Recorded before it is done (a database that cannot record stops the writes); a
            # write Slurm refuses is taken out of the record again. A crash in between leaves a
            # weight Slurm lacks on record, which the next start's cycle sees and writes.
            row_id = self._store.record_publication(self._publication(plan, now))
            try:
                self._slurm.update_node(plan.node, features=plan.features_after, weight=plan.weight_after,
                                        current=listed.get(plan.node))
            except AigcError as error:
                if self._took_anyway(plan, error):
                    self._remember_weight(plan)  # as on record, for the next cycle's hysteresis
                else:
                    self._store.forget_publication(row_id)
                raise  # a failure all the same: the cycle counts it and backs off as for any other
            LOG.info("updated %s: %s", plan.node, plan.reason)
        self._remember_weight(plan)
        return plan

    def _remember_weight(self, plan: NodePlan) -> None:
        if plan.weight_after is not None:
            assert self._last_weights is not None
            self._last_weights[plan.node] = plan.weight_after

    def _took_anyway(self, plan: NodePlan, error: AigcError) -> bool:
        """Whether a timed-out `scontrol update` took all the same (slurmctld may have applied it
        before scontrol gave up): one `scontrol show node` of that node, only after a timeout."""
        if not isinstance(error, SlurmCommandError) or error.returncode is not None:
            return False  # refused: it never happened
        try:
            took = shows_plan(self._slurm.node(plan.node), plan)
        except AigcError as reread:
            LOG.warning("update of %s timed out and it cannot be read back (%s): not on record", plan.node, reread)
            return False
        LOG.warning("update of %s timed out; Slurm %s: %s", plan.node,
                    "shows it, kept on record" if took else "does not show it, not on record", plan.reason)
        return took

    def _publication(self, plan: NodePlan, now: float) -> Publication:
        return Publication(
            ts=now, node=plan.node, features_before=plan.features_before, features_after=plan.features_after,
            weight_before=plan.weight_before, weight_after=plan.weight_after, reason=plan.reason,
            dry_run=self._dry_run,
        )

    def _current_nodes(self, plans: Sequence[NodePlan]) -> dict[str, NodeInfo]:
        """Every node as Slurm has it now (the agents may have just written its features): one
        listing for the whole cycle, only when some plan changes features and not in dry-run."""
        if self._dry_run or not any(plan.features_after is not None for plan in plans):
            return {}
        return {node.name: node for node in self._slurm.nodes()}

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


def shows_plan(node: NodeInfo, plan: NodePlan) -> bool:
    """Whether Slurm's `node` has what `plan` writes: its features (as a set) and its weight."""
    features = plan.features_after is None or feat.same_features(node.available_features, plan.features_after)
    return features and (plan.weight_after is None or node.weight == plan.weight_after)


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
