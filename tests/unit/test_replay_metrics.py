"""Comparison figures from a run's records, on small runs worked out by hand."""

from __future__ import annotations

import pytest

from slurm_aigc.replay.metrics import (
    JobOutcome,
    UsageSample,
    backlog_figures,
    censored_wait_s,
    compute,
    is_harmed,
    is_lost,
    used_gpu_s,
    utilization_timeline,
    window,
    work_done_by,
)
from slurm_aigc.report.figures import DEFAULT_USEFUL_RULE, UsefulRule


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
    # Out of memory on a shared GPU, resubmitted and completed: harmed, as in a backlogged run.
    retried = JobOutcome("6", "infer", 1, 0, 10, 50, "COMPLETED", retried=True, failed_shared=True)
    assert is_harmed(retried) and compute([retried], [], capacity_gpus=1).jobs_harmed == 1
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



# ---------------------------------------------------------------- useful utilization (issue 14.2)

def powered(node: str, gpu: int, rows: list[tuple[float, float]], start: float = 0.0, step: float = 10.0,
            limit: float = 400.0) -> list[UsageSample]:
    """(util %, power W) per 10 s poll."""
    return [UsageSample(start + i * step, node, gpu, u, p, limit) for i, (u, p) in enumerate(rows)]


def test_useful_utilization_leaves_out_fake_busy_and_idle_samples() -> None:
    # GPU 0: 50 s real work at 90 % (350 W), then 50 s hung at 100 % SM and 60 W (15 % of the limit).
    # GPU 1: 100 s idle (0 %), 0.5 % at idle power counts nothing either.
    samples = powered("n1", 0, [(90.0, 350.0)] * 5 + [(100.0, 60.0)] * 5) + powered("n1", 1, [(0.5, 50.0)] * 10)
    runs = [outcome("1", "train", 2, submit=0, start=0, end=100)]
    metrics = compute(runs, samples, capacity_gpus=2)
    assert metrics.used_gpu_s == pytest.approx(50 * 0.9 + 50 * 1.0 + 100 * 0.005)  # the SM figure counts the hang
    assert metrics.useful_gpu_s == pytest.approx(50 * 0.9)  # fails if the fake-busy (or idle) samples counted
    assert metrics.useful_utilization == pytest.approx(45 / 200)
    assert metrics.effective_utilization > 2 * metrics.useful_utilization


def test_useful_thresholds_come_from_the_rule_and_unknown_power_is_never_fake() -> None:
    hung = powered("n1", 0, [(97.0, 100.0)] * 10)  # 25 % of the limit
    assert used_gpu_s(hung, 0, 100, useful=UsefulRule(1.0, 95.0, 30.0)) == 0.0
    assert used_gpu_s(hung, 0, 100, useful=UsefulRule(1.0, 95.0, 20.0)) == pytest.approx(97.0)
    no_power = [UsageSample(i * 10.0, "n1", 0, 99.0) for i in range(10)]
    assert used_gpu_s(no_power, 0, 100, useful=DEFAULT_USEFUL_RULE) == pytest.approx(99.0)


# ---------------------------------------------------------------- backlogged figures (issue 14.1)

def job_run(job_id: str, cls: str, submit: float, start: float | None, end: float | None, state: str = "COMPLETED", *,
            work: float = 0.0, nominal: float | None = None, shared: bool = False, hangs: bool = False,
            requeues: int = 0) -> JobOutcome:
    return JobOutcome(job_id, cls, 1.0, submit, start, end, state, requeues, None, work, nominal, hangs, shared, start)


