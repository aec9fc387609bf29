"""Pure aggregation: allocation records, GPU samples and audit events -> figures per group.

GPU-hours allocated count each run segment's allocation (whole GPUs plus shards as GPU
fractions) inside the report window; a running job counts up to the window end. GPU-hours
used come only from samples; time without samples (jobs without any, and the hours a sampled
job's samples do not cover) is counted apart and left out of efficiency instead of being
taken as idle. Per run segment and hour, used <= sampled <= allocated GPU-seconds.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, tzinfo

from slurm_aigc.policy.model import ClassPolicy, ReclaimConfig
from slurm_aigc.report.records import ActionEvent, SampleSlice
from slurm_aigc.report.sacct import JobRecord, SkippedRow
from slurm_aigc.report.tres import gpu_equivalents, gpu_type_of, holds_shared_fraction
from slurm_aigc.series import GpuSeries, Sample
from slurm_aigc.stats import percentile

GROUP_KEYS = ("user", "account", "partition", "class", "gpu_type", "day")
ALL = "all"
_UTIL_BINS = 60
_ATTRS = ("user", "account", "partition", "class", "gpu_type")
_CLASS = _ATTRS.index("class")
# Samples are capped against the allocation per run segment and clock hour (rollups are hourly).
_CELL_S = 3600.0


@dataclass(frozen=True)
class UsefulRule:
    """Which SM time is work: neither idle nor fake-busy, by the reclaim detector's thresholds.

    Fake-busy is `reclaim.detect`'s rule: utilization >= `busy_util_pct` at power <=
    `low_power_pct` % of the limit (a spinning kernel, a hung collective); idle is utilization
    <= `idle_util_pct`. Build it from `load_policy(...).reclaim.defaults`. Like the detector,
    a sample without a power reading never looks fake-busy (`unjudged` says when that hid one).
    """

    idle_util_pct: float
    busy_util_pct: float
    low_power_pct: float

    @classmethod
    def of(cls, policy: ClassPolicy) -> UsefulRule:
        return cls(policy.idle_util_pct, policy.busy_util_pct, policy.low_power_pct)

    def is_fake_busy(self, util_pct: float, power_w: float | None, limit_w: float | None) -> bool:
        if util_pct < self.busy_util_pct or power_w is None or limit_w is None or limit_w <= 0:
            return False
        return power_w <= self.low_power_pct / 100.0 * limit_w

    def unjudged(self, util_pct: float, power_w: float | None, limit_w: float | None) -> bool:
        """Busy enough to be fake-busy, but without the power reading that would tell."""
        return util_pct >= self.busy_util_pct and (power_w is None or limit_w is None or limit_w <= 0)

    def useful_pct(self, util_pct: float | None, power_w: float | None, limit_w: float | None) -> float | None:
        """The sample's utilization that counts as work (0 when idle or fake-busy; None: unknown)."""
        if util_pct is None:
            return None
        if util_pct <= self.idle_util_pct or self.is_fake_busy(util_pct, power_w, limit_w):
            return 0.0
        return min(util_pct, 100.0)


DEFAULT_USEFUL_RULE = UsefulRule.of(ClassPolicy())


def useful_rules(policy: ReclaimConfig) -> tuple[UsefulRule, dict[str, UsefulRule]]:
    """The defaults' rule and each class's own where it sets other thresholds: a class's
    `busy_util_pct` of 90 makes its 92 % SM at low power fake-busy to reclaim, so to the report too."""
    default = UsefulRule.of(policy.defaults)
    by_class = {name: UsefulRule.of(p) for name, p in policy.classes.items()}
    return default, {name: rule for name, rule in by_class.items() if rule != default}


@dataclass(frozen=True)
class ReportParams:
    """What a report covers and how it groups; `tz` decides day boundaries (None: local)."""

    since_ts: float
    until_ts: float
    group_by: tuple[str, ...] = ()
    # Shards per GPU of each type: the policy's inventory (cli/report.py), the one place they are set.
    shards_per_gpu: Mapping[str, int] = field(default_factory=dict)
    tz: tzinfo | None = None
    useful: UsefulRule = DEFAULT_USEFUL_RULE
    # Classes whose reclaim thresholds differ from the defaults' (`useful_rules`).
    useful_by_class: Mapping[str, UsefulRule] = field(default_factory=dict)

    def useful_for(self, job_class: str) -> UsefulRule:
        return self.useful_by_class.get(job_class, self.useful)


