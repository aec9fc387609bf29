"""Pure detectors: a job's recent GPU samples and its class policy in, a verdict out.

Every detector looks at the *trailing stretch* of each GPU series: the newest samples,
going back until a sample that does not match, a gap longer than `gap_s`, or the end of
the class's start-up grace. A stretch at least `window_s` long with at least
`min_samples` samples is evidence. Missing readings (None/NaN) match nothing, so a gap or
an unreadable field can never make a GPU look idle; one busy sample (a burst) ends the
stretch. Verdicts, most wasteful first:

- idle: every GPU of the job has had utilization and memory near zero for the window;
- memory_held: every GPU near-zero utilization for the window, some still holding memory;
- fake_busy: every GPU either near-idle or "busy" at low power (a hung collective);
- over_allocated: a multi-GPU job whose GPUs are all observed for the window, some of
  them near-zero utilization all along: `gpus_used` is how many it really needs.

The math runs on NumPy columns for many jobs at once (one tick judges 10,000 jobs), so
`detect` takes a `SampleBatch`; `detect_job` judges one job for tests and `idle explain`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from slurm_aigc.reclaim.config import ClassPolicy
from slurm_aigc.series import GpuSeries as GpuSeries  # the one per-GPU series; re-exported
from slurm_aigc.series import Sample as Sample

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class JobMeta:
    """What the detectors need to know about a job besides its samples."""

    job_id: str
    job_class: str
    start_ts: float
    gpus_allocated: int | None = None  # None: unknown (e.g. shards), do not check coverage
    shared: bool = False  # GPUs shared with other jobs (shards): never judged over-allocated


@dataclass(frozen=True)
class JobWindow:
    """A job and its GPU series: the input of `detect_job`."""

    meta: JobMeta
    series: tuple[GpuSeries, ...]


@dataclass(frozen=True)
class SampleBatch:
    """Samples of many jobs as columns, sorted by job, then GPU, then time.

    Series `s` holds samples `series_offsets[s]:series_offsets[s+1]`; job `j` holds series
    `job_offsets[j]:job_offsets[j+1]`. Every job has at least one series and every series
    at least one sample (jobs without samples are judged by the caller: no evidence).
    """

    metas: tuple[JobMeta, ...]
    job_offsets: IntArray
    series_offsets: IntArray
    series_node: tuple[str, ...]
    series_gpu: tuple[int, ...]
    ts: FloatArray
    util: FloatArray
    memory: FloatArray
    power: FloatArray
    power_limit: FloatArray


@dataclass(frozen=True)
class GpuEvidence:
    """What one GPU did over the job's window (the last `window_s` of its samples)."""

    node: str
    gpu_index: int
    samples: int
    first_ts: float
    last_ts: float
    max_util_pct: float | None
    max_memory_mib: float | None
    mean_power_pct: float | None
    idle_s: float  # trailing stretch of near-zero utilization (memory ignored)
    wasted_s: float  # trailing stretch of near-zero or fake (low-power) utilization


@dataclass(frozen=True)
class Verdict:
    """A job's verdict at `now_ts`: `kind` None means no finding (`reason` says why)."""

    job_id: str
    job_class: str
    kind: str | None
    reason: str
    now_ts: float
    window_s: float
    since_ts: float | None  # start of the stretch that proves the verdict
    gpus_total: int
    gpus_used: int | None  # over_allocated: GPUs the job really uses
    gpus: tuple[GpuEvidence, ...]


def batch_from_jobs(jobs: Sequence[JobWindow]) -> SampleBatch:
    """Columns from per-job series; series without samples and jobs without series are dropped."""
    metas: list[JobMeta] = []
    job_offsets, series_offsets = [0], [0]
    nodes: list[str] = []
    gpus: list[int] = []
    rows: list[Sample] = []
    for job in jobs:
        kept = [s for s in job.series if s.samples]
        if not kept:
            continue
        metas.append(job.meta)
        for series in kept:
            nodes.append(series.node)
            gpus.append(series.gpu_index)
            rows.extend(sorted(series.samples, key=lambda sample: sample.ts))
            series_offsets.append(len(rows))
        job_offsets.append(len(nodes))
    return SampleBatch(
        metas=tuple(metas),
        job_offsets=np.asarray(job_offsets, dtype=np.int64),
        series_offsets=np.asarray(series_offsets, dtype=np.int64),
        series_node=tuple(nodes),
        series_gpu=tuple(gpus),
        ts=_column([r.ts for r in rows]),
        util=_column([r.sm_util_pct for r in rows]),
        memory=_column([r.memory_used_mib for r in rows]),
        power=_column([r.power_draw_w for r in rows]),
        power_limit=_column([r.power_limit_w for r in rows]),
    )


