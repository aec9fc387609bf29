"""One tick of reclaim: gather jobs and samples, judge, plan, act (plus the publisher's tick).

The controller never acts on data it cannot trust: slurmctld not answering
(SlurmCommandError) or the database down (DatabaseError) fail the tick, and samples older
than `stale_s` raise StaleSamplesError; the daemon loop then backs off and retries. Intents
left open by a killed controller are reconciled before the first action.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_aigc.errors import AigcError
from slurm_aigc.reclaim.actuator import ActionResult, Actuator
from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.detect import (
    GpuSeries,
    JobMeta,
    JobWindow,
    Sample,
    Verdict,
    batch_from_jobs,
    detect,
    no_samples_verdict,
)
from slurm_aigc.reclaim.jobs import (
    gpu_count,
    is_gpu_job,
    job_facts,
    start_ts,
    uses_shards,
)
from slurm_aigc.reclaim.ladder import (
    JobFacts,
    PlannedAction,
    Wait,
    limit_per_tick,
    plan_job,
)
from slurm_aigc.reclaim.store import ReclaimStore, SampleRow
from slurm_aigc.slurm import JobInfo, SlurmCli

LOG = logging.getLogger(__name__)


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


def windows_from_rows(jobs: Sequence[JobInfo], rows: Sequence[SampleRow], now_ts: float) -> list[JobWindow]:
    """Group sample rows (sorted by job, node, GPU, time) into one JobWindow per job."""
    by_job: dict[str, list[GpuSeries]] = {}
    shared_jobs: set[str] = set()
    for (job_id, node, gpu), group in itertools.groupby(rows, key=lambda r: (r.job_id, r.node, r.gpu_index)):
        samples = []
        for row in group:
            samples.append(Sample(row.ts, row.sm_util_pct, row.memory_used_mib, row.power_draw_w, row.power_limit_w))
            if row.shared:
                shared_jobs.add(job_id)
        by_job.setdefault(job_id, []).append(GpuSeries(node, gpu, tuple(samples)))
    return [
        JobWindow(job_meta(job, now_ts, job.job_id in shared_jobs), tuple(by_job.get(job.job_id, ())))
        for job in jobs
    ]


def job_meta(job: JobInfo, now_ts: float, shared: bool = False) -> JobMeta:
    facts_class = job_facts(job, now_ts).job_class
    shards = uses_shards(job)
    started = start_ts(job)
    return JobMeta(job.job_id, facts_class, now_ts if started is None else started,
                   None if shards else gpu_count(job), shared or shards)


def judge(windows: Sequence[JobWindow], config: ReclaimConfig, now_ts: float) -> dict[str, Verdict]:
    """Verdicts by job id: the vectorised detectors for jobs with samples, 'no samples' for the rest."""
    batch = batch_from_jobs(windows)
    verdicts = {v.job_id: v for v in detect(batch, config.classes, config.defaults, now_ts, config.gap_s)}
    for window in windows:
        if window.meta.job_id not in verdicts:
            verdicts[window.meta.job_id] = no_samples_verdict(window.meta, config.policy_for(window.meta.job_class), now_ts)
    return verdicts


class Controller:
    """Reclaim's tick; construct with fakes in tests (`SlurmCli(runner=...)`, in-memory DB)."""

    def __init__(
        self,
        slurm: SlurmCli,
        store: ReclaimStore,
        config: ReclaimConfig,
        *,
        dry_run: bool | None = None,
        clock: Callable[[], float] = time.time,
        actuator: Actuator | None = None,
        publisher_tick: Callable[[], object] | None = None,
        only_jobs: frozenset[str] | None = None,
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

    def set_config(self, config: ReclaimConfig) -> None:
        """Use a new, already validated config from the next tick on (SIGHUP)."""
        self.config = config
        self._actuator.config = config

    def reconcile(self) -> tuple[ActionResult, ...]:
        """Close intents a killed controller left open (once, before the first action)."""
        results = tuple(self._actuator.reconcile())
        self._reconciled = True
        return results

    def assess(self) -> Assessment:
        """Read Slurm and the database, judge every running GPU job and plan its next step."""
        now = self._clock()
        jobs = [j for j in self._slurm.jobs() if j.state == "RUNNING" and is_gpu_job(j)
                and (self._only_jobs is None or j.job_id in self._only_jobs)]
        newest = self._store.newest_sample_ts()
        stale = bool(jobs) and (newest is None or now - newest > self.config.stale_s)
        rows = self._store.samples([j.job_id for j in jobs], now - self.config.lookback_s()) if jobs else []
        verdicts = judge(windows_from_rows(jobs, rows, now), self.config, now)
        history = self._store.history(j.job_id for j in jobs)
        views = []
        for job in jobs:
            facts = job_facts(job, now)
            plan = plan_job(verdicts[job.job_id], facts, history.get(job.job_id, ()), self.config, now, self.dry_run)
            views.append(JobView(job, facts, verdicts[job.job_id], plan))
        return Assessment(now, newest, stale, tuple(views))

    def tick(self) -> TickReport:
        """One cycle: reclaim, then the publisher; the first error is raised after both ran."""
        errors: list[Exception] = []
        report = self._guard(self._reclaim_tick, errors)
        if self._publisher_tick is not None:
            self._guard(self._publisher_tick, errors)
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

    def _reclaim_tick(self) -> TickReport:
        reconciled = () if self._reconciled else self.reconcile()
        assessment = self.assess()
        if assessment.stale:
            age = "none" if assessment.newest_sample_ts is None else f"{assessment.now_ts - assessment.newest_sample_ts:.0f}s old"
            raise StaleSamplesError(f"newest GPU sample is {age} (limit {self.config.stale_s:.0f}s): not acting")
        plans = [v.plan for v in assessment.views if isinstance(v.plan, PlannedAction)]
        kept, capped = limit_per_tick(plans, self.config.max_actions_per_tick)
        jobs = {v.job.job_id: v.job for v in assessment.views}
        results = tuple(self._actuator.apply(plan, jobs[plan.job_id]) for plan in kept)
        for wait in capped:
            LOG.info("job %s: %s", wait.job_id, wait.reason)
        return TickReport(assessment, reconciled, results, tuple(capped))


def load_publisher_tick(slurm: SlurmCli, store_factory: Any, config_file: str | None, dry_run: bool) -> Callable[[], object] | None:
    """The telemetry publisher's tick, or None (logged) when that part is not installed."""
    try:
        from slurm_aigc.telemetry.config import load_scoring_config
        from slurm_aigc.telemetry.publisher import Publisher
        from slurm_aigc.telemetry.store import TelemetryStore
    except ImportError as error:
        LOG.info("publisher not available (%s); running reclaim only", error)
        return None
    publisher = Publisher(slurm, TelemetryStore(store_factory), load_scoring_config(config_file), dry_run=dry_run)
    return publisher.tick


def summary(views: Sequence[JobView]) -> Mapping[str, int]:
    """Count of running GPU jobs per verdict (None as 'ok')."""
    counts: dict[str, int] = {}
    for view in views:
        key = view.verdict.kind or "ok"
        counts[key] = counts.get(key, 0) + 1
    return counts