@dataclass(frozen=True)
class GroupFigures:
    """Figures of one group (or of everything, with key ('all',))."""

    key: tuple[str, ...]
    jobs: int
    gpu_jobs: int
    running_jobs: int
    run_segments: int
    gpu_hours_allocated: float
    whole_gpu_hours: float
    shard_gpu_hours: float
    whole_gpu_jobs: int
    shard_jobs: int
    gpu_hours_sampled: float
    gpu_hours_unsampled: float
    jobs_without_samples: int
    gpu_hours_used: float | None
    idle_gpu_hours: float | None
    efficiency: float | None
    gpu_hours_useful: float | None
    useful_efficiency: float | None
    queue_wait_mean_s: float | None
    queue_wait_p95_s: float | None
    jobs_requeued: int
    requeues: int
    jobs_requeued_by_aigc: int
    jobs_shrunk_by_aigc: int
    gpu_hours_recovered: float


@dataclass(frozen=True)
class Report:
    params: ReportParams
    groups: tuple[GroupFigures, ...]
    total: GroupFigures
    util_by_class: Mapping[str, tuple[tuple[float, float], ...]]
    queue_waits_s: tuple[float, ...]
    skipped: tuple[SkippedRow, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _Segment:
    """One run segment as samples join it: allocated time (None: never started), GPUs, group attributes."""

    start_ts: float | None
    end_ts: float
    gpus: float
    attrs: tuple[str, ...]


@dataclass
class _Acc:
    """Running sums of one group (internal, mutable while aggregating)."""

    jobs: set[str] = field(default_factory=set)
    gpu_jobs: set[str] = field(default_factory=set)
    running_jobs: set[str] = field(default_factory=set)
    whole_jobs: set[str] = field(default_factory=set)
    shard_jobs: set[str] = field(default_factory=set)
    segments: int = 0
    whole_gpu_s: float = 0.0
    shard_gpu_s: float = 0.0
    waits_s: array[float] = field(default_factory=lambda: array("d"))
    requeued_jobs: set[str] = field(default_factory=set)
    requeues: int = 0
    used_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0
    unjudged_gpu_s: float = 0.0
    sampled_gpu_s: float = 0.0
    sampled_jobs: set[str] = field(default_factory=set)
    aigc_requeued: set[str] = field(default_factory=set)
    aigc_shrunk: set[str] = field(default_factory=set)
    recovered_gpu_h: float = 0.0


def day_of(ts: float, tz: tzinfo | None) -> str:
    return datetime.fromtimestamp(ts, tz).date().isoformat()


def split_by_day(start_ts: float, end_ts: float, tz: tzinfo | None) -> list[tuple[str, float]]:
    """[start, end) cut at midnights of `tz` -> (day, seconds) pieces."""
    pieces: list[tuple[str, float]] = []
    cursor = start_ts
    while cursor < end_ts:
        today = datetime.fromtimestamp(cursor, tz).date()
        midnight = _midnight(today + timedelta(days=1), tz)
        piece_end = min(end_ts, midnight)
        pieces.append((today.isoformat(), piece_end - cursor))
        cursor = piece_end
    return pieces


def _midnight(day: date, tz: tzinfo | None) -> float:
    return datetime.combine(day, time(0), tz).timestamp()


class Aggregator:
    """Feeds records, then samples, then actions; `result()` gives the report."""

    def __init__(self, params: ReportParams) -> None:
        unknown = [key for key in params.group_by if key not in GROUP_KEYS]
        if unknown:
            raise ValueError(f"cannot group by {', '.join(unknown)}; choose from {', '.join(GROUP_KEYS)}")
        self._p = params
        self._groups: dict[tuple[str, ...], _Acc] = defaultdict(_Acc)
        self._total = _Acc()
        self._job_segments: dict[str, list[_Segment]] = {}
        self._job_alias: dict[str, str] = {}
        # The current job's cells, (segment index, hour, day) -> [known, used, useful, unjudged]
        # GPU-seconds, capped into the sums (`_fold`) once the stream has passed the job.
        self._job: str | None = None
        self._cells: dict[tuple[int, int, str], list[float]] = {}
        # Per passed job, the first and last hour of its folded cells, which no later slice may reach.
        self._folded: dict[str, tuple[int, int]] = {}
        self._folded_span: tuple[int, int] | None = None
        self._days: dict[str, tuple[float, float]] = {}
        self._util_bins: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
        self._skipped: list[SkippedRow] = []
        self._unresolved_shard_jobs: set[str] = set()
        self._foreign_sample_jobs: set[str] = set()
        self._foreign_action_jobs: set[str] = set()
        self._segments: dict[str, int] = {}
        self._last_key: dict[str, tuple[str, ...]] = {}
        # About _UTIL_BINS points per plot, in whole 10 s steps (at least one agent poll).
        self._bin_s = max(10.0, math.ceil((params.until_ts - params.since_ts) / _UTIL_BINS / 10.0) * 10.0)

    # -- records ---------------------------------------------------------------------
    def add_rows(self, rows: Iterable[JobRecord | SkippedRow]) -> None:
        for row in rows:
            if isinstance(row, SkippedRow):
                self._skipped.append(row)
            else:
                self.add_record(row)

    def add_record(self, record: JobRecord) -> None:
        """Count one run segment of one job."""
        job = record.job_id_raw
        attrs = self._attrs(record)
        if record.job_id != job:
            self._job_alias[record.job_id] = job
        whole, shard, resolved = gpu_equivalents(record.tres, self._p.shards_per_gpu, record.node_list)
        if not resolved:
            self._unresolved_shard_jobs.add(job)
        # Samples join the segment they fall in: a requeued job's runs can differ in partition and GPU type.
        end = record.end_ts if record.end_ts is not None else self._p.until_ts
        self._job_segments.setdefault(job, []).append(_Segment(record.start_ts, end, whole + shard, attrs))
        sharing = holds_shared_fraction(record.tres, shard, resolved)
        if not sharing:  # all of a GPU's shards (the hook's whole_as_shards on Slurm 22.05): a whole GPU
            whole, shard = whole + shard, 0.0
        for day, seconds in self._pieces(record):
            key = self._key(attrs, day)
            for acc in (self._groups[key], self._total):
                self._count_piece(acc, record, whole, shard, seconds, sharing)
        self._count_segment(record, attrs)

    def _count_piece(self, acc: _Acc, record: JobRecord, whole: float, shard: float, seconds: float,
                     sharing: bool) -> None:
        job = record.job_id_raw
        acc.jobs.add(job)
        acc.whole_gpu_s += whole * seconds
        acc.shard_gpu_s += shard * seconds
        if whole + shard > 0:
            acc.gpu_jobs.add(job)
        if whole > 0:
            acc.whole_jobs.add(job)
        if sharing:
            acc.shard_jobs.add(job)
        if self._running_at_end(record):
            acc.running_jobs.add(job)

    def _running_at_end(self, record: JobRecord) -> bool:
        until = self._p.until_ts
        started = record.start_ts is not None and record.start_ts < until
        return started and (record.end_ts is None or record.end_ts > until)

    def _count_segment(self, record: JobRecord, attrs: tuple[str, ...]) -> None:
        # Waits and requeues belong to the day the segment started (or was submitted).
        anchor = record.start_ts if record.start_ts is not None else record.submit_ts
        day = day_of(self._clip(anchor if anchor is not None else self._p.since_ts), self._p.tz)
        key = self._key(attrs, day)
        wait = record.queue_wait_s
        started_in_window = record.start_ts is not None and self._p.since_ts <= record.start_ts < self._p.until_ts
        for acc in (self._groups[key], self._total):
            acc.segments += 1
            if wait is not None and started_in_window:
                acc.waits_s.append(wait)
        # With --duplicates every run of a requeued (or preempted and requeued) job is a
        # record of its own; the job's last record seen carries the count.
        self._segments[record.job_id_raw] = self._segments.get(record.job_id_raw, 0) + 1
        self._last_key[record.job_id_raw] = key

    def _pieces(self, record: JobRecord) -> list[tuple[str, float]]:
        """The segment's allocated time inside the window, by day; never empty."""
        if record.start_ts is not None:
            start = max(record.start_ts, self._p.since_ts)
            end = min(record.end_ts if record.end_ts is not None else self._p.until_ts, self._p.until_ts)
            if end > start:
                return split_by_day(start, end, self._p.tz)
        anchor = record.start_ts if record.start_ts is not None else record.submit_ts
        return [(day_of(self._clip(anchor if anchor is not None else self._p.since_ts), self._p.tz), 0.0)]

    def _clip(self, ts: float) -> float:
        return min(max(ts, self._p.since_ts), self._p.until_ts - 1e-3)

    def _attrs(self, record: JobRecord) -> tuple[str, ...]:
        """A job's group attributes in `_ATTRS` order; interned, as thousands of jobs share them."""
        gpu_type = gpu_type_of(record.tres, self._p.shards_per_gpu, record.node_list)
        values = (record.user, record.account, record.partition, record.aigc_class, gpu_type)
        return tuple(sys.intern(value) for value in values)

    def _key(self, attrs: tuple[str, ...], day: str) -> tuple[str, ...]:
        if not self._p.group_by:
            return (ALL,)
        return tuple(day if name == "day" else attrs[_ATTRS.index(name)] for name in self._p.group_by)

    # -- samples ---------------------------------------------------------------------
    def add_slices(self, slices: Iterable[SampleSlice]) -> None:
        """Sum known GPU-seconds of jobs that are in the report per segment and hour; note the others.

        A job's slices come together, as `SampleStore.job_slices` reads them: when the stream
        passes to another job, the job's cells are final and are capped into the sums, so memory
        holds one job's cells, not the period's job-hours. A slice reaching an hour of a job that
        was already capped is a ValueError: capping the hour's parts apart would change the figures.
        """
        for piece in slices:
            job = self._job_alias.get(piece.job_id, piece.job_id)
            segments = self._job_segments.get(job)
            if segments is None:
                self._foreign_sample_jobs.add(piece.job_id)
                continue
            if piece.sm_util_pct is None:
                continue  # unknown utilization: unknown time, neither used nor idle
            index = _segment_at(segments, piece.ts)
            segment = segments[index]
            cell = self._util_bins[segment.attrs[_CLASS]][int((piece.ts - self._p.since_ts) // self._bin_s)]
            cell[0] += piece.sm_util_pct * piece.duration_s
            cell[1] += piece.duration_s
            # A GPU sample covers at most the job's share of that GPU (a shard job: its fraction);
            # a segment without GPU-hours (unresolved shards, no GPUs) has nothing to use.
            share = min(1.0, segment.gpus)
            if share > 0:
                self._add_cells(job, index, share, piece, self._p.useful_for(segment.attrs[_CLASS]))

    def _add_cells(self, job: str, index: int, share: float, piece: SampleSlice, rule: UsefulRule) -> None:
        start = max(piece.ts, self._p.since_ts)
        end = min(piece.ts + piece.duration_s, self._p.until_ts)
        if end <= start:
            return
        if job != self._job:
            self._pass_job(job)
        self._check_not_capped(job, start, end)
        used, useful, unjudged = self._fractions(piece, share, rule)
        for hour, day, seconds in self._cuts(start, end):
            sums = self._cells.get((index, hour, day))
            if sums is None:
                sums = self._cells[(index, hour, day)] = [0.0, 0.0, 0.0, 0.0]
            sums[0] += share * seconds
            sums[1] += used * seconds
            sums[2] += useful * seconds
            sums[3] += unjudged * seconds

    def _pass_job(self, job: str | None) -> None:
        """The stream moved on to `job` (None: ended): cap the passed job's cells into the sums."""
        passed, cells = self._job, self._cells
        if passed is not None and cells:
            first, last = min(hour for _, hour, _ in cells), max(hour for _, hour, _ in cells)
            before = self._folded.get(passed, (first, last))
            self._folded[passed] = (min(first, before[0]), max(last, before[1]))
            for key, sums in cells.items():  # in the order the stream opened them: the same float sums as capping at the end
                self._fold(passed, key, sums)
        self._job, self._cells = job, {}
        self._folded_span = None if job is None else self._folded.get(job)

    def _check_not_capped(self, job: str, start: float, end: float) -> None:
        span = self._folded_span
        if span is not None and start // _CELL_S <= span[1] and math.ceil(end / _CELL_S) - 1 >= span[0]:
            raise ValueError(f"samples of job {job} out of order: one at {start:.0f} reaches an hour already capped; "
                             "a job's samples must come together, as SampleStore.job_slices reads them")

    @property
    def open_cells(self) -> int:
        """Cells not capped yet: the current job's (see `add_slices`)."""
        return len(self._cells)

    @staticmethod
    def _fractions(piece: SampleSlice, share: float, rule: UsefulRule) -> tuple[float, float, float]:
        """(used, useful, busy-but-unjudged) GPUs of a sample, each at most the job's share of the GPU."""
        util = piece.sm_util_pct or 0.0
        used = min(util / 100.0, share)
        useful = min((rule.useful_pct(util, piece.power_draw_w, piece.power_limit_w) or 0.0) / 100.0, used)
        unjudged = share if rule.unjudged(util, piece.power_draw_w, piece.power_limit_w) else 0.0
        return used, useful, unjudged

    def _cuts(self, start: float, end: float) -> Iterable[tuple[int, str, float]]:
        """[start, end) cut at clock hours and midnights of `tz` -> (hour, day, seconds) pieces."""
        cursor = start
        while cursor < end:
            hour = int(cursor // _CELL_S)
            day, day_end = self._day_at(cursor)
            piece_end = min(end, (hour + 1) * _CELL_S, day_end)
            yield hour, day, piece_end - cursor
            cursor = piece_end

    def _day_at(self, ts: float) -> tuple[str, float]:
        day = sys.intern(day_of(ts, self._p.tz))  # one string per day, not one per cell
        return day, self._day_span(day)[1]

    def _day_span(self, day: str) -> tuple[float, float]:
        span = self._days.get(day)
        if span is None:
            today = date.fromisoformat(day)
            span = self._days[day] = (_midnight(today, self._p.tz), _midnight(today + timedelta(days=1), self._p.tz))
        return span

    def _fold(self, job: str, key: tuple[int, int, str], sums: list[float]) -> None:
        """Cap one cell: sampled <= the segment's allocation in that hour, used <= sampled, useful <= used."""
        index, hour, day = key
        known, used, useful, unjudged = sums
        segment = self._job_segments[job][index]
        if segment.start_ts is None:
            return
        day_start, day_end = self._day_span(day)
        low = max(segment.start_ts, self._p.since_ts, hour * _CELL_S, day_start)
        high = min(segment.end_ts, self._p.until_ts, (hour + 1) * _CELL_S, day_end)
        sampled = min(known, segment.gpus * max(0.0, high - low))
        if sampled <= 0:
            return
        used = min(used, sampled)
        group = self._key(segment.attrs, day)
        for acc in (self._groups[group], self._total):
            acc.sampled_gpu_s += sampled
            acc.used_gpu_s += used
            acc.useful_gpu_s += min(useful, used)
            acc.unjudged_gpu_s += min(unjudged, sampled)
            acc.sampled_jobs.add(job)

    # -- actions ---------------------------------------------------------------------
    def add_actions(self, events: Iterable[ActionEvent]) -> None:
        """Count requeues/shrinks slurm-aigc carried out (done, not dry run)."""
        for event in events:
            if not event.effective:
                continue
            job = self._job_alias.get(event.job_id, event.job_id)
            segments = self._job_segments.get(job)
            if segments is None:
                self._foreign_action_jobs.add(event.job_id)
                continue
            attrs = segments[_segment_at(segments, event.ts)].attrs
            key = self._key(attrs, day_of(self._clip(event.ts), self._p.tz))
            for acc in (self._groups[key], self._total):
                if event.action == "requeue":
                    acc.aigc_requeued.add(job)
                elif event.action == "shrink":
                    acc.aigc_shrunk.add(job)
                acc.recovered_gpu_h += event.gpu_hours_recovered or 0.0

    # -- result ----------------------------------------------------------------------
    def result(self) -> Report:
        for job, count in self._segments.items():
            if count > 1:
                for acc in (self._groups[self._last_key[job]], self._total):
                    acc.requeued_jobs.add(job)
                    acc.requeues += count - 1
        self._pass_job(None)
        groups = tuple(_figures(key, acc) for key, acc in sorted(self._groups.items()))
        waits = tuple(self._total.waits_s)
        return Report(
            params=self._p, groups=groups, total=_figures((ALL,), self._total),
            util_by_class=self._util_series(), queue_waits_s=waits,
            skipped=tuple(self._skipped), notes=tuple(self._notes()),
        )

    def _util_series(self) -> dict[str, tuple[tuple[float, float], ...]]:
        return {
            cls: tuple((self._p.since_ts + index * self._bin_s, total / seconds)
                       for index, (total, seconds) in sorted(bins.items()) if seconds > 0)
            for cls, bins in sorted(self._util_bins.items())
        }

    def _notes(self) -> list[str]:
        shards = ", ".join(f"{t}={n}" for t, n in sorted(self._p.shards_per_gpu.items()))
        notes = [f"shards count as GPU fractions: shards / shards per GPU ({shards})"]
        if self._total.gpu_jobs - self._total.sampled_jobs:
            count = len(self._total.gpu_jobs - self._total.sampled_jobs)
            notes.append(f"{count} GPU job(s) have no samples: their GPU-hours are left out of used/idle/efficiency")
        if self._total.unjudged_gpu_s > 0:
            busy = min([self._p.useful.busy_util_pct, *(r.busy_util_pct for r in self._p.useful_by_class.values())])
            notes.append(f"{self._total.unjudged_gpu_s / 3600:.3f} GPU-hours at >= {busy:g} % SM had no "
                         "power reading (rolled-up hours, GPUs without power): counted as useful, fake-busy or not")
        if self._unresolved_shard_jobs:
            notes.append(f"{len(self._unresolved_shard_jobs)} job(s) hold shards of an unknown GPU type: "
                         "counted as 0 GPU-hours, allocated and used")
        if self._foreign_sample_jobs:
            notes.append(f"samples of {len(self._foreign_sample_jobs)} job(s) outside the selection were not counted")
        if self._foreign_action_jobs:
            notes.append(f"actions on {len(self._foreign_action_jobs)} job(s) outside the selection were not counted")
        if self._skipped:
            notes.append(f"{len(self._skipped)} sacct row(s) skipped (listed on stderr)")
        return notes


def _figures(key: tuple[str, ...], acc: _Acc) -> GroupFigures:
    allocated_h = (acc.whole_gpu_s + acc.shard_gpu_s) / 3600.0
    sampled_h = acc.sampled_gpu_s / 3600.0
    used_h = acc.used_gpu_s / 3600.0 if acc.sampled_jobs else None
    useful_h = acc.useful_gpu_s / 3600.0 if acc.sampled_jobs else None
    return GroupFigures(
        key=key, jobs=len(acc.jobs), gpu_jobs=len(acc.gpu_jobs), running_jobs=len(acc.running_jobs),
        run_segments=acc.segments, gpu_hours_allocated=allocated_h,
        whole_gpu_hours=acc.whole_gpu_s / 3600.0, shard_gpu_hours=acc.shard_gpu_s / 3600.0,
        whole_gpu_jobs=len(acc.whole_jobs), shard_jobs=len(acc.shard_jobs),
        gpu_hours_sampled=sampled_h, gpu_hours_unsampled=max(0.0, allocated_h - sampled_h),
        jobs_without_samples=len(acc.gpu_jobs - acc.sampled_jobs), gpu_hours_used=used_h,
        # used <= sampled per cell (`_fold_cells`): max() only absorbs float rounding.
        idle_gpu_hours=None if used_h is None else max(0.0, sampled_h - used_h),
        efficiency=None if used_h is None or sampled_h <= 0 else used_h / sampled_h,
        gpu_hours_useful=useful_h,
        useful_efficiency=None if useful_h is None or sampled_h <= 0 else useful_h / sampled_h,
        queue_wait_mean_s=sum(acc.waits_s) / len(acc.waits_s) if acc.waits_s else None,
        queue_wait_p95_s=percentile(list(acc.waits_s), 95.0),
        jobs_requeued=len(acc.requeued_jobs), requeues=acc.requeues,
        jobs_requeued_by_aigc=len(acc.aigc_requeued), jobs_shrunk_by_aigc=len(acc.aigc_shrunk),
        gpu_hours_recovered=acc.recovered_gpu_h,
    )


def _segment_at(segments: list[_Segment], ts: float) -> int:
    """The segment whose [start, end) holds `ts`; else the last one started before it, else the first started."""
    before: tuple[float, int] | None = None
    first: tuple[float, int] | None = None
    for index, segment in enumerate(segments):
        start = segment.start_ts
        if start is None:
            continue
        if start <= ts < segment.end_ts:
            return index
        if start <= ts and (before is None or start > before[0]):
            before = (start, index)
        if first is None or start < first[0]:
            first = (start, index)
    # A sample outside every run (clock skew at an edge): the cap against that run's hours decides what counts.
    chosen = before or first
    return chosen[1] if chosen is not None else len(segments) - 1


def build_report(params: ReportParams, rows: Iterable[JobRecord | SkippedRow],
                 slices: Iterable[SampleSlice] = (), actions: Iterable[ActionEvent] = ()) -> Report:
    """Aggregate everything for one report (records first: samples and actions join on them)."""
    aggregator = Aggregator(params)
    aggregator.add_rows(rows)
    aggregator.add_slices(slices)
    aggregator.add_actions(actions)
    return aggregator.result()


@dataclass(frozen=True)
class GpuUse:
    """One GPU of a job over time (the shared `GpuSeries`) and what its samples add up to."""

    series: GpuSeries
    memory_total_mib: float | None
    used_gpu_hours: float
    sampled_hours: float

    @property
    def mean_util_pct(self) -> float | None:
        return None if self.sampled_hours <= 0 else 100.0 * self.used_gpu_hours / self.sampled_hours


@dataclass(frozen=True)
class JobView:
    """`seff` for GPUs: one job's run segments, GPU use over time and slurm-aigc's actions."""

    job_id: str
    segments: tuple[JobRecord, ...]
    gpu_hours_allocated: float
    gpus: float
    gpu_type: str
    series: tuple[GpuUse, ...]
    gpu_hours_used: float | None
    efficiency: float | None
    actions: tuple[ActionEvent, ...]
    skipped: tuple[SkippedRow, ...]


def job_view(job_id: str, rows: Iterable[JobRecord | SkippedRow], slices: Iterable[SampleSlice],
             actions: Iterable[ActionEvent], now_ts: float,
             shards_per_gpu: Mapping[str, int] | None = None) -> JobView:
    """Join one job's sacct records (all requeue segments), samples and audit rows."""
    shards_per_gpu = shards_per_gpu or {}
    records, skipped = _split_rows(rows)
    allocated_s = 0.0
    gpus = 0.0
    gpu_type = "none"
    for record in records:
        whole, shard, _ = gpu_equivalents(record.tres, shards_per_gpu, record.node_list)
        if record.start_ts is not None:
            end = record.end_ts if record.end_ts is not None else now_ts
            allocated_s += (whole + shard) * max(0.0, end - record.start_ts)
        if whole + shard > 0:
            gpus, gpu_type = whole + shard, gpu_type_of(record.tres, shards_per_gpu, record.node_list)
    slices = list(slices)
    series = _series(slices)
    # The same figures as `report`: one window over the whole job, shards as their fraction of a GPU.
    total = build_report(ReportParams(0.0, now_ts, shards_per_gpu=shards_per_gpu), records, slices).total
    used_h = total.gpu_hours_used
    if used_h is None and not records and series:
        used_h = sum(s.used_gpu_hours for s in series)  # samples sacct knows no job for: no allocation to cap by
    return JobView(
        job_id=job_id, segments=tuple(records), gpu_hours_allocated=allocated_s / 3600.0, gpus=gpus,
        gpu_type=gpu_type, series=series, gpu_hours_used=used_h, efficiency=total.efficiency,
        actions=tuple(actions), skipped=tuple(skipped),
    )


def _split_rows(rows: Iterable[JobRecord | SkippedRow]) -> tuple[list[JobRecord], list[SkippedRow]]:
    records: list[JobRecord] = []
    skipped: list[SkippedRow] = []
    for row in rows:
        (skipped if isinstance(row, SkippedRow) else records).append(row)  # type: ignore[arg-type]
    records.sort(key=lambda r: r.submit_ts or 0.0)
    return records, skipped


def _series(slices: Iterable[SampleSlice]) -> tuple[GpuUse, ...]:
    grouped: dict[tuple[str, int], list[SampleSlice]] = defaultdict(list)
    for piece in slices:
        grouped[(piece.node, piece.gpu_index)].append(piece)
    result = []
    for (node, index), pieces in sorted(grouped.items()):
        known = [p for p in pieces if p.used_gpu_s is not None]
        totals = [p.memory_total_mib for p in pieces if p.memory_total_mib is not None]
        samples = tuple(Sample(p.ts, p.sm_util_pct, p.memory_used_mib) for p in pieces)
        result.append(GpuUse(
            series=GpuSeries(node, index, samples),
            memory_total_mib=max(totals) if totals else None,
            used_gpu_hours=sum(p.used_gpu_s or 0.0 for p in known) / 3600.0,
            sampled_hours=sum(p.duration_s for p in known) / 3600.0,
        ))
    return tuple(result)
