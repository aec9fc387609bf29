"""Comparison figures from a run's records, on small runs worked out by hand."""

from __future__ import annotations

import pytest

from slurm_aigc.replay.metrics import (
    JobOutcome,
    UsageSample,
    compute,
    is_harmed,
    is_lost,
    used_gpu_s,
    utilization_timeline,
    window,
)


def outcome(job_id: str, cls: str, gpus: float, submit: float, start: float | None, end: float | None,
            state: str = "COMPLETED", requeues: int = 0, allocated: float | None = None) -> JobOutcome:
    return JobOutcome(job_id, cls, gpus, submit, start, end, state, requeues, allocated)


def series(node: str, gpu: int, utils: list[float], start: float = 0.0, step: float = 10.0) -> list[UsageSample]:
    return [UsageSample(start + i * step, node, gpu, u) for i, u in enumerate(utils)]


RUN = [
    outcome("1", "infer", 1, submit=0, start=0, end=100),
    outcome("2", "infer", 0.5, submit=10, start=30, end=70),
    outcome("3", "train", 4, submit=20, start=60, end=200),
    outcome("4", "train", 2, submit=50, start=150, end=180, state="FAILED", requeues=1),
]


def test_a_small_run_gives_the_hand_worked_figures() -> None:
    samples = series("n1", 0, [100.0] * 10) + series("n1", 1, [50.0] * 20)
    metrics = compute(RUN, samples, capacity_gpus=8, gpu_hours_reclaimed=0.25)
    assert (metrics.window_start_ts, metrics.window_end_ts, metrics.makespan_s) == (0, 200, 200)
    allocated = 1 * 100 + 0.5 * 40 + 4 * 140 + 2 * 30
    assert metrics.allocated_gpu_s == pytest.approx(allocated)
    assert metrics.allocation_ratio == pytest.approx(allocated / (8 * 200))
    used = 100 * 1.0 + 200 * 0.5  # GPU 0 busy for 100 s, GPU 1 half busy for 200 s
    assert metrics.used_gpu_s == pytest.approx(used)
    assert metrics.effective_utilization == pytest.approx(used / 1600)
    waits = [0, 20, 40, 100]
    assert metrics.mean_wait_s == pytest.approx(sum(waits) / 4)
    assert metrics.p95_wait_s == 100
    infer, train = metrics.waits
    assert (infer.job_class, infer.mean_wait_s, infer.p95_wait_s) == ("infer", 10.0, 20.0)
    assert (train.job_class, train.mean_wait_s, train.p95_wait_s) == ("train", 70.0, 100.0)
    assert metrics.completed == 3
    assert metrics.jobs_per_hour == pytest.approx(3 / (200 / 3600))
    assert (metrics.jobs_harmed, metrics.jobs_lost, metrics.jobs_requeued) == (1, 0, 1)
    assert metrics.gpu_hours_reclaimed == 0.25
    assert metrics.to_dict()["waits"][0]["job_class"] == "infer"


def test_runner_given_allocation_wins_over_start_end() -> None:
    metrics = compute([outcome("1", "infer", 1, 0, 0, 100, allocated=250.0)], [], capacity_gpus=4)
    assert metrics.allocated_gpu_s == 250.0


def test_lost_and_unfinished_jobs() -> None:
    runs = [
        outcome("1", "infer", 1, 0, 0, 50),
        outcome("2", "infer", 1, 5, 10, None, state="RUNNING"),
        outcome("3", "train", 2, 5, None, None, state="LOST"),
        outcome("4", "train", 1, 5, 20, 40, state="CANCELLED by 0", requeues=0),
    ]
    metrics = compute(runs, [], capacity_gpus=2, now_ts=80)
    assert metrics.window_end_ts == 80
    assert metrics.allocated_gpu_s == pytest.approx(50 + 70 + 0 + 20)  # the running job counts until now
    assert (metrics.jobs_lost, metrics.jobs_harmed) == (2, 2)
    assert not is_harmed(runs[3])  # cancelled but never requeued by us
    assert is_lost(outcome("5", "x", 1, 0, None, None, state=""))
    assert window([], None) == (None, None)


def test_used_gpu_seconds_respects_gaps_window_and_sharing() -> None:
    gap = [UsageSample(0, "n", 0, 100), UsageSample(300, "n", 0, 100)]
    assert used_gpu_s(gap, 0, 400, max_gap_s=60) == pytest.approx(60 + 60)  # a gap is not use
    clipped = series("n", 0, [100.0] * 10)
    assert used_gpu_s(clipped, 25, 55) == pytest.approx(30)
    shared = [UsageSample(0, "n", 0, 70), UsageSample(0, "n", 0, 60), UsageSample(10, "n", 0, 0)]
    assert used_gpu_s(shared, 0, 20) == pytest.approx(10)  # two jobs on one GPU cap at 100 %


def test_utilization_timeline_bins() -> None:
    samples = series("n", 0, [100.0] * 5) + series("n", 1, [0.0] * 5)
    points = utilization_timeline(samples, capacity_gpus=2, start=0, end=100, bin_s=50)
    assert [t for t, _ in points] == [0, 50]
    assert [u for _, u in points] == pytest.approx([0.5, 0.0])
    assert utilization_timeline(samples, 2, 10, 10) == []


def test_empty_run_and_bad_capacity() -> None:
    metrics = compute([], [], capacity_gpus=4)
    assert (metrics.makespan_s, metrics.effective_utilization, metrics.mean_wait_s) == (0.0, 0.0, None)
    with pytest.raises(ValueError, match="capacity_gpus"):
        compute(RUN, [], capacity_gpus=0)

