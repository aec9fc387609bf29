"""GPU conflicts: a shard job on a GPU Slurm also gave whole to another job is requeued, the other kept.

The listings are the ones Slurm 22.05.8 printed when it gave GPU 3 of t4-01 whole to a job while
a shard job still ran on it (tests/integration/test_slurm_shards.py reproduces it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_aigc.db import JobGpuSample, open_database, transaction
from slurm_aigc.errors import ConfigError
from slurm_aigc.reclaim.config import ClassPolicy, ReclaimConfig, parse_reclaim_section
from slurm_aigc.reclaim.controller import Controller
from slurm_aigc.reclaim.gpuconflict import (
    GPU_CONFLICT,
    Conflict,
    find_conflicts,
    gpu_holders,
    gpu_memory_mib,
    judge_conflict,
)
from slurm_aigc.reclaim.ladder import PlannedAction
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.slurm import SlurmCli
from slurm_aigc.slurmrecords import JobInfo
from slurm_aigc.validation import Node
from tests.fakes.slurm import FakeJob, FakeNode, FakeSlurm

from .test_reclaim_controller import START, Clock

CONFIG = ReclaimConfig(dry_run=False, poll_interval_s=10.0, cooldown_s=600.0,
                       defaults=ClassPolicy(grace_s=10.0, window_s=60.0, min_samples=3),
                       shards_per_gpu={"t4": 16}, gib_per_shard={"t4": 1.0})


def job(job_id: str, detail: str, node: str = "t4-01", state: str = "RUNNING") -> JobInfo:
    return JobInfo(job_id=job_id, name="j", user="u", account="a", partition="p", qos="normal", state=state,
                   reason="None", node_list=node, batch_flag=True, requeue=True, restarts=0, submit_time=None,
                   start_time=None, end_time=None, time_limit_s=None, comment="", admin_comment="",
                   tres_per_node="", alloc_tres="", num_nodes=1, features="", fields={},
                   gres_detail=((node, detail),) if state == "RUNNING" else ())


def conflicts(jobs: list[JobInfo], judged: tuple[str, ...] | None = None) -> list[tuple[str, str, int, str]]:
    found = find_conflicts(jobs, [j.job_id for j in jobs] if judged is None else judged)
    return [(c.job_id, c.node, c.index, c.other) for c in found]


@pytest.mark.parametrize("shard_detail", ["shard:8(IDX:3)", "shard:t4:8(0/16,0/16,0/16,8/16)"],
                         ids=["22.05", "24.11"])
def test_the_shard_job_on_a_gpu_another_job_holds_whole_conflicts(shard_detail: str) -> None:
    jobs = [job("3041", "gpu:t4:1(IDX:0)"), job("3044", shard_detail), job("3046", "gpu:t4:1(IDX:3)"),
            job("3050", "shard:8(IDX:2)")]
    # never the whole-GPU job, never a shard job on a GPU of its own
    assert conflicts(jobs) == [("3044", "t4-01", 3, "3046")]


def test_only_the_same_gpu_of_the_same_node_of_running_jobs_conflicts() -> None:
    assert conflicts([job("1", "gpu:t4:1(IDX:3)", node="t4-02"), job("2", "shard:8(IDX:3)")]) == []
    assert conflicts([job("1", "gpu:t4:1(IDX:3)", state="PENDING"), job("2", "shard:8(IDX:3)")]) == []
    assert conflicts([job("1", "gpu:t4:2(IDX:2-3)"), job("2", "shard:8(IDX:1)")]) == []
    assert conflicts([job("1", "gpu:t4:2(IDX:2-3)"), job("2", "shard:8(IDX:3)")]) == [("2", "t4-01", 3, "1")]


def test_a_job_outside_the_controllers_scope_is_not_judged() -> None:
    jobs = [job("1", "gpu:t4:1(IDX:3)"), job("2", "shard:8(IDX:3)")]
    assert conflicts(jobs, ("1",)) == []


GIB = 1024.0
T4_MIB = 16 * GIB


@pytest.mark.parametrize(("memory_gib", "pct", "acts"), [
    (15.0, 90.0, True), (14.4, 90.0, True), (14.3, 90.0, False), (None, 90.0, False),
    (2.0, 0.0, True), (None, 0.0, True),
])
def test_it_acts_once_the_two_jobs_fill_the_gpus_memory(memory_gib: float | None, pct: float, acts: bool) -> None:
    clash = Conflict("3044", "t4-01", 3, "3046")
    memory = None if memory_gib is None else memory_gib * GIB
    verdict = judge_conflict(clash, "infer", memory, T4_MIB, pct, START)
    assert (verdict is not None) is acts
    if verdict is not None:
        assert verdict.kind == GPU_CONFLICT and "GPU 3 of t4-01" in verdict.reason and "whole to job 3046" in verdict.reason
        assert memory_gib is None or f"use {memory_gib:.1f} of its 16 GiB" in verdict.reason


@pytest.mark.parametrize("memory_gib", [2.0, None])
def test_a_whole_gpu_job_that_asked_share_no_gets_its_gpu_back_at_once(memory_gib: float | None) -> None:
    clash = Conflict("3044", "t4-01", 3, "3046")
    memory = None if memory_gib is None else memory_gib * GIB
    assert judge_conflict(clash, "infer", memory, T4_MIB, 90.0, START) is None
    verdict = judge_conflict(clash, "infer", memory, T4_MIB, 90.0, START, other_share_no=True)
    assert verdict is not None and verdict.job_id == "3044" and verdict.reason.endswith("job 3046 asked share=no")


def conflict(other_admin_comment: str = "aigc_class=train", other_comment: str = "") -> FakeSlurm:
    """Job 10 holds GPU 3 of t4-01 through shards; Slurm gave the same GPU whole to job 11."""
    jobs = {"10": FakeJob("10", node="t4-01", gpu_type="t4", shards=8, gres_detail="shard:8(IDX:3)",
                          admin_comment="aigc_class=infer"),
            "11": FakeJob("11", node="t4-01", gpu_type="t4", gpus=1, gres_detail="gpu:t4:1(IDX:3)",
                          admin_comment=other_admin_comment, comment=other_comment)}
    return FakeSlurm([FakeNode("t4-01", gres="gpu:t4:4,shard:t4:64")], jobs=jobs)


def make(url: str, fake: FakeSlurm, other_gib: float = 9.0, config: ReclaimConfig = CONFIG) -> Controller:
    """The shard job uses 6 GiB of GPU 3, the whole-GPU job `other_gib` (a t4 has 16 GiB)."""
    with transaction(open_database(url)) as session:
        for ts in (START + 30.0, START + 40.0):
            for job_id, gib in (("10", 6.0), ("11", other_gib)):
                session.add(JobGpuSample(ts=ts, node="t4-01", job_id=job_id, gpu_index=3, sm_util_pct=60.0,
                                         memory_used_mib=gib * GIB, memory_total_mib=T4_MIB,
                                         power_draw_w=50.0, power_limit_w=70.0, shared=job_id == "10"))
    return Controller(SlurmCli(runner=fake), ReclaimStore(open_database(url)), config, clock=Clock(START + 40.0))


def test_while_the_two_fit_nothing_is_done(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = conflict()
    report = make(url, fake, other_gib=4.0).tick()  # 10 of 16 GiB
    assert report.results == () and fake.mutations() == []


def test_share_no_is_read_from_the_stamp_only(tmp_path: Path) -> None:
    """10 of 16 GiB: under the 90 % rule, so only the whole-GPU job's share=no makes it act, and
    only as the hook stamped it: the owner's comment, which they can edit while the job runs,
    must not let them aim a requeue at a neighbour."""
    fake = conflict(other_comment="aigc:type=train,share=no")
    report = make(f"sqlite:///{tmp_path / 'comment.db'}", fake, other_gib=4.0).tick()
    assert report.results == () and fake.mutations() == []
    fake = conflict(other_admin_comment="aigc_class=train aigc_share=no")
    report = make(f"sqlite:///{tmp_path / 'stamp.db'}", fake, other_gib=4.0).tick()
    assert [(r.job_id, r.action, r.state) for r in report.results] == [("10", "requeue", "done")]
    assert fake.jobs["11"].state == "RUNNING" and fake.jobs["11"].restarts == 0
    (row,) = ReclaimStore(open_database(f"sqlite:///{tmp_path / 'stamp.db'}")).audit()
    assert row.detail["message"].endswith("job 11 asked share=no; requeue")


def test_the_shard_job_is_requeued_at_once_and_the_whole_gpu_job_kept(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = conflict()
    report = make(url, fake).tick()
    assert [(r.job_id, r.action, r.state) for r in report.results] == [("10", "requeue", "done")]
    assert fake.jobs["10"].restarts == 1 and fake.jobs["11"].state == "RUNNING" and fake.jobs["11"].restarts == 0
    assert not any(c[-1] == "11" for c in fake.mutations())
    (row,) = ReclaimStore(open_database(url)).audit()
    assert row.observation_key == "10/r0/gpu_conflict/0:requeue"
    assert row.gpu_hours_recovered is None  # the GPU goes to the job holding it: no waste ended


def test_an_earlier_steps_cooldown_does_not_delay_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = conflict()
    store = ReclaimStore(open_database(url))  # a notify for idleness 10 s ago: its cool-down runs
    row = store.record_intent(PlannedAction("10/r0/idle/0:notify", "10", "u", "a", "infer", "idle", "notify", 0, False,
                                            0, 0, 0, None, "m"), {}, START + 30.0)
    assert row is not None
    store.record_outcome(row, "done", {}, START + 30.0)
    report = make(url, fake).tick()
    assert [(r.job_id, r.action) for r in report.results] == [("10", "requeue")]


def test_dry_run_only_records(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = conflict()
    controller = make(url, fake)
    controller.dry_run = True
    assert {v.job.job_id: v.verdict.kind for v in controller.assess().views} == {"10": GPU_CONFLICT, "11": None}
    report = controller.tick()
    assert [(r.job_id, r.state) for r in report.results] == [("10", "skipped")] and fake.mutations() == []


def test_every_job_on_the_gpu_counts_when_two_shard_jobs_are_left(tmp_path: Path) -> None:
    """22.05 gives a GPU whole beside two shard jobs as well (measured: three sharing, one ended).
    Each shard job and the whole-GPU job fit as a pair (5 + 5.5 of 16 GiB), all three do not
    (15.5 GiB, past 90 %): both shard jobs are requeued, the whole-GPU job kept."""
    jobs = {"10": FakeJob("10", node="t4-01", gpu_type="t4", shards=5, gres_detail="shard:5(IDX:3)",
                          admin_comment="aigc_class=infer"),
            "12": FakeJob("12", node="t4-01", gpu_type="t4", shards=5, gres_detail="shard:5(IDX:3)",
                          admin_comment="aigc_class=infer"),
            "11": FakeJob("11", node="t4-01", gpu_type="t4", gpus=1, gres_detail="gpu:t4:1(IDX:3)",
                          admin_comment="aigc_class=train")}
    fake = FakeSlurm([FakeNode("t4-01", gres="gpu:t4:4,shard:t4:64")], jobs=jobs)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with transaction(open_database(url)) as session:
        for ts in (START + 30.0, START + 40.0):
            for job_id, gib in (("10", 5.0), ("12", 5.0), ("11", 5.5)):
                session.add(JobGpuSample(ts=ts, node="t4-01", job_id=job_id, gpu_index=3, sm_util_pct=60.0,
                                         memory_used_mib=gib * GIB, memory_total_mib=T4_MIB,
                                         power_draw_w=50.0, power_limit_w=70.0, shared=job_id != "11"))
    controller = Controller(SlurmCli(runner=fake), ReclaimStore(open_database(url)), CONFIG, clock=Clock(START + 40.0))
    report = controller.tick()
    assert sorted((r.job_id, r.action, r.state) for r in report.results) == [("10", "requeue", "done"),
                                                                             ("12", "requeue", "done")]
    assert fake.jobs["11"].state == "RUNNING" and fake.jobs["11"].restarts == 0
    assert all("use 15.5 of its 16 GiB" in row.detail["message"] for row in ReclaimStore(open_database(url)).audit())


def test_the_gpus_holders_are_every_running_job_on_it() -> None:
    listing = [job("1", "gpu:t4:1(IDX:3)"), job("2", "shard:5(IDX:3)"), job("3", "shard:5(IDX:3)"),
               job("4", "shard:5(IDX:2)"), job("5", "shard:5(IDX:3)", state="PENDING"), job("6", "shard:5(IDX:3)", node="t4-02")]
    assert gpu_holders(listing, {("t4-01", 3)}) == {("t4-01", 3): frozenset({"1", "2", "3"})}
    clash = Conflict("2", "t4-01", 3, "1")
    newest = {("1", "t4-01", 3): 5.0, ("2", "t4-01", 3): 4.0, ("3", "t4-01", 3): 6.0, ("4", "t4-01", 2): 9.0}
    assert gpu_memory_mib(clash, {"1", "2", "3"}, newest) == 15.0
    assert gpu_memory_mib(clash, {"1", "2", "3", "7"}, newest) is None  # one without a sample: unknown


def test_its_ladder_requeues_by_default_and_may_only_notify_and_requeue() -> None:
    assert parse_reclaim_section(Node("t.yaml", "reclaim", None)).defaults.ladder[GPU_CONFLICT] == ("requeue",)
    for step in ("shrink", "signal", "cancel"):
        section = {"cancel_enabled": True, "defaults": {"ladder": {GPU_CONFLICT: ["notify", step]}}}
        with pytest.raises(ConfigError, match=rf"reclaim.defaults.ladder.gpu_conflict\[1\]: action '{step}' not allowed"):
            parse_reclaim_section(Node("t.yaml", "reclaim", section))


def test_the_memory_share_is_a_percentage() -> None:
    assert parse_reclaim_section(Node("t.yaml", "reclaim", None)).gpu_conflict_memory_pct == 90.0
    assert parse_reclaim_section(Node("t.yaml", "reclaim", {"gpu_conflict_memory_pct": 0})).gpu_conflict_memory_pct == 0.0
    with pytest.raises(ConfigError, match=r"reclaim.gpu_conflict_memory_pct: expected a percentage in 0..100, got 120"):
        parse_reclaim_section(Node("t.yaml", "reclaim", {"gpu_conflict_memory_pct": 120}))
