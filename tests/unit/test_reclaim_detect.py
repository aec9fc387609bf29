"""Detectors on synthetic sample series, including the boundaries (grace end, gaps, bursts)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from slurm_aigc.reclaim.config import ClassPolicy
from slurm_aigc.reclaim.detect import (
    GpuSeries,
    JobMeta,
    JobWindow,
    Sample,
    batch_from_jobs,
    detect,
    detect_job,
)

POLICY = ClassPolicy(grace_s=100.0, window_s=60.0, min_samples=5, idle_util_pct=1.0,
                     idle_memory_mib=500.0, busy_util_pct=90.0, low_power_pct=25.0)
INTERVAL = 10.0
GAP = 2 * INTERVAL
START = 1000.0
GRACE_END = START + POLICY.grace_s

Reading = tuple[float | None, float | None, float | None]  # util, memory, power (limit 400 W)
IDLE: Reading = (0.0, 0.0, 55.0)
HELD: Reading = (0.0, 60000.0, 70.0)
BUSY: Reading = (97.0, 60000.0, 350.0)
FAKE: Reading = (100.0, 60000.0, 80.0)


def series(gpu: int, t0: float, t1: float, reading: Callable[[float], Reading] | Reading,
           step: float = INTERVAL) -> GpuSeries:
    samples = []
    for ts in np.arange(t0, t1 + 1e-9, step):
        util, memory, power = reading(float(ts)) if callable(reading) else reading
        samples.append(Sample(float(ts), util, memory, power, 400.0))
    return GpuSeries("a100-01", gpu, tuple(samples))


def job(*gpus: GpuSeries, allocated: int | None = None, job_class: str = "train", shared: bool = False) -> JobWindow:
    return JobWindow(JobMeta("42", job_class, START, allocated if allocated is not None else len(gpus), shared), gpus)


def verdict_at(window: JobWindow, now: float) -> str | None:
    return detect_job(window, POLICY, now, GAP).kind


def test_idle_job_is_idle_once_window_after_grace_is_covered() -> None:
    # Samples from job start; only samples at or after the grace end count.
    window = job(series(0, START, GRACE_END + 60.0, IDLE))
    assert verdict_at(window, GRACE_END + 60.0) == "idle"


def test_grace_end_exactly_is_the_first_counted_sample() -> None:
    one_short = job(series(0, START, GRACE_END + 50.0, IDLE))
    assert verdict_at(one_short, GRACE_END + 50.0) is None
    verdict = detect_job(job(series(0, START, GRACE_END + 60.0, IDLE)), POLICY, GRACE_END + 60.0, GAP)
    assert verdict.since_ts == GRACE_END


def test_inside_grace_no_verdict_even_after_long_idle() -> None:
    policy = ClassPolicy(grace_s=1000.0, window_s=60.0, min_samples=5)
    verdict = detect_job(job(series(0, START, START + 500.0, IDLE)), policy, START + 500.0, GAP)
    assert verdict.kind is None
    assert "grace" in verdict.reason


def test_min_samples_required_even_when_window_is_long_enough() -> None:
    # 3 samples spanning 60 s (every 30 s, gap limit 40 s) cover the window but are too few.
    window = job(series(0, GRACE_END, GRACE_END + 60.0, IDLE, step=30.0))
    assert detect_job(window, POLICY, GRACE_END + 60.0, 40.0).kind is None
    assert detect_job(window, ClassPolicy(grace_s=100.0, window_s=60.0, min_samples=3), GRACE_END + 60.0, 40.0).kind == "idle"


def test_gap_breaks_the_window() -> None:
    before = series(0, GRACE_END, GRACE_END + 40.0, IDLE)
    after = series(0, GRACE_END + 70.0, GRACE_END + 110.0, IDLE)  # 30 s hole > 20 s gap limit
    gapped = job(GpuSeries("a100-01", 0, before.samples + after.samples))
    assert verdict_at(gapped, GRACE_END + 110.0) is None
    # The same stretch without a hole is idle: the gap alone made the difference.
    assert verdict_at(job(series(0, GRACE_END, GRACE_END + 110.0, IDLE)), GRACE_END + 110.0) == "idle"
    # After the gap, a full window of fresh samples is evidence again.
    later = series(0, GRACE_END + 120.0, GRACE_END + 170.0, IDLE)
    assert verdict_at(job(GpuSeries("a100-01", 0, after.samples + later.samples)), GRACE_END + 170.0) == "idle"


def test_gap_of_exactly_the_limit_does_not_break() -> None:
    window = job(series(0, GRACE_END, GRACE_END + 80.0, IDLE, step=GAP))
    assert detect_job(window, ClassPolicy(grace_s=100.0, window_s=60.0, min_samples=3), GRACE_END + 80.0, GAP).kind == "idle"


def test_stale_series_gives_no_verdict() -> None:
    window = job(series(0, GRACE_END, GRACE_END + 100.0, IDLE))
    assert verdict_at(window, GRACE_END + 100.0 + GAP) == "idle"
    assert verdict_at(window, GRACE_END + 100.0 + GAP + 1.0) is None


def test_burst_inside_idle_window_resets_it() -> None:
    def burst(ts: float) -> Reading:
        return BUSY if ts == GRACE_END + 50.0 else IDLE

    window = job(series(0, GRACE_END, GRACE_END + 100.0, burst))
    assert verdict_at(window, GRACE_END + 100.0) is None
    # The stretch restarts at the first idle sample after the burst (+60 s): a window later it is idle.
    assert verdict_at(job(series(0, GRACE_END, GRACE_END + 110.0, burst)), GRACE_END + 110.0) is None
    assert verdict_at(job(series(0, GRACE_END, GRACE_END + 120.0, burst)), GRACE_END + 120.0) == "idle"


def test_missing_readings_never_count_as_idle() -> None:
    def unreadable(ts: float) -> Reading:
        return (None, None, None) if ts == GRACE_END + 30.0 else IDLE

    assert verdict_at(job(series(0, GRACE_END, GRACE_END + 60.0, unreadable)), GRACE_END + 60.0) is None


def test_memory_held_idle() -> None:
    window = job(series(0, GRACE_END, GRACE_END + 60.0, HELD), series(1, GRACE_END, GRACE_END + 60.0, IDLE))
    verdict = detect_job(window, POLICY, GRACE_END + 60.0, GAP)
    assert verdict.kind == "memory_held"
    assert verdict.gpus[0].max_memory_mib == 60000.0


def test_fake_busy_high_util_low_power() -> None:
    window = job(series(0, GRACE_END, GRACE_END + 60.0, FAKE), series(1, GRACE_END, GRACE_END + 60.0, FAKE))
    verdict = detect_job(window, POLICY, GRACE_END + 60.0, GAP)
    assert verdict.kind == "fake_busy"
    assert verdict.gpus[0].mean_power_pct == 20.0


def test_high_util_at_high_power_is_busy() -> None:
    assert verdict_at(job(series(0, GRACE_END, GRACE_END + 60.0, BUSY)), GRACE_END + 60.0) is None


def test_fake_busy_needs_power_readings() -> None:
    no_power: Reading = (100.0, 60000.0, None)
    assert verdict_at(job(series(0, GRACE_END, GRACE_END + 60.0, no_power)), GRACE_END + 60.0) is None


def test_over_allocated_counts_used_gpus() -> None:
    gpus = [series(0, GRACE_END, GRACE_END + 60.0, BUSY)] + [series(i, GRACE_END, GRACE_END + 60.0, IDLE) for i in (1, 2, 3)]
    verdict = detect_job(job(*gpus), POLICY, GRACE_END + 60.0, GAP)
    assert (verdict.kind, verdict.gpus_used, verdict.gpus_total) == ("over_allocated", 1, 4)


def test_over_allocated_needs_every_gpu_observed() -> None:
    gpus = [series(0, GRACE_END, GRACE_END + 60.0, BUSY), series(1, GRACE_END, GRACE_END + 60.0, IDLE)]
    verdict = detect_job(job(*gpus, allocated=4), POLICY, GRACE_END + 60.0, GAP)
    assert verdict.kind is None
    assert verdict.reason == "samples for 2 of 4 GPUs"


def test_shared_gpus_are_never_over_allocated() -> None:
    gpus = [series(0, GRACE_END, GRACE_END + 60.0, BUSY), series(1, GRACE_END, GRACE_END + 60.0, IDLE)]
    assert detect_job(job(*gpus, shared=True), POLICY, GRACE_END + 60.0, GAP).kind is None


def test_all_gpus_busy_is_in_use() -> None:
    gpus = [series(i, GRACE_END, GRACE_END + 60.0, BUSY) for i in range(2)]
    verdict = detect_job(job(*gpus), POLICY, GRACE_END + 60.0, GAP)
    assert (verdict.kind, verdict.reason) == (None, "in use")


def test_one_idle_gpu_of_an_idle_job_not_enough_when_other_is_held() -> None:
    # idle requires every GPU idle; one GPU holding memory makes the job memory_held instead.
    gpus = [series(0, GRACE_END, GRACE_END + 60.0, IDLE), series(1, GRACE_END, GRACE_END + 60.0, HELD)]
    assert verdict_at(job(*gpus), GRACE_END + 60.0) == "memory_held"


def test_evidence_covers_only_the_window() -> None:
    def early_busy(ts: float) -> Reading:
        return BUSY if ts < GRACE_END + 100.0 else IDLE

    verdict = detect_job(job(series(0, GRACE_END, GRACE_END + 200.0, early_busy)), POLICY, GRACE_END + 200.0, GAP)
    assert verdict.kind == "idle"
    evidence = verdict.gpus[0]
    assert (evidence.samples, evidence.first_ts, evidence.max_util_pct) == (7, GRACE_END + 140.0, 0.0)
    assert evidence.idle_s == 100.0


def test_batch_judges_jobs_independently_with_their_class_policy() -> None:
    strict = ClassPolicy(grace_s=100.0, window_s=1000.0, min_samples=5)
    idle = job(series(0, GRACE_END, GRACE_END + 60.0, IDLE), job_class="train")
    patient = JobWindow(JobMeta("43", "infer", START, 1), idle.series)
    busy = JobWindow(JobMeta("44", "train", START, 1), (series(0, GRACE_END, GRACE_END + 60.0, BUSY),))
    batch = batch_from_jobs([idle, patient, busy])
    verdicts = detect(batch, {"infer": strict}, POLICY, GRACE_END + 60.0, GAP)
    assert [(v.job_id, v.kind) for v in verdicts] == [("42", "idle"), ("43", None), ("44", None)]


def test_job_without_samples_has_no_verdict() -> None:
    verdict = detect_job(job(GpuSeries("a100-01", 0, ()), allocated=1), POLICY, GRACE_END + 60.0, GAP)
    assert (verdict.kind, verdict.reason) == (None, "no samples")


@pytest.mark.parametrize("util,expected", [(1.0, "idle"), (1.5, None)])
def test_idle_threshold_is_inclusive(util: float, expected: str | None) -> None:
    assert verdict_at(job(series(0, GRACE_END, GRACE_END + 60.0, (util, 0.0, 55.0))), GRACE_END + 60.0) == expected