def _column(values: Sequence[float | None]) -> FloatArray:
    return np.asarray([math.nan if v is None else v for v in values], dtype=np.float64)


def detect_job(job: JobWindow, policy: ClassPolicy, now_ts: float, gap_s: float) -> Verdict:
    """The verdict for one job (same rules as `detect`)."""
    batch = batch_from_jobs([job])
    if not batch.metas:
        return no_samples_verdict(job.meta, policy, now_ts)
    return detect(batch, {job.meta.job_class: policy}, policy, now_ts, gap_s)[0]


def no_samples_verdict(meta: JobMeta, policy: ClassPolicy, now_ts: float) -> Verdict:
    """A running GPU job with no samples at all: nothing can be said (never idle)."""
    return Verdict(meta.job_id, meta.job_class, None, "no samples", now_ts, policy.window_s, None,
                   meta.gpus_allocated or 0, None, ())


@dataclass(frozen=True)
class _Params:
    """Per-job policy values as arrays (one entry per job)."""

    grace_end: FloatArray
    window: FloatArray
    min_samples: IntArray
    idle_util: FloatArray
    idle_memory: FloatArray
    busy_util: FloatArray
    low_power: FloatArray

    @staticmethod
    def of(metas: Sequence[JobMeta], policies: Mapping[str, ClassPolicy], default: ClassPolicy) -> _Params:
        chosen = [policies.get(m.job_class, default) for m in metas]
        return _Params(
            grace_end=np.asarray([m.start_ts + p.grace_s for m, p in zip(metas, chosen)], dtype=np.float64),
            window=np.asarray([p.window_s for p in chosen], dtype=np.float64),
            min_samples=np.asarray([p.min_samples for p in chosen], dtype=np.int64),
            idle_util=np.asarray([p.idle_util_pct for p in chosen], dtype=np.float64),
            idle_memory=np.asarray([p.idle_memory_mib for p in chosen], dtype=np.float64),
            busy_util=np.asarray([p.busy_util_pct for p in chosen], dtype=np.float64),
            low_power=np.asarray([p.low_power_pct / 100.0 for p in chosen], dtype=np.float64),
        )


PREDICATES = ("covered", "idle", "held", "wasted")


@dataclass(frozen=True)
class Stretches:
    """Per GPU series: the span of its samples and the trailing stretch of each predicate.

    Predicates: `covered` (any counted sample), `idle` (util and memory near zero), `held`
    (util near zero), `wasted` (util near zero, or high at low power). `start_ts[p]` is NaN
    when the newest sample does not match `p`; `whole[p]` says the stretch spans every
    sample seen, without a gap, so it may continue an older stretch (`extend`).
    """

    first_ts: FloatArray
    last_ts: FloatArray
    start_ts: Mapping[str, FloatArray]
    count: Mapping[str, IntArray]
    whole: Mapping[str, BoolArray]

    def take(self, rows: IntArray) -> Stretches:
        """The series at positions `rows` (a reordering or subset)."""
        return Stretches(self.first_ts[rows], self.last_ts[rows], {p: v[rows] for p, v in self.start_ts.items()},
                         {p: v[rows] for p, v in self.count.items()}, {p: v[rows] for p, v in self.whole.items()})

    def duration_s(self, predicate: str) -> FloatArray:
        return np.nan_to_num(self.last_ts - self.start_ts[predicate], nan=0.0)


def stretches(batch: SampleBatch, policies: Mapping[str, ClassPolicy], default: ClassPolicy, gap_s: float) -> Stretches:
    """The trailing stretches of every series of `batch` (pure; the costly part of a tick)."""
    params = _Params.of(batch.metas, policies, default)
    series_of_job = np.repeat(np.arange(len(batch.metas)), np.diff(batch.job_offsets))
    job_of_sample = np.repeat(series_of_job, np.diff(batch.series_offsets))
    first, last = batch.series_offsets[:-1], batch.series_offsets[1:] - 1
    # A new stretch may begin at a series' first sample or after a gap; grace samples never count.
    breaks = np.ones(len(batch.ts), dtype=np.bool_)
    breaks[1:] = np.diff(batch.ts) > gap_s
    breaks[first] = True
    counted = batch.ts >= _per_sample(params.grace_end, job_of_sample)
    util_low = batch.util <= _per_sample(params.idle_util, job_of_sample)
    memory_low = batch.memory <= _per_sample(params.idle_memory, job_of_sample)
    fake = (batch.util >= _per_sample(params.busy_util, job_of_sample)) & (
        batch.power <= _per_sample(params.low_power, job_of_sample) * batch.power_limit
    )
    matches = {
        "covered": counted,
        "idle": counted & util_low & memory_low,
        "held": counted & util_low,
        "wasted": counted & (util_low | fake),
    }
    start_ts, count, whole = {}, {}, {}
    for name, match in matches.items():
        start = _trailing_start(match, breaks, first, last)
        count[name] = last - start + 1
        start_ts[name] = np.where(count[name] > 0, batch.ts[np.minimum(start, last)], np.nan)
        whole[name] = start == first
    return Stretches(batch.ts[first], batch.ts[last], start_ts, count, whole)