def test_backlog_figures_count_only_the_window() -> None:
    t0 = 1000.0
    runs = [
        job_run("1", "infer", t0, t0, t0 + 40, work=30.0, nominal=40.0, shared=True),  # 1.0x
        job_run("2", "infer", t0, t0 + 10, t0 + 70, work=30.0, nominal=40.0, shared=True),  # 1.5x
        job_run("3", "train", t0, t0 + 20, t0 + 90, work=200.0, nominal=60.0),
        job_run("4", "train", t0 + 30, t0 + 80, t0 + 130, "CANCELLED by 0", work=500.0),  # cut at the end: not done
        job_run("5", "train", t0 + 50, None, t0 + 100, "CANCELLED by 0", work=500.0),  # never started: waits 50 s
        job_run("6", "infer", t0 + 5, t0 + 6, t0 + 96, "TIMEOUT", nominal=40.0, shared=True),  # sharing timeout
        job_run("7", "train", t0 + 5, t0 + 6, t0 + 66, "TIMEOUT", nominal=40.0, shared=True, hangs=True),  # its own hang
        job_run("8", "infer", t0 + 1, t0 + 2, t0 + 50, "FAILED", requeues=1),  # requeued then failed: harmed
        # Requeued (idle tail, work done), pending again when the runner cancelled it at the end;
        # sacct's whole seconds put that cancel at or just before the window's end: not harm.
        job_run("9", "imagegen", t0 + 3, t0 + 4, t0 + 99.4, "CANCELLED by 0", requeues=1),
        job_run("10", "imagegen", t0 + 3, t0 + 4, t0 + 100, "CANCELLED by 0", requeues=1),
    ]
    samples = powered("n1", 0, [(80.0, 300.0)] * 10 + [(100.0, 50.0)] * 5, start=t0) + powered("n1", 0, [(90.0, 300.0)], start=t0 + 150)
    figures = backlog_figures(runs, samples, capacity_gpus=4, start_ts=t0, duration_s=100.0, backlog=4, gpu_hours_reclaimed=0.5)
    assert (figures.submitted, figures.completed) == (10, 3)
    assert figures.work_completed_gpu_s == 260.0
    assert figures.used_gpu_s == pytest.approx(80.0)  # 100 s at 80 %; the sample after the window is cut
    assert figures.useful_gpu_s == pytest.approx(80.0) and figures.useful_utilization == pytest.approx(80 / 400)
    waits = [0, 10, 20, 50, 50, 1, 1, 1, 1, 1]
    assert figures.mean_wait_s == pytest.approx(sum(waits) / len(waits))
    train = next(w for w in figures.waits if w.job_class == "train")
    assert (train.jobs, train.started) == (4, 3) and train.mean_wait_s == pytest.approx((20 + 50 + 50 + 1) / 4)
    assert figures.shared_completed == 2
    assert figures.shared_slowdown_median == pytest.approx(1.25) and figures.shared_slowdown_p95 == pytest.approx(1.5)
    assert figures.shared_timeouts == 1
    assert (figures.jobs_harmed, figures.jobs_requeued) == (1, 3)
    assert (figures.harmed_jobs, figures.sharing_timeout_jobs) == (("8 FAILED",), ("6",))  # named in compare.json
    assert figures.to_dict()["backlog"] == 4


def test_an_idle_tail_job_counts_as_done_once_its_work_is_past_not_once_its_tail_ends() -> None:
    # Counting only jobs that ended credited a shorter idle tail as more work: at D stock Slurm
    # holds more finished-but-idle jobs than a run whose reclaim ends their tails.
    from dataclasses import replace
    t0, d = 1000.0, 100.0
    in_tail = replace(job_run("1", "infer", t0, t0 + 10, t0 + d, "CANCELLED by 0", work=30.0), work_end_s=40.0,
                      first_end_ts=t0 + d)  # work done at t0 + 50, idle until cancelled at D
    too_late = replace(job_run("2", "infer", t0, t0 + 70, t0 + d, "CANCELLED by 0", work=30.0), work_end_s=40.0,
                       first_end_ts=t0 + d)  # its work would be done at t0 + 110
    cut_short = replace(job_run("3", "infer", t0, t0 + 5, t0 + 60, work=7.0, requeues=1), work_end_s=40.0,
                        first_end_ts=t0 + 20)  # requeued 15 s in (its work half done); the rerun plays nothing
    reclaimed = replace(job_run("4", "infer", t0, t0 + 5, t0 + 80, work=11.0, requeues=1), work_end_s=40.0,
                        first_end_ts=t0 + 70)  # requeued in its tail: its work was done
    figures = backlog_figures([in_tail, too_late, cut_short, reclaimed], [], 4, t0, d, 4)
    assert (figures.completed, figures.work_completed_gpu_s) == (2, 30.0 + 11.0)
    assert (work_done_by(in_tail, t0 + d), work_done_by(too_late, t0 + d)) == (True, False)
    assert (work_done_by(cut_short, t0 + d), work_done_by(reclaimed, t0 + d)) == (False, True)


def test_backlog_useful_utilization_drops_the_hung_stretch_inside_the_window() -> None:
    samples = powered("n1", 0, [(100.0, 40.0)] * 10, start=0.0)  # hung all along
    figures = backlog_figures([], samples, capacity_gpus=1, start_ts=0.0, duration_s=100.0, backlog=2)
    assert figures.effective_utilization == pytest.approx(1.0) and figures.useful_utilization == 0.0
    with pytest.raises(ValueError):
        backlog_figures([], [], capacity_gpus=1, start_ts=0.0, duration_s=0.0, backlog=2)


def test_refused_and_lost_jobs_neither_stretch_the_window_nor_wait_in_the_queue() -> None:
    ran = outcome("1", "infer", 1, submit=0, start=0, end=100)
    refused = outcome("refused:j2", "infer", 0, submit=10, start=None, end=None, state="REFUSED")
    lost = outcome("3", "train", 0, submit=20, start=None, end=None, state="LOST")
    assert window([ran, refused, lost], now_ts=400) == (0, 100)  # not until the collection's now
    assert window([ran, outcome("4", "x", 1, 30, 40, None, state="RUNNING")], now_ts=400) == (0, 400)
    assert censored_wait_s(refused, 300) is None  # never queued: harmed, not waiting
    assert censored_wait_s(lost, 300) == 280  # from its own submit, not the window's start
