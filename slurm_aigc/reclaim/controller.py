"""One tick of reclaim: gather jobs and samples, judge, plan, act (plus the publisher's tick).

The controller never acts on data it cannot trust: slurmctld not answering
(SlurmCommandError) or the database down (DatabaseError) fail the tick, and samples older
than `stale_s` raise StaleSamplesError; the daemon loop then backs off and retries. Intents
left open (by a killed controller, or a shrink whose job is not PENDING yet) are reconciled
before each tick's actions; in dry-run that only reports, once, and changes nothing.

slurmctld reads per tick (issue 11.5's budget): one job listing, handed on to the publisher
(it lists no jobs of its own), with the node listing when the tick made one. The
shards-per-GPU inventory comes from the publisher's node listing of its last cycle
(`nodes_seen`) when there is a new one; otherwise the controller keeps it between ticks and
lists the nodes itself at start, every `NODE_REFRESH_S`, after SIGHUP, or when a shard job
runs on a node it does not know.
"""

from __future__ import annotations

import gc
import itertools
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from slurm_aigc.errors import AigcError
from slurm_aigc.lease import RECLAIM, Leases
from slurm_aigc.reclaim.actuator import ActionResult, Actuator
from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.detect import (
    GpuSeries,
    JobMeta,
    JobWindow,
    Sample,
    SampleBatch,
    Verdict,
    detect,
    no_samples_verdict,
)
from slurm_aigc.reclaim.gpuconflict import (
    Conflict,
    find_conflicts,
    gpu_holders,
    gpu_memory_mib,
    judge_conflict,
)
from slurm_aigc.reclaim.jobs import (
    is_gpu_job,
    job_facts,
    node_names,
    shard_memory_limit_mib,
    start_ts,
    uses_shards,
)
from slurm_aigc.reclaim.ladder import (
    JobFacts,
    PastAction,
    PlannedAction,
    Wait,
    limit_per_tick,
    plan_job,
)
from slurm_aigc.reclaim.memguard import judge_memory
from slurm_aigc.reclaim.store import ReclaimStore, SampleRow
from slurm_aigc.reclaim.tracker import StretchTracker
from slurm_aigc.slurm import JobInfo, NodeInfo, SlurmCli
from slurm_aigc.tags import trusted_share_no
from slurm_aigc.telemetry.gres import expand_nodes
from slurm_aigc.units import MIB_PER_GIB

LOG = logging.getLogger(__name__)


# The publisher's cycle, given the tick's job listing and node listing (None: not listed this tick).
PublisherTick = Callable[[Sequence[JobInfo] | None, Sequence[NodeInfo] | None], object]


class StaleSamplesError(AigcError):
    """The newest GPU sample is too old to act on: the agents or the database lag."""


@dataclass(frozen=True)
class JobView:
    """A running GPU job, its verdict and what reclaim does about it."""

    job: JobInfo
    facts: JobFacts
    verdict: Verdict
    plan: PlannedAction | Wait


@dataclass(frozen=True)
class Assessment:
    """Everything one tick knows before acting."""

    now_ts: float
    newest_sample_ts: float | None
    stale: bool
    views: tuple[JobView, ...]


@dataclass(frozen=True)
class TickReport:
    assessment: Assessment
    reconciled: tuple[ActionResult, ...]
    results: tuple[ActionResult, ...]
    capped: tuple[Wait, ...]
    # Why reclaim did not run this tick: another process holds its lease ('' when it ran).
    standby: str = ""


def windows_from_rows(metas: Mapping[str, JobMeta], rows: Sequence[SampleRow]) -> list[JobWindow]:
    """Group sample rows (sorted by job, node, GPU, time) into one JobWindow per job with rows."""
    by_job: dict[str, list[GpuSeries]] = {}
    for (job_id, node, gpu), group in itertools.groupby(rows, key=lambda r: (r.job_id, r.node, r.gpu_index)):
        samples = tuple(Sample(r.ts, r.sm_util_pct, r.memory_used_mib, r.power_draw_w, r.power_limit_w) for r in group)
        by_job.setdefault(job_id, []).append(GpuSeries(node, gpu, samples))
    return [JobWindow(metas[job_id], tuple(series)) for job_id, series in by_job.items() if job_id in metas]


