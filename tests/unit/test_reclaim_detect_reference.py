"""The vectorised detectors against a plain per-sample reference, on random small batches.

The reference walks each GPU's samples back from the newest one, as docs/reclaim.md words
the rules; `detect` and `stretches` must agree with it on every job and GPU: mixed
classes (grace, window, min samples, thresholds), gaps of exactly and over the limit,
repeated timestamps, bursts, unreadable fields, stale and uncovered series.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from slurm_aigc.reclaim.config import ClassPolicy
from slurm_aigc.reclaim.detect import (
    PREDICATES,
    GpuEvidence,
    GpuSeries,
    JobMeta,
    JobWindow,
    Sample,
    Verdict,
    batch_from_jobs,
    detect,
    stretches,
)

GAP = 20.0
END = 1000.0  # the newest poll: most series end here, some a little or a gap earlier
DEFAULT = ClassPolicy(grace_s=10.0, window_s=50.0, min_samples=3)
CLASSES = {
    "train": ClassPolicy(grace_s=30.0, window_s=60.0, min_samples=4),
    "infer": ClassPolicy(grace_s=0.0, window_s=40.0, min_samples=2, idle_util_pct=5.0, idle_memory_mib=100.0,
                         busy_util_pct=80.0, low_power_pct=30.0),
}
READINGS: dict[str, tuple[float | None, float | None, float | None, float | None]] = {
    "idle": (0.0, 0.0, 50.0, 400.0),
    "idle_noisy": (3.0, 80.0, 55.0, 400.0),  # idle for `infer` only
    "held": (0.0, 9000.0, 60.0, 400.0),
    "busy": (97.0, 9000.0, 350.0, 400.0),
    "fake": (100.0, 9000.0, 70.0, 400.0),
    "fake_infer": (85.0, 9000.0, 110.0, 400.0),  # fake busy for `infer` only
    "none": (None, None, None, None),
    "no_util": (None, 0.0, 50.0, 400.0),
    "no_power": (100.0, 9000.0, None, 400.0),
    "no_limit": (100.0, 9000.0, 70.0, None),
}
# Mostly steady polls; sometimes repeated timestamps, the gap limit exactly, or holes.
STEPS = [10.0] * 6 + [0.0, 5.0, GAP, GAP + 5.0]
# Mostly the four patterns the detectors look for, so that windows long enough for a verdict are common.
KINDS = ["idle"] * 3 + ["held"] * 2 + ["fake"] * 2 + ["busy"] * 2 + sorted(set(READINGS) - {"idle", "held", "fake", "busy"})

# A timeline: runs of one reading kind, each polled at one step.
Timeline = list[tuple[str, int, float]]
timelines = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from([1, 2, 4, 7, 9, 12, 20]), st.sampled_from(STEPS)),
                     min_size=1, max_size=4)


def samples_of(timeline: Timeline, end: float) -> list[Sample]:
    """The timeline's samples, the newest at `end`."""
    steps = [(kind, step) for kind, repeat, step in timeline for _ in range(repeat)]
    ts = end - sum(step for _, step in steps[1:])
    samples = []
    for i, (kind, step) in enumerate(steps):
        ts += step if i else 0.0
        samples.append(Sample(ts, *READINGS[kind]))
    return samples


@st.composite
def gpu_series(draw: st.DrawFn, gpu: int, timeline: Timeline, end: float) -> GpuSeries:
    """The job's timeline; or one sample of it changed (a burst) or dropped (a hole); or busy; or another; or none."""
    role = draw(st.sampled_from(["same"] * 4 + ["changed", "dropped", "busy", "own", "none"]))
    if role in ("own", "none"):
        timeline = draw(timelines) if role == "own" else []
    if role == "busy":
        timeline = [("busy", repeat, step) for _, repeat, step in timeline]
    samples = samples_of(timeline, end - draw(st.sampled_from([0.0, 0.0, 5.0, GAP + 5.0])))
    if samples and role in ("changed", "dropped"):
        at = draw(st.integers(0, len(samples) - 1))
        changed = Sample(samples[at].ts, *READINGS[draw(st.sampled_from(KINDS))])
        samples[at:at + 1] = [changed] if role == "changed" else []
    return GpuSeries(f"n{gpu % 2}", gpu, tuple(samples))


