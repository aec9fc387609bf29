"""The controller's incremental tracker gives the verdicts `detect` gives over the full window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_aigc.reclaim.config import ClassPolicy, ReclaimConfig
from slurm_aigc.reclaim.detect import GpuSeries, JobMeta, JobWindow, Sample, batch_from_jobs, detect
from slurm_aigc.reclaim.tracker import StretchTracker

POLICY = ClassPolicy(grace_s=20.0, window_s=40.0, min_samples=3)
CONFIG = ReclaimConfig(poll_interval_s=10.0, gap_intervals=2.0, defaults=POLICY)
START = 0.0
READINGS = {
    "idle": (0.0, 0.0, 55.0),
    "held": (0.0, 9000.0, 60.0),
    "busy": (97.0, 9000.0, 350.0),
    "fake": (100.0, 9000.0, 70.0),
    "none": (None, None, None),
}

# One step: for every GPU, a reading kind; "skip" leaves a hole (no sample) for that GPU.
# Steps come in runs so that windows long enough for a verdict are common.
step = st.lists(st.sampled_from([*READINGS, "skip"]), min_size=1, max_size=3)
runs = st.lists(st.tuples(step, st.integers(1, 9)), min_size=1, max_size=5).map(
    lambda parts: [kinds for kinds, repeat in parts for _ in range(repeat)])


def samples_of(steps: list[list[str]], n_gpus: int) -> list[list[Sample]]:
    per_gpu: list[list[Sample]] = [[] for _ in range(n_gpus)]
    for t, kinds in enumerate(steps):
        ts = START + 10.0 * t
        for gpu in range(n_gpus):
            kind = kinds[gpu % len(kinds)]
            if kind != "skip":
                util, memory, power = READINGS[kind]
                per_gpu[gpu].append(Sample(ts, util, memory, power, 400.0))
    return per_gpu


def window(meta: JobMeta, per_gpu: list[list[Sample]], lo: float, hi: float) -> JobWindow:
    return JobWindow(meta, tuple(GpuSeries("n1", g, tuple(s for s in samples if lo < s.ts <= hi))
                                 for g, samples in enumerate(per_gpu)))


@settings(max_examples=200, deadline=None)
@given(steps=runs, n_gpus=st.integers(1, 3), chunk=st.integers(1, 4))
def test_tracker_matches_full_detection(steps: list[list[str]], n_gpus: int, chunk: int) -> None:
    meta = JobMeta("9", "train", START, n_gpus)
    per_gpu = samples_of(steps, n_gpus)
    tracker = StretchTracker()
    lo = -1.0
    for end in range(chunk - 1, len(steps) + chunk - 1, chunk):
        hi = START + 10.0 * min(end, len(steps) - 1)
        tracker.update(batch_from_jobs([window(meta, per_gpu, lo, hi)]), CONFIG)
        full = batch_from_jobs([window(meta, per_gpu, -1.0, hi)])
        now = hi + 5.0
        expected = detect(full, {}, POLICY, now, CONFIG.gap_s)
        got = tracker.verdicts({"9": meta}, CONFIG, now)
        assert [(v.kind, v.since_ts, v.gpus_used, v.reason) for v in got] == \
            [(v.kind, v.since_ts, v.gpus_used, v.reason) for v in expected]
        lo = hi


def test_prune_forgets_finished_jobs_and_earlier_runs() -> None:
    per_gpu = samples_of([["idle"]] * 10, 1)
    tracker = StretchTracker()
    meta = JobMeta("9", "train", START, 1)
    tracker.update(batch_from_jobs([window(meta, per_gpu, -1.0, 90.0)]), CONFIG)
    tracker.prune({"9": meta}, oldest_ts=0.0)
    assert tracker.jobs() == {"9"}
    tracker.prune({"9": JobMeta("9", "train", 200.0, 1)}, oldest_ts=0.0)  # requeued: a new run
    assert len(tracker) == 0
    tracker.update(batch_from_jobs([window(meta, per_gpu, -1.0, 90.0)]), CONFIG)
    tracker.prune({}, oldest_ts=0.0)
    assert tracker.verdicts({}, CONFIG, 100.0) == []