def rows_to_judge(rows: Sequence[SampleRow], nodes_of: Mapping[str, frozenset[str]], now: float,
                  ahead_s: float) -> tuple[list[SampleRow], dict[tuple[str, str], str]]:
    """The rows a job may be judged by: written for one of its own nodes, not dated after `now + ahead_s`.

    Every agent inserts through one database role, so nothing in the database stops a node's
    agent (or a host mislabelled as another) from writing rows for a job on another node; such
    a row could get a job judged idle or over its memory. A row dated in the future comes from
    a host whose clock runs ahead: it would look fresh for as long as the skew lasts, and shorten
    the job's grace. Returns the kept rows and, per (node, reason) of rows left out, an example.
    """
    kept: list[SampleRow] = []
    dropped: dict[tuple[str, str], str] = {}
    for row in rows:
        nodes = nodes_of.get(row.job_id)
        if nodes is not None and row.node not in nodes:
            dropped[(row.node, "foreign")] = f"rows for job {row.job_id}, which does not run there"
        elif row.ts > now + ahead_s:
            dropped[(row.node, "ahead")] = f"rows dated {row.ts - now:.0f} s ahead of this host's clock"
        else:
            kept.append(row)
    return kept, dropped


def batch_from_rows(metas: Mapping[str, JobMeta], rows: Sequence[SampleRow]) -> SampleBatch:
    """Columns straight from sample rows sorted by job, node, GPU, time, for the jobs in `metas`:
    `batch_from_jobs(windows_from_rows(metas, rows))` without an object per sample (0.1 s a tick
    over 10,000 jobs)."""
    kept = [r for r in rows if r.job_id in metas]
    job_starts, series_starts = _boundaries(kept)
    columns = list(zip(*kept)) or [()] * len(SampleRow._fields)
    floats = [np.array(columns[SampleRow._fields.index(name)], dtype=np.float64)  # None -> NaN
              for name in ("ts", "sm_util_pct", "memory_used_mib", "power_draw_w", "power_limit_w")]
    firsts = [kept[i] for i in series_starts]
    return SampleBatch(
        metas=tuple(metas[firsts[s].job_id] for s in job_starts),
        job_offsets=np.array([*job_starts, len(series_starts)], dtype=np.int64),
        series_offsets=np.array([*series_starts, len(kept)], dtype=np.int64),
        series_node=tuple(r.node for r in firsts), series_gpu=tuple(r.gpu_index for r in firsts),
        ts=floats[0], util=floats[1], memory=floats[2], power=floats[3], power_limit=floats[4])


def _boundaries(rows: Sequence[SampleRow]) -> tuple[list[int], list[int]]:
    """(index of each job's first series among the series, index of each series' first row)."""
    job_starts: list[int] = []
    series_starts: list[int] = []
    previous: tuple[str, str, int] | None = None
    for i, row in enumerate(rows):
        series = (row.job_id, row.node, row.gpu_index)
        if series != previous:
            if previous is None or row.job_id != previous[0]:
                job_starts.append(len(series_starts))
            series_starts.append(i)
            previous = series
    return job_starts, series_starts


def id_gaps(seen: Collection[int], low: int, high: int) -> list[tuple[int, int]]:
    """The closed ranges of the ids in (low, high] that are not in `seen`, in order."""
    gaps, start = [], low + 1
    for i in sorted(i for i in seen if low < i <= high):
        if i > start:
            gaps.append((start, i - 1))
        start = i + 1
    if start <= high:
        gaps.append((start, high))
    return gaps


def job_meta(job: JobInfo, facts: JobFacts, now_ts: float, shared: bool = False) -> JobMeta:
    """The detectors' view of a running job; `shared`: an agent saw another job on its GPUs."""
    shards = uses_shards(job)
    started = start_ts(job)
    return JobMeta(job.job_id, facts.job_class, now_ts if started is None else started,
                   None if shards else facts.gpus, shared or shards)