@st.composite
def job_window(draw: st.DrawFn, job_id: int) -> JobWindow:
    n_gpus = draw(st.integers(1, 3))
    timeline = draw(timelines)
    series = tuple(draw(gpu_series(gpu, timeline, END)) for gpu in range(n_gpus))
    allocated = draw(st.sampled_from([None] + [n_gpus] * 4 + [n_gpus + 1]))
    meta = JobMeta(str(job_id), draw(st.sampled_from(["train", "infer", "other"])),
                   END - draw(st.sampled_from([60.0, 90.0, 500.0, 500.0])), allocated, draw(st.sampled_from([False, False, True])))
    return JobWindow(meta, series)


@st.composite
def job_batches(draw: st.DrawFn) -> list[JobWindow]:
    return [draw(job_window(j)) for j in range(draw(st.integers(0, 6)))]


# --- the reference: one sample at a time, straight from the documented rules ---


def matches(sample: Sample, policy: ClassPolicy, grace_end: float) -> dict[str, bool]:
    util, memory, power, limit = sample.sm_util_pct, sample.memory_used_mib, sample.power_draw_w, sample.power_limit_w
    counted = sample.ts >= grace_end
    util_low = util is not None and util <= policy.idle_util_pct
    memory_low = memory is not None and memory <= policy.idle_memory_mib
    fake = (util is not None and util >= policy.busy_util_pct and power is not None and limit is not None
            and power <= policy.low_power_pct / 100.0 * limit)
    return {"covered": counted, "idle": counted and util_low and memory_low, "held": counted and util_low,
            "wasted": counted and (util_low or fake)}


def trailing(samples: list[Sample], predicate: str, policy: ClassPolicy, grace_end: float) -> list[Sample]:
    """The newest samples matching `predicate`, back to a non-matching one or a hole."""
    stretch: list[Sample] = []
    for sample in reversed(samples):
        if stretch and stretch[-1].ts - sample.ts > GAP:
            break
        if not matches(sample, policy, grace_end)[predicate]:
            break
        stretch.append(sample)
    return stretch[::-1]


@dataclass
class GpuFacts:
    stretch: dict[str, list[Sample]]
    ok: dict[str, bool]
    evidence: GpuEvidence


def gpu_facts(series: GpuSeries, policy: ClassPolicy, grace_end: float, now: float) -> GpuFacts:
    samples = sorted(series.samples, key=lambda s: s.ts)
    last = samples[-1].ts
    stretch = {p: trailing(samples, p, policy, grace_end) for p in PREDICATES}
    ok = {p: bool(s) and now - last <= GAP and last - s[0].ts >= policy.window_s and len(s) >= policy.min_samples
          for p, s in stretch.items()}
    window = [s for s in samples if s.ts >= last - policy.window_s]
    utils = [s.sm_util_pct for s in window if s.sm_util_pct is not None]
    memories = [s.memory_used_mib for s in window if s.memory_used_mib is not None]
    powers = [100.0 * s.power_draw_w / s.power_limit_w for s in window
              if s.power_draw_w is not None and s.power_limit_w is not None]
    evidence = GpuEvidence(series.node, series.gpu_index, len(window), window[0].ts, last,
                           max(utils, default=None), max(memories, default=None),
                           sum(powers) / len(powers) if powers else None,
                           last - stretch["held"][0].ts if stretch["held"] else 0.0,
                           last - stretch["wasted"][0].ts if stretch["wasted"] else 0.0)
    return GpuFacts(stretch, ok, evidence)


def reference_verdict(job: JobWindow, now: float) -> tuple[str | None, float | None, int | None, int]:
    """(kind, since_ts, gpus_used, gpus_total) for a job with at least one sample."""
    policy = CLASSES.get(job.meta.job_class, DEFAULT)
    grace_end = job.meta.start_ts + policy.grace_s
    gpus = [gpu_facts(s, policy, grace_end, now) for s in job.series if s.samples]
    n, allocated = len(gpus), job.meta.gpus_allocated
    total = max(n, allocated or 0)
    if (allocated and n < allocated) or now < grace_end:
        return None, None, None, total
    for kind, predicate in (("idle", "idle"), ("memory_held", "held"), ("fake_busy", "wasted")):
        if all(g.ok[predicate] for g in gpus):
            return kind, max(g.stretch[predicate][0].ts for g in gpus), None, total
    unused = sum(g.ok["held"] for g in gpus)
    if all(g.ok["covered"] for g in gpus) and n >= 2 and 0 < unused < n and not job.meta.shared:
        return "over_allocated", max(g.stretch["covered"][0].ts for g in gpus), n - unused, total
    return None, None, None, total