def extend(older: Stretches, newer: Stretches, gap_s: float) -> Stretches:
    """Stretches over older + newer samples of the same series (same order), from their summaries.

    `newer` must hold only samples after `older.last_ts`. A newer stretch that spans all
    its samples continues the older one when no gap separates them; otherwise it restarts.
    """
    joined = (newer.first_ts - older.last_ts) <= gap_s
    start_ts, count, whole = {}, {}, {}
    for name in PREDICATES:
        continues = joined & newer.whole[name] & (older.count[name] > 0)
        start_ts[name] = np.where(continues, older.start_ts[name], newer.start_ts[name])
        count[name] = np.where(continues, older.count[name] + newer.count[name], newer.count[name])
        whole[name] = continues & older.whole[name]
    return Stretches(older.first_ts, newer.last_ts, start_ts, count, whole)


def detect(
    batch: SampleBatch,
    policies: Mapping[str, ClassPolicy],
    default: ClassPolicy,
    now_ts: float,
    gap_s: float,
) -> list[Verdict]:
    """Verdicts for every job of `batch` at `now_ts`, in batch order, with full evidence."""
    found = stretches(batch, policies, default, gap_s)
    params = _Params.of(batch.metas, policies, default)
    window_s = np.repeat(params.window, np.diff(batch.job_offsets))
    evidence = _evidence(batch, window_s, found)
    return judge(batch.metas, batch.job_offsets, found, policies, default, now_ts, gap_s, evidence)


def judge(
    metas: Sequence[JobMeta],
    job_offsets: IntArray,
    found: Stretches,
    policies: Mapping[str, ClassPolicy],
    default: ClassPolicy,
    now_ts: float,
    gap_s: float,
    evidence: Sequence[GpuEvidence],
) -> list[Verdict]:
    """Verdicts from stretches: job `j` owns series `job_offsets[j]:job_offsets[j+1]` (never empty)."""
    params = _Params.of(metas, policies, default)
    series_of_job = np.repeat(np.arange(len(metas)), np.diff(job_offsets))
    fresh = (now_ts - found.last_ts) <= gap_s
    window_s = params.window[series_of_job]
    ok = {name: fresh & (found.duration_s(name) >= window_s) & (found.count[name] >= params.min_samples[series_of_job])
          for name in PREDICATES}
    job_first = job_offsets[:-1]
    # Plain lists for the per-job loop: indexing NumPy arrays one element at a time cost ~0.05 s
    # a tick over 10,000 jobs.
    all_ok = {name: np.logical_and.reduceat(value, job_first).tolist() for name, value in ok.items()}
    unused = np.add.reduceat(ok["held"].astype(np.int64), job_first).tolist()
    since = {name: np.fmax.reduceat(found.start_ts[name], job_first).tolist() for name in PREDICATES}
    columns = _JobColumns(job_offsets.tolist(), params.window.tolist(), params.grace_end.tolist())
    return [
        _verdict(j, metas[j], columns, now_ts, all_ok, unused[j], since, evidence)
        for j in range(len(metas))
    ]


@dataclass(frozen=True)
class _JobColumns:
    """Per job (offsets: per job and one more), as plain lists."""

    offsets: list[int]
    window: list[float]
    grace_end: list[float]


def bare_evidence(found: Stretches, nodes: Sequence[str], gpus: Sequence[int]) -> list[GpuEvidence]:
    """Evidence from stretches alone (the controller's incremental path keeps no readings)."""
    columns = (found.count["covered"].tolist(), found.first_ts.tolist(), found.last_ts.tolist(),
               found.duration_s("held").tolist(), found.duration_s("wasted").tolist())
    return [GpuEvidence(node, gpu, n, t0, t1, None, None, None, held, wasted)
            for node, gpu, n, t0, t1, held, wasted in zip(nodes, gpus, *columns)]


def _per_sample(per_job: FloatArray, job_of_sample: IntArray) -> FloatArray | float:
    # Most ticks judge jobs of few classes; a scalar spares a gather over every sample.
    if len(per_job) and bool(np.all(per_job == per_job[0])):
        return float(per_job[0])
    return per_job[job_of_sample]