def with_missing(verdicts: Sequence[Verdict], metas: Mapping[str, JobMeta], config: ReclaimConfig,
                 now_ts: float) -> dict[str, Verdict]:
    """Verdicts by job id, 'no samples' for the jobs the detectors had no samples of."""
    found = {v.job_id: v for v in verdicts}
    for job_id, meta in metas.items():
        if job_id not in found:
            found[job_id] = no_samples_verdict(meta, config.policy_for(meta.job_class), now_ts)
    return found


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with CPython's cyclic garbage collector paused (reference counting still frees).

    A tick over 10,000 jobs holds ~180,000 container objects (the job listing, sample rows,
    verdicts, views) until it ends: with the collector running they set off ~260 young and two
    full collections a tick, ~0.35 s of CPU. They are freed by reference counting when the tick
    ends; the collector resumes after it (as it was: a caller that paused it keeps it paused).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class DerivedFacts:
    """`job_facts` and `job_meta` of each tick's running jobs, derived again only for a job
    whose JobInfo object is not the last tick's.

    `SlurmCli.jobs()` hands back the same frozen JobInfo while a job's record is unchanged,
    and facts do not move with the clock (a meta does only for a job without a start time):
    deriving both afresh for 10,000 jobs cost ~0.17 s a tick. Only the last tick's jobs are kept.
    """

    def __init__(self) -> None:
        self._shards: Mapping[str, int] = {}
        self._facts: dict[str, tuple[JobInfo, JobFacts]] = {}
        self._metas: dict[str, tuple[JobInfo, bool, JobMeta]] = {}

    def facts(self, jobs: Sequence[JobInfo], shards: Mapping[str, int]) -> dict[str, JobFacts]:
        """`job_facts(job, shards)` by job id; new shards-per-GPU figures derive every job again."""
        previous = self._facts if shards == self._shards else {}
        self._shards, self._facts = dict(shards), {}
        for job in jobs:
            kept = previous.get(job.job_id)
            self._facts[job.job_id] = kept if kept is not None and kept[0] is job else (job, job_facts(job, shards))
        return {job_id: facts for job_id, (_, facts) in self._facts.items()}

    def metas(self, jobs: Sequence[JobInfo], facts: Mapping[str, JobFacts], now_ts: float,
              shared: Collection[str]) -> dict[str, JobMeta]:
        """`job_meta(job, facts, now_ts, job_id in shared)` by job id."""
        previous, self._metas = self._metas, {}
        metas = {}
        for job in jobs:
            flag = job.job_id in shared
            kept = previous.get(job.job_id)
            if kept is not None and kept[0] is job and kept[1] == flag:
                meta = kept[2]
            else:
                meta = job_meta(job, facts[job.job_id], now_ts, flag)
            if job.start_time is not None:  # else its start counts as now: derived each tick
                self._metas[job.job_id] = (job, flag, meta)
            metas[job.job_id] = meta
        return metas