# --- the comparisons ---


def judged(jobs: list[JobWindow]) -> list[JobWindow]:
    return [job for job in jobs if any(s.samples for s in job.series)]


def assert_same_evidence(got: GpuEvidence, expected: GpuEvidence) -> None:
    for field in ("node", "gpu_index", "samples", "first_ts", "last_ts", "idle_s", "wasted_s"):
        assert getattr(got, field) == getattr(expected, field), field
    for field in ("max_util_pct", "max_memory_mib", "mean_power_pct"):
        value, want = getattr(got, field), getattr(expected, field)
        assert (value is None) == (want is None), field
        if value is not None and want is not None:
            assert abs(value - want) <= 0.006, field  # detect rounds to 2 decimals


@settings(max_examples=300, deadline=None)
@given(jobs=job_batches(), lag=st.sampled_from([0.0, 5.0, GAP, GAP + 1.0]))
def test_detect_matches_reference(jobs: list[JobWindow], lag: float) -> None:
    batch = batch_from_jobs(jobs)
    now = END + lag
    verdicts: list[Verdict] = detect(batch, CLASSES, DEFAULT, now, GAP)
    kept = judged(jobs)
    assert [v.job_id for v in verdicts] == [job.meta.job_id for job in kept]
    for verdict, job in zip(verdicts, kept):
        event(f"verdict {verdict.kind}")
        assert (verdict.kind, verdict.since_ts, verdict.gpus_used, verdict.gpus_total) == reference_verdict(job, now)
        policy = CLASSES.get(job.meta.job_class, DEFAULT)
        expected = [gpu_facts(s, policy, job.meta.start_ts + policy.grace_s, now).evidence for s in job.series if s.samples]
        assert len(verdict.gpus) == len(expected)
        for got, want in zip(verdict.gpus, expected):
            assert_same_evidence(got, want)


@settings(max_examples=300, deadline=None)
@given(jobs=job_batches())
def test_stretches_match_reference(jobs: list[JobWindow]) -> None:
    found = stretches(batch_from_jobs(jobs), CLASSES, DEFAULT, GAP)
    row = 0
    for job in judged(jobs):
        policy = CLASSES.get(job.meta.job_class, DEFAULT)
        for series in (s for s in job.series if s.samples):
            samples = sorted(series.samples, key=lambda s: s.ts)
            for predicate in PREDICATES:
                stretch = trailing(samples, predicate, policy, job.meta.start_ts + policy.grace_s)
                assert int(found.count[predicate][row]) == len(stretch), predicate
                start = float(found.start_ts[predicate][row])
                assert (start == stretch[0].ts) if stretch else np.isnan(start), predicate
                assert bool(found.whole[predicate][row]) == (len(stretch) == len(samples)), predicate
            row += 1
    assert row == len(found.last_ts)


def test_reference_and_detect_agree_on_one_job_of_each_kind() -> None:
    # The reference itself, checked on plain cases (the random batches give every kind too:
    # see the `event`s with pytest --hypothesis-show-statistics).
    train = CLASSES["train"]
    start = 0.0
    ts = [start + train.grace_s + 10.0 * i for i in range(8)]

    def series(gpu: int, kind: str) -> GpuSeries:
        return GpuSeries("n0", gpu, tuple(Sample(t, *READINGS[kind]) for t in ts))

    jobs = [JobWindow(JobMeta(str(i), "train", start, len(kinds)), tuple(series(g, k) for g, k in enumerate(kinds)))
            for i, kinds in enumerate([["idle"], ["held"], ["fake"], ["busy", "idle"], ["busy"]])]
    now = ts[-1]
    expected = [reference_verdict(job, now)[0] for job in jobs]
    assert expected == ["idle", "memory_held", "fake_busy", "over_allocated", None]
    assert [v.kind for v in detect(batch_from_jobs(jobs), CLASSES, DEFAULT, now, GAP)] == expected


def test_empty_batch_has_no_verdicts() -> None:
    assert detect(batch_from_jobs([]), CLASSES, DEFAULT, 0.0, GAP) == []
