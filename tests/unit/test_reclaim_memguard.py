"""The memory guard: a shard job above its shards' GiB is requeued, its neighbour never."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slurm_aigc.db import JobGpuSample, open_database, transaction
from slurm_aigc.reclaim.config import ClassPolicy, ReclaimConfig
from slurm_aigc.reclaim.controller import Controller
from slurm_aigc.reclaim.detect import JobMeta, JobWindow
from slurm_aigc.reclaim.memguard import judge_memory, trailing_over
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.series import GpuSeries, Sample
from slurm_aigc.slurm import SlurmCli
from tests.fakes.slurm import FakeJob, FakeNode, FakeSlurm

from .test_reclaim_controller import START, Clock

GIB = 1024.0
# Busy jobs (never idle): only the memory guard can judge them. One shard = 1 GiB on a100.
CONFIG = ReclaimConfig(dry_run=False, poll_interval_s=10.0, cooldown_s=30.0, over_memory_samples=3,
                       defaults=ClassPolicy(grace_s=10.0, window_s=60.0, min_samples=3),
                       shards_per_gpu={"a100": 80}, gib_per_shard={"a100": 1.0})
NODES = {"a100-01": "gpu:a100:2(S:0),shard:a100:160(S:0)"}


def window(memory_gib: list[float | None], step: float = 10.0, gpus: int = 1) -> JobWindow:
    samples = tuple(Sample(START + i * step, 90.0, None if m is None else m * GIB / gpus, 300.0, 400.0)
                    for i, m in enumerate(memory_gib))
    series = tuple(GpuSeries("a100-01", g, samples) for g in range(gpus))
    return JobWindow(JobMeta("9", "infer", START, None, True), series)


def judge(memory_gib: list[float | None], now_offset: float | None = None, step: float = 10.0,
          gpus: int = 1) -> str | None:
    now = START + (len(memory_gib) - 1) * step + (now_offset or 0.0)
    found = judge_memory(window(memory_gib, step, gpus), 20 * GIB, 3, now, 20.0, allowance_mib=0.0)
    return None if found is None else found.kind


def test_three_polls_in_a_row_above_the_shards_gib_is_over_memory() -> None:
    assert judge([10, 30, 30, 30]) == "over_memory"
    assert judge([30, 30]) is None  # too few samples
    assert judge([30, 30, 10, 30, 30]) is None  # a dip under the limit restarts the count
    assert judge([20, 20, 20, 20]) is None  # exactly the limit is allowed
    assert judge([30, 30, None, 30, 30]) is None  # an unreadable poll never condemns
    assert judge([30, 30, 30], step=30.0) is None  # holes longer than the gap limit break the run
    assert judge([30, 30, 30], now_offset=25.0) is None  # stale: the newest poll is too old
    assert judge([12, 12, 12], gpus=2) is None and judge([24, 24, 24], gpus=2) == "over_memory"  # sum over GPUs


def test_the_reason_names_the_peak_and_the_limit() -> None:
    found = judge_memory(window([25, 31, 26]), 20 * GIB, 3, START + 20.0, 20.0, allowance_mib=512.0)
    assert found is not None and "31.0 GiB" in found.reason and "20.0 GiB (+ 0.5 GiB allowed" in found.reason
    assert found.since_ts == START and found.gpus_total == 1


def test_no_limit_means_no_verdict() -> None:
    assert judge_memory(window([80, 80, 80]), 0.0, 3, START + 20.0, 20.0, allowance_mib=1024.0) is None


# Measured on an H200 (143,771 MiB, driver 580.159.04) by benchmarks/bench_real_gpu.py: a job of
# 4 of 80 shards (7.02 GiB), run with the TaskProlog's XLA_PYTHON_CLIENT_MEM_FRACTION=0.05, showed
# 7,708 MiB in NVML (JAX's pool plus its CUDA context); a hog without the cap showed 12,898 MiB.
H200_LIMIT_MIB = 143771 * 4 / 80


@pytest.mark.parametrize(("memory_mib", "judged"), [(7708.0, False), (12898.0, True)])
def test_a_job_that_obeys_its_fraction_is_not_judged_for_its_cuda_context(memory_mib: float, judged: bool) -> None:
    samples = tuple(Sample(START + 10.0 * i, 90.0, memory_mib) for i in range(3))
    job = JobWindow(JobMeta("9", "infer", START, None, True), (GpuSeries("h200-01", 0, samples),))
    allowance = ReclaimConfig().over_memory_allowance_mib
    found = judge_memory(job, H200_LIMIT_MIB, 3, START + 20.0, 20.0, allowance_mib=allowance)
    assert (found is not None) is judged


def test_the_allowance_counts_once_per_gpu_of_the_job_on_the_node() -> None:
    # a node limit of 20 GiB over 2 GPUs, plus 1 GiB of context allowance for each GPU: 22 GiB
    assert judge_memory(window([21.5] * 3, gpus=2), 20 * GIB, 3, START + 20.0, 20.0, allowance_mib=GIB) is None
    assert judge_memory(window([22.5] * 3, gpus=2), 20 * GIB, 3, START + 20.0, 20.0, allowance_mib=GIB) is not None


def test_nan_is_never_above() -> None:
    assert trailing_over([(0.0, math.nan), (10.0, 5.0)], 1.0, 20.0) == [(10.0, 5.0)]


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


def add(url: str, job_id: str, until: float, memory_gib: float, start: float = START) -> None:
    """A busy job on GPU 0 of a100-01, shared with its neighbour, sampled every 10 s."""
    with transaction(open_database(url)) as session:
        ts = start
        while ts <= until:
            session.add(JobGpuSample(ts=ts, node="a100-01", job_id=job_id, gpu_index=0, sm_util_pct=60.0,
                                     memory_used_mib=memory_gib * GIB, memory_total_mib=80 * GIB,
                                     power_draw_w=300.0, power_limit_w=400.0, shared=True))
            ts += 10.0


def make(url: str, fake: FakeSlurm, now: float, config: ReclaimConfig = CONFIG) -> tuple[Controller, Clock]:
    clock = Clock(now)
    return Controller(SlurmCli(runner=fake), ReclaimStore(open_database(url)), config, clock=clock), clock


def neighbours() -> FakeSlurm:
    """Job 1 (hog) and job 2 (neighbour), 20 shards each on a100 0; job 3 holds a100 1 whole."""
    jobs = {"1": FakeJob("1", shards=20, admin_comment="aigc_class=infer"),
            "2": FakeJob("2", shards=20, admin_comment="aigc_class=infer"),
            "3": FakeJob("3", gpus=1, gres_detail="gpu:a100:1(IDX:1)")}
    return FakeSlurm([FakeNode(name, gres=gres) for name, gres in NODES.items()], jobs=jobs)


def test_the_offender_is_notified_then_requeued_and_the_neighbour_never(db_url: str) -> None:
    fake = neighbours()
    add(db_url, "1", START + 40.0, 60.0)  # 60 GiB on 20 shards: the hog
    add(db_url, "2", START + 40.0, 18.0)  # within its 20 GiB, failing for lack of memory perhaps
    add(db_url, "3", START + 40.0, 70.0)  # a whole GPU: any amount is its own
    controller, clock = make(db_url, fake, START + 40.0)
    first = controller.tick()
    assert [(r.job_id, r.action, r.state) for r in first.results] == [("1", "notify", "done")]
    views = {v.job.job_id: v.verdict for v in first.assessment.views}
    assert views["1"].kind == "over_memory" and "above its shards' 20.0 GiB" in views["1"].reason
    assert views["2"].kind is None and views["3"].kind is None
    clock.now += 40.0
    add(db_url, "1", START + 80.0, 60.0, start=START + 50.0)
    add(db_url, "2", START + 80.0, 18.0, start=START + 50.0)
    add(db_url, "3", START + 80.0, 70.0, start=START + 50.0)
    second = controller.tick()
    assert [(r.job_id, r.action, r.state) for r in second.results] == [("1", "requeue", "done")]
    assert fake.jobs["1"].restarts == 1 and fake.jobs["2"].restarts == 0 and fake.jobs["2"].state == "RUNNING"
    assert not any(c[-1] in {"2", "3"} for c in fake.mutations())
    keys = [r.observation_key for r in ReclaimStore(open_database(db_url)).audit()]
    assert keys == ["1/r0/over_memory/0:notify", "1/r0/over_memory/1:requeue"]


def test_a_short_peak_is_not_acted_on(db_url: str) -> None:
    fake = neighbours()
    add(db_url, "1", START + 10.0, 10.0)
    add(db_url, "1", START + 30.0, 60.0, start=START + 20.0)  # two polls over, then back
    add(db_url, "1", START + 40.0, 10.0, start=START + 40.0)
    controller, _ = make(db_url, fake, START + 40.0)
    report = controller.tick()
    assert report.results == () and fake.mutations() == []


def test_dry_run_and_full_assessment_agree(db_url: str) -> None:
    fake = neighbours()
    add(db_url, "1", START + 40.0, 60.0)
    add(db_url, "2", START + 40.0, 18.0)
    controller, _ = make(db_url, fake, START + 40.0)
    controller.dry_run = True
    assessed = {v.job.job_id: v.verdict.kind for v in controller.assess().views}
    assert assessed == {"1": "over_memory", "2": None, "3": None}
    report = controller.tick()
    assert [(r.job_id, r.state) for r in report.results] == [("1", "skipped")] and fake.mutations() == []


def test_without_gib_per_shard_nothing_is_judged(db_url: str) -> None:
    fake = neighbours()
    add(db_url, "1", START + 40.0, 60.0)
    controller, _ = make(db_url, fake, START + 40.0, ReclaimConfig(
        dry_run=False, poll_interval_s=10.0, defaults=CONFIG.defaults, shards_per_gpu={"a100": 80}))
    assert controller.tick().results == ()


def test_rows_another_node_wrote_for_a_job_cannot_get_it_requeued(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # Any agent may insert rows (one database role): rows naming t4-07 for job 1, which runs on
    # a100-01 only, are forged or mislabelled, and must not make it over its memory.
    fake = neighbours()
    add(db_url, "1", START + 40.0, 10.0)  # its own node: within its 20 GiB
    with transaction(open_database(db_url)) as session:
        for i in range(5):
            session.add(JobGpuSample(ts=START + i * 10.0, node="t4-07", job_id="1", gpu_index=0, sm_util_pct=60.0,
                                     memory_used_mib=70 * GIB, memory_total_mib=80 * GIB, power_draw_w=300.0,
                                     power_limit_w=400.0, shared=True))
    controller, clock = make(db_url, fake, START + 40.0)
    with caplog.at_level("WARNING"):
        for _ in range(3):
            report = controller.tick()
            assert report.results == () and fake.mutations() == []
            clock.now += 10.0
    assert {v.job.job_id: v.verdict.kind for v in controller.assess().views}["1"] is None
    warned = [r.getMessage() for r in caplog.records if "ignoring samples from t4-07" in r.getMessage()]
    assert warned == ["ignoring samples from t4-07: rows for job 1, which does not run there"]


def test_rows_dated_ahead_of_the_controllers_clock_are_not_judged() -> None:
    from slurm_aigc.reclaim.controller import rows_to_judge
    from slurm_aigc.reclaim.store import SampleRow

    def row(ts: float, node: str = "a100-01", job: str = "1") -> SampleRow:
        return SampleRow(1, job, node, 0, ts, 0.0, 0.0, 30.0, 400.0, False)

    now = START + 100.0
    kept, dropped = rows_to_judge([row(now - 10.0), row(now + 15.0), row(now + 3600.0), row(now, node="b")],
                                  {"1": frozenset({"a100-01"})}, now, 20.0)
    assert [r.ts for r in kept] == [now - 10.0, now + 15.0]  # a few seconds of skew is tolerated
    assert dropped == {("a100-01", "ahead"): "rows dated 3600 s ahead of this host's clock",
                       ("b", "foreign"): "rows for job 1, which does not run there"}