class Controller:
    """Reclaim's tick; construct with fakes in tests (`SlurmCli(runner=...)`, temporary DB)."""

    # Rows committed out of id order (several agents, a server database) are looked for this far back.
    ID_OVERLAP = 10_000
    # Past this many gaps among the ids read there, the late-row check reads every id back to ID_OVERLAP.
    MAX_ID_GAPS = 200
    # A node's GPU type (hence shards per GPU) changes only with slurm.conf: re-read it this
    # rarely (a node listing is 2 RPCs on 22.05; per tick it was most of the controller's reads).
    NODE_REFRESH_S = 600.0

    def __init__(
        self,
        slurm: SlurmCli,
        store: ReclaimStore,
        config: ReclaimConfig,
        *,
        dry_run: bool | None = None,
        clock: Callable[[], float] = time.time,
        actuator: Actuator | None = None,
        publisher_tick: PublisherTick | None = None,
        only_jobs: frozenset[str] | None = None,
        nodes_seen: Callable[[], Sequence[NodeInfo] | None] | None = None,
        leases: Leases | None = None,
    ) -> None:
        self._slurm = slurm
        self._store = store
        self.config = config
        self.dry_run = config.dry_run if dry_run is None else dry_run
        self._clock = clock
        self._actuator = actuator or Actuator(slurm, store, config, clock=clock)
        self._publisher_tick = publisher_tick
        self._reconciled = False
        # Restrict judging and acting to these job ids (an admin acting on one job, tests).
        self._only_jobs = only_jobs
        self._tracker = StretchTracker()
        self._watermark_id = 0
        self._seen_ids: set[int] = set()  # ids read in (watermark - ID_OVERLAP, watermark]
        self._shared_jobs: set[str] = set()
        self._derived = DerivedFacts()
        # This tick's job listing (every job, every state), for the publisher; None if not listed.
        self._listing: list[JobInfo] | None = None
        self._nodes_listed: tuple[NodeInfo, ...] | None = None  # this tick's own node listing, likewise
        # GPU type by node name ('' when untyped or not listed) and when it was read.
        self._gpu_types: dict[str, str] | None = None
        self._gpu_types_at = -math.inf
        # The publisher's latest node listing, and the one last taken from it (by identity).
        self._nodes_seen = nodes_seen
        self._seen_used: Sequence[NodeInfo] | None = None
        self._conflicts_seen: set[Conflict] = set()
        self._dropped_seen: set[tuple[str, str]] = set()
        # Reclaim runs only while this process holds its lease (None: no other controller can
        # exist, e.g. tests, a dry-run `--once`), and a batch stops acting once the lease ran out.
        self._leases = leases
        self._actuator.stop_when(self._lease_lost)
        self._actuator.fence_when(self._lease_lost)

    def set_config(self, config: ReclaimConfig, dry_run: bool | None = None) -> None:
        """Use a new, already validated config from the next tick on (SIGHUP).

        `dry_run`: the mode from then on (the command line's override, else the new
        `reclaim.dry_run`); None keeps the current one. An admin goes live, or back to
        dry-run, by editing the policy and reloading: a mode fixed at start would ignore that.
        """
        self.config = config
        if dry_run is not None:
            self.dry_run = dry_run
        self._actuator.config = config
        self._tracker = StretchTracker()  # thresholds changed: judge the windows afresh
        self._gpu_types = None  # an admin reloading after a slurm.conf change expects a re-read

    def stop_when(self, stopping: Callable[[], bool]) -> None:
        """Take no further action within a tick once `stopping()` (`Actuator.stop_when`), or once
        the reclaim lease ran out."""
        self._actuator.stop_when(lambda: stopping() or self._lease_lost())

    def _lease_lost(self) -> bool:
        return self._leases is not None and not self._leases.still_held(RECLAIM)

    def _standby(self) -> str:
        """'' when this process may run reclaim this tick; else who holds the lease."""
        if self._leases is None or self._leases.hold(RECLAIM):
            return ""
        return self._leases.why_not(RECLAIM)

    def reconcile(self) -> tuple[ActionResult, ...]:
        """Settle open intents (a killed controller's, a shrink waiting for PENDING); dry-run: report only."""
        results = tuple(self._actuator.reconcile(dry_run=self.dry_run, only_jobs=self._only_jobs))
        self._reconciled = True
        return results

    def assess(self) -> Assessment:
        """Judge every running GPU job over its full window, with evidence (`idle list`)."""
        now, jobs, newest = self._snapshot()
        shards, gib = self._shard_maps(jobs)
        facts = {j.job_id: job_facts(j, shards) for j in jobs}
        rows = self._judged_rows(self._store.samples(facts, now - self.config.lookback_s()) if jobs else [], jobs, now)
        shared = {r.job_id for r in rows if r.shared}
        metas = {j.job_id: job_meta(j, facts[j.job_id], now, j.job_id in shared) for j in jobs}
        batch = batch_from_rows(metas, rows)
        verdicts = detect(batch, self.config.classes, self.config.defaults, now, self.config.gap_s)
        found = self._guard_memory(now, jobs, metas, gib, with_missing(verdicts, metas, self.config, now))
        newest = self._trusted_newest(newest, now, lambda: (r.ts for r in rows))
        return self._plan(now, newest, jobs, facts, self._guard_conflicts(now, metas, shards, gib, found))

    def tick(self) -> TickReport:
        """One cycle: reclaim, then the publisher; the first error is raised after both ran.

        The publisher gets reclaim's job listing of this tick (None when reclaim failed before
        listing: it then lists the jobs itself), and its node listing if it made one.
        """
        errors: list[Exception] = []
        self._listing = self._nodes_listed = None
        with collector_paused():
            report = self._guard(self._reclaim_tick, errors)
            publish = self._publisher_tick
            if publish is not None:
                listing, nodes = self._listing, self._nodes_listed
                self._guard(lambda: publish(listing, nodes), errors)
        if errors:
            raise errors[0]
        assert isinstance(report, TickReport)
        return report

    @staticmethod
    def _guard(part: Callable[[], Any], errors: list[Exception]) -> Any:
        try:
            return part()
        except Exception as error:  # noqa: BLE001 - one part failing must not skip the other
            errors.append(error)
            return None

    def _shard_maps(self, jobs: Sequence[JobInfo]) -> tuple[dict[str, int], dict[str, float]]:
        """Per node, shards per GPU and GiB per shard of its GPU type (policy inventory).

        Nodes are listed only when a running job holds shards, and then from the cache
        (`_node_gpu_types`).
        """
        shard_jobs = [j for j in jobs if uses_shards(j)]
        if not self.config.shards_per_gpu or not shard_jobs:
            return {}, {}
        types = self._node_gpu_types({name for j in shard_jobs for name in node_names(j.node_list)})
        shards = {name: n for name, kind in types.items() if (n := self.config.shards_per_gpu.get(kind, 0))}
        gib = {name: g for name, kind in types.items() if (g := self.config.gib_per_shard.get(kind, 0.0))}
        return shards, gib

    def _node_gpu_types(self, wanted: set[str]) -> dict[str, str]:
        """GPU type by node: from the publisher's newest listing, else kept, else listed here.

        Listed here when no listing is known yet, when the one kept is older than
        NODE_REFRESH_S, or when a `wanted` node is missing from it. A node missing from a
        listing counts as untyped (no shards known) until the next one, so that it does not
        cost a listing every tick.
        """
        now = self._clock()
        seen = self._nodes_seen() if self._nodes_seen is not None else None
        if seen is not None and seen is not self._seen_used:  # listed since by the publisher: free
            self._seen_used = seen
            self._keep_gpu_types(seen, wanted, now)
        cached = self._gpu_types
        if cached is not None and now - self._gpu_types_at < self.NODE_REFRESH_S and wanted <= cached.keys():
            return cached
        self._nodes_listed = tuple(self._slurm.nodes())
        return self._keep_gpu_types(self._nodes_listed, wanted, now)

    def _keep_gpu_types(self, nodes: Sequence[NodeInfo], wanted: set[str], now: float) -> dict[str, str]:
        types = {node.name: _gpu_type_of(node.gres) for node in nodes}
        types.update({name: "" for name in wanted if name not in types})
        self._gpu_types, self._gpu_types_at = types, now
        return types

    def _guard_memory(self, now: float, jobs: Sequence[JobInfo], metas: Mapping[str, JobMeta],
                      gib_by_node: Mapping[str, float], verdicts: dict[str, Verdict]) -> dict[str, Verdict]:
        """Shard jobs above their shards' GiB become `over_memory` (it wins: it harms neighbours now).

        Reads only the shard jobs' newest samples (a few polls), each tick.
        """
        limits = {j.job_id: limit for j in jobs if (limit := shard_memory_limit_mib(j, gib_by_node)) > 0}
        if not limits:
            return verdicts
        needed = self.config.over_memory_samples
        rows = self._judged_rows(self._store.samples(limits, now - (needed + 2) * self.config.gap_s), jobs, now)
        # A requeued job keeps its id: its previous run's rows must not judge this run.
        rows = [r for r in rows if r.ts >= metas[r.job_id].start_ts]
        for window in windows_from_rows({k: metas[k] for k in limits}, rows):
            found = judge_memory(window, limits[window.meta.job_id], needed, now, self.config.gap_s,
                                 allowance_mib=self.config.over_memory_allowance_mib)
            if found is not None:
                verdicts[found.job_id] = found
        return verdicts

    def _guard_conflicts(self, now: float, metas: Mapping[str, JobMeta], shards_by_node: Mapping[str, int],
                         gib_by_node: Mapping[str, float], verdicts: dict[str, Verdict]) -> dict[str, Verdict]:
        """Shard jobs on a GPU another job holds whole, once the jobs on it fill its memory, become
        `gpu_conflict` (it wins over the rest).

        Found in this tick's job listing (`gres_detail`); only when there is one, the newest
        samples of the jobs on that GPU are read (their memory there).
        """
        listing = self._listing or ()
        conflicts = find_conflicts(listing, metas.keys()) if any(uses_shards(j) for j in listing) else []
        if not conflicts:
            self._conflicts_seen = set()
            return verdicts
        # Every job on the GPU, not only the pair: 22.05 gives a GPU whole beside two shard jobs
        # as readily as beside one (a shard job asking for its shards directly is not held to the
        # hook's two per GPU), and each pair can fit where the three do not.
        holders = gpu_holders(listing, {(c.node, c.index) for c in conflicts})
        wanted = set().union(*holders.values())
        involved = [j for j in listing if j.job_id in wanted]
        # Judged like the tick's rows (own nodes only, none dated ahead: a skewed clock's row would
        # stay the newest reading for as long as the skew), and only rows of each job's current run.
        rows = self._judged_rows(self._store.samples(wanted, now - self.config.gap_s), involved, now)
        starts = {j.job_id: started for j in involved if (started := start_ts(j)) is not None}
        rows = [r for r in rows if r.ts >= starts.get(r.job_id, -math.inf)]
        newest = {(r.job_id, r.node, r.gpu_index): r.memory_used_mib for r in rows}  # sorted by time
        # share=no from the stamp, never the comment: its owner could aim a requeue at a neighbour.
        others = {c.other for c in conflicts}
        share_no = {j.job_id for j in listing if j.job_id in others and trusted_share_no(j.admin_comment)}
        found = dict(verdicts)
        for conflict in conflicts:
            memory = gpu_memory_mib(conflict, holders[(conflict.node, conflict.index)], newest)
            gpu_mib = shards_by_node.get(conflict.node, 0) * gib_by_node.get(conflict.node, 0.0) * MIB_PER_GIB
            verdict = judge_conflict(conflict, metas[conflict.job_id].job_class, memory, gpu_mib,
                                     self.config.gpu_conflict_memory_pct, now, conflict.other in share_no)
            if conflict not in self._conflicts_seen:  # once per conflict, not every tick
                LOG.warning("job %s shares GPU %d of %s with job %s, which Slurm gave it whole (a Slurm 22.05 "
                            "defect): acting %s", conflict.job_id, conflict.index, conflict.node, conflict.other,
                            "now: that job asked share=no" if conflict.other in share_no else
                            f"once their memory reaches {self.config.gpu_conflict_memory_pct:g} % of the GPU's")
            if verdict is not None:
                found[conflict.job_id] = verdict
        self._conflicts_seen = set(conflicts)
        return found

    def _snapshot(self) -> tuple[float, list[JobInfo], float | None]:
        now = self._clock()
        self._listing = self._slurm.jobs()
        jobs = [j for j in self._listing if j.state == "RUNNING" and is_gpu_job(j)
                and (self._only_jobs is None or j.job_id in self._only_jobs)]
        return now, jobs, self._store.newest_sample_ts()

    def _plan(self, now: float, newest: float | None, jobs: Sequence[JobInfo], facts: Mapping[str, JobFacts],
              verdicts: Mapping[str, Verdict]) -> Assessment:
        stale = bool(jobs) and (newest is None or now - newest > self.config.stale_s)
        # Only a finding is planned from the history (12 queries a tick for 10,000 jobs otherwise).
        history = self._store.history(j.job_id for j in jobs if verdicts[j.job_id].kind)
        views = []
        for job in jobs:
            mine = facts[job.job_id]
            past = self._with_not_acted(mine, history.get(job.job_id, []))
            plan = plan_job(verdicts[job.job_id], mine, past, self.config, now, self.dry_run)
            views.append(JobView(job, mine, verdicts[job.job_id], plan))
        return Assessment(now, newest, stale, tuple(views))

    def _with_not_acted(self, facts: JobFacts, past: list[PastAction]) -> list[PastAction]:
        """`past` with the failures of this run that provably did nothing (`acted: false` in their
        detail) marked, so that the ladder may try that step again. The history carries no detail:
        it is read, with the job's audit rows, only for a job with a failed row in this run (rare)."""
        run = f"{facts.job_id}/r{facts.restarts}/"
        if not any(a.state == "failed" and a.observation_key.removeprefix("dry:").startswith(run) for a in past):
            return past
        unacted = {r.observation_key for r in self._store.audit(job_id=facts.job_id)
                   if r.state == "failed" and r.detail.get("acted") is False}
        return [replace(a, not_acted=a.observation_key in unacted) for a in past]

    def _incremental(self) -> Assessment:
        """Judge every running GPU job, reading only samples newer than the last tick's."""
        now, jobs, newest = self._snapshot()
        shards, gib = self._shard_maps(jobs)
        facts = self._derived.facts(jobs, shards)
        # Jobs seen sharing a GPU are kept while they run only: the set must not grow forever.
        self._shared_jobs &= facts.keys()
        metas = self._derived.metas(jobs, facts, now, self._shared_jobs)
        self._tracker.prune(metas, now - self.config.lookback_s())
        known = self._tracker.jobs()
        fresh_jobs = [job_id for job_id in metas if job_id not in known]
        rows = self._store.samples(fresh_jobs, now - self.config.lookback_s()) if fresh_jobs else []
        if known:
            rows += self._store.samples_after(known, self._watermark_id) + self._late_rows(known, now)
        self._remember(rows)
        rows = self._judged_rows(rows, jobs, now)
        seen = self._tracker.last_ts()
        rows = sorted((r for r in rows if r.ts > seen.get((r.job_id, r.node, r.gpu_index), -math.inf)),
                      key=lambda r: (r.job_id, r.node, r.gpu_index, r.ts))
        if any(r.shared and r.job_id not in self._shared_jobs for r in rows):
            self._shared_jobs |= {r.job_id for r in rows if r.shared}
            metas = self._derived.metas(jobs, facts, now, self._shared_jobs)
        self._tracker.update(batch_from_rows(metas, rows), self.config)
        tracked = {job_id: meta for known in [self._tracker.jobs()] for job_id, meta in metas.items() if job_id in known}
        verdicts = self._tracker.verdicts(tracked, self.config, now)
        found = self._guard_memory(now, jobs, metas, gib, with_missing(verdicts, metas, self.config, now))
        newest = self._trusted_newest(newest, now, lambda: self._tracker.last_ts().values())
        return self._plan(now, newest, jobs, facts, self._guard_conflicts(now, metas, shards, gib, found))

    def _trusted_newest(self, newest: float | None, now: float, judged: Callable[[], Iterable[float]]) -> float | None:
        """The newest sample time the stale guard may trust.

        The store's newest row of any job is used unless it is dated ahead of now + gap_s (a
        node's clock ahead): one such row would keep the guard off for as long as the skew.
        Then the newest of the rows judged this tick (rows dated ahead already dropped) stands
        in: the running jobs' own samples (`judged`, called only then: a dict of every series).
        """
        if newest is None or newest <= now + self.config.gap_s:
            return newest
        return max(judged(), default=None)

    def _judged_rows(self, rows: Sequence[SampleRow], jobs: Sequence[JobInfo], now: float) -> list[SampleRow]:
        """`rows_to_judge` against the jobs' node lists; logged once per node and reason (a few
        per node at most: the set stays as small as the cluster)."""
        # Only the jobs these rows name: it runs twice a tick (the tick's rows, the memory guard's).
        named = {r.job_id for r in rows}
        nodes_of = {j.job_id: frozenset(expand_nodes(j.node_list)) for j in jobs if j.job_id in named and j.node_list}
        kept, dropped = rows_to_judge(rows, nodes_of, now, self.config.gap_s)
        for key in sorted(dropped.keys() - self._dropped_seen):
            LOG.warning("ignoring samples from %s: %s", key[0], dropped[key])
            self._dropped_seen.add(key)
        return kept

    def _late_rows(self, known: set[str], now: float) -> list[SampleRow]:
        """Rows of `known` jobs below the watermark that no tick has read: on a server database
        ids are taken at insert, so a row may commit after a later one was read. Within the last
        ID_OVERLAP ids (and the lookback) only the gaps between the ids read are asked for (the
        ids of all 10,000 rows cost ~0.08 s a tick on MariaDB; the rows themselves 0.2 s); rows of
        other jobs are fetched once and dropped."""
        low, since = self._watermark_id - self.ID_OVERLAP, now - self.config.lookback_s()
        gaps = id_gaps(self._seen_ids, low, self._watermark_id)
        if len(gaps) <= self.MAX_ID_GAPS:
            unseen = self._store.sample_ids_in(gaps, since)
        else:
            unseen = self._store.sample_ids(low, self._watermark_id, since) - self._seen_ids
        if not unseen:
            return []
        rows = self._store.samples_by_id(unseen)  # first: ids marked seen before a read that fails are never read
        self._seen_ids |= unseen
        return [r for r in rows if r.job_id in known]

    def _remember(self, rows: Sequence[SampleRow]) -> None:
        """Move the watermark past `rows` and keep the ids read within ID_OVERLAP below it."""
        self._watermark_id = max([self._watermark_id, *(r.id for r in rows)])
        low = self._watermark_id - self.ID_OVERLAP
        self._seen_ids = {i for i in self._seen_ids if i > low} | {r.id for r in rows if r.id > low}

    def _reclaim_tick(self) -> TickReport:
        standby = self._standby()
        if standby:  # another controller runs reclaim: no listing, no reconcile, no action here
            return TickReport(Assessment(self._clock(), None, False, ()), (), (), (), standby)
        # Live: every tick, so a shrink's hold ends released as soon as its job is PENDING.
        reconciled = () if self._reconciled and self.dry_run else self.reconcile()
        assessment = self._incremental()
        if assessment.stale:
            age = "none" if assessment.newest_sample_ts is None else f"{assessment.now_ts - assessment.newest_sample_ts:.0f}s old"
            raise StaleSamplesError(f"newest GPU sample is {age} (limit {self.config.stale_s:.0f}s): not acting")
        plans = [v.plan for v in assessment.views if isinstance(v.plan, PlannedAction)]
        kept, capped = limit_per_tick(plans, self.config.max_actions_per_tick)
        jobs = {v.job.job_id: v.job for v in assessment.views}
        results = tuple(self._actuator.apply_batch([(plan, jobs[plan.job_id]) for plan in kept]))
        for wait in capped:
            LOG.info("job %s: %s", wait.job_id, wait.reason)
        return TickReport(assessment, reconciled, results, tuple(capped))