def _trailing_start(match: BoolArray, breaks: BoolArray, first: IntArray, last: IntArray) -> IntArray:
    """Per series, the index where its trailing stretch of `match` begins (last + 1: empty)."""
    # The stretch starts after the newest non-matching sample, or at the newest gap break:
    # find the newest such "cut" at or before each series' last sample (cuts are sorted).
    cut_at = np.flatnonzero(breaks | ~match)
    cut_start = cut_at + ~match[cut_at]
    # Every series' first sample is a break, so the cut found always lies inside the series.
    return np.asarray(cut_start[np.searchsorted(cut_at, last, side="right") - 1], dtype=np.int64)


def _evidence(batch: SampleBatch, window_s: FloatArray, found: Stretches) -> list[GpuEvidence]:
    first, last = batch.series_offsets[:-1], batch.series_offsets[1:] - 1
    lengths = np.diff(batch.series_offsets)
    in_window = batch.ts >= np.repeat(batch.ts[last] - window_s, lengths)
    # The window is a suffix of each series: count its samples to find where it begins.
    count = np.add.reduceat(in_window.astype(np.int64), first)
    window_first = last - count + 1
    power_pct = 100.0 * batch.power / batch.power_limit
    columns = (
        count.tolist(),
        batch.ts[window_first].tolist(),
        batch.ts[last].tolist(),
        _optional(_masked_max(batch.util, in_window, first)),
        _optional(_masked_max(batch.memory, in_window, first)),
        _optional(_masked_mean(power_pct, in_window, first)),
        found.duration_s("held").tolist(),
        found.duration_s("wasted").tolist(),
    )
    return [GpuEvidence(*fields) for fields in zip(batch.series_node, batch.series_gpu, *columns)]


def _masked_max(values: FloatArray, mask: BoolArray, first: IntArray) -> FloatArray:
    return np.fmax.reduceat(np.where(mask, values, np.nan), first)


def _masked_mean(values: FloatArray, mask: BoolArray, first: IntArray) -> FloatArray:
    usable = mask & ~np.isnan(values)
    total = np.add.reduceat(np.where(usable, values, 0.0), first)
    count = np.add.reduceat(usable.astype(np.int64), first)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _optional(values: FloatArray) -> list[float | None]:
    """Rounded readings as plain floats; NaN (nothing readable) becomes None."""
    return [None if math.isnan(v) else v for v in np.round(values, 2).tolist()]


_KIND_STRETCH = {"idle": "idle", "memory_held": "held", "fake_busy": "wasted", "over_allocated": "covered"}


def _verdict(
    j: int,
    meta: JobMeta,
    columns: _JobColumns,
    now_ts: float,
    all_ok: Mapping[str, Sequence[bool]],
    unused: int,
    since: Mapping[str, Sequence[float]],
    evidence: Sequence[GpuEvidence],
) -> Verdict:
    lo, hi = columns.offsets[j], columns.offsets[j + 1]
    n_gpus = hi - lo
    window_s = columns.window[j]
    kind, reason, used = _classify(meta, n_gpus, all_ok, j, unused, now_ts, columns.grace_end[j], window_s)
    since_ts = since[_KIND_STRETCH[kind]][j] if kind else None
    return Verdict(meta.job_id, meta.job_class, kind, reason, now_ts, window_s, since_ts,
                   max(n_gpus, meta.gpus_allocated or 0), used, tuple(evidence[lo:hi]))


def _classify(
    meta: JobMeta, n_gpus: int, all_ok: Mapping[str, Sequence[bool]], j: int, unused: int,
    now_ts: float, grace_end: float, window_s: float,
) -> tuple[str | None, str, int | None]:
    if meta.gpus_allocated and n_gpus < meta.gpus_allocated:
        return None, f"samples for {n_gpus} of {meta.gpus_allocated} GPUs", None
    if now_ts < grace_end:
        return None, f"start-up grace for {grace_end - now_ts:.0f}s more", None
    if all_ok["idle"][j]:
        return "idle", f"utilization and memory near zero on all {n_gpus} GPU(s) for {window_s:.0f}s", None
    if all_ok["held"][j]:
        return "memory_held", f"utilization near zero on all {n_gpus} GPU(s) for {window_s:.0f}s, memory held", None
    if all_ok["wasted"][j]:
        return "fake_busy", f"utilization high at low power (or idle) on all {n_gpus} GPU(s) for {window_s:.0f}s", None
    if not all_ok["covered"][j]:
        return None, f"window not covered yet: need {window_s:.0f}s of fresh samples without gaps", None
    if n_gpus >= 2 and 0 < unused < n_gpus and not meta.shared:
        used = n_gpus - unused
        return "over_allocated", f"{unused} of {n_gpus} GPUs unused for {window_s:.0f}s; uses {used}", used
    return None, "in use", None