@dataclass(frozen=True)
class PublisherHooks:
    """The telemetry publisher as the controller drives it: a tick, a config reload, and its
    latest node listing (the controller's shards-per-GPU inventory reads it: no listing of its own)."""

    tick: PublisherTick
    reload: Callable[[bool], None]  # re-read the policy; the argument: dry-run from now on
    nodes_seen: Callable[[], Sequence[NodeInfo] | None]


def load_publisher(slurm: SlurmCli, db_url: str | None, config_file: str | None, dry_run: bool) -> PublisherHooks | None:
    """The feature/weight publisher (docs/daemons.md), or None (logged) when it is not installed."""
    try:
        from slurm_aigc.telemetry.config import load_scoring_config
        from slurm_aigc.telemetry.publisher import open_publisher
    except ImportError as error:
        LOG.info("publisher not available (%s); running reclaim only", error)
        return None
    publisher = open_publisher(load_scoring_config(config_file), db_url, dry_run=dry_run, slurm=slurm)

    def reload(dry_run: bool) -> None:
        publisher.set_config(load_scoring_config(config_file), dry_run=dry_run)

    # Our loop runs at reclaim.poll_interval_s; the publisher keeps its own scoring.interval_s.
    return PublisherHooks(publisher.tick_when_due, reload, lambda: publisher.last_nodes)


def summary(views: Sequence[JobView]) -> Mapping[str, int]:
    """Count of running GPU jobs per verdict (None as 'ok')."""
    counts: dict[str, int] = {}
    for view in views:
        key = view.verdict.kind or "ok"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _gpu_type_of(gres: str) -> str:
    """`gpu:a100:8(S:0),shard:a100:640` -> `a100` ('' for untyped or no GPUs)."""
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) == 3:
            return parts[1]
    return ""
