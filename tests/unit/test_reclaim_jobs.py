"""Reading GPU counts, shrink updates and holds from a job as `squeue --json` / `scontrol --json show job` print it."""

from __future__ import annotations

from typing import Any

from slurm_aigc.reclaim.jobs import (
    declared_signal,
    first_node,
    gpu_count,
    is_held,
    job_facts,
    node_names,
    requested_gpus,
    shard_gpus,
    shard_memory_limit_mib,
    shrink_updates,
    uses_shards,
)
from slurm_aigc.slurm import JobInfo, job_from_json
from tests.fakes.slurm import FakeJob


def job(**record: Any) -> JobInfo:
    """A 4-GPU job read by the product's JSON converter; `record` overrides `squeue --json` keys."""
    return FakeJob("5", gpus=4).info(**record)


def test_gpu_count_from_alloc_tres_then_request() -> None:
    assert gpu_count(job()) == 4
    pending = job(tres_alloc_str="", tres_per_node="gres/gpu:a100:2", node_count=2)
    assert gpu_count(pending) == 4  # per node x nodes (23.02+ spelling)
    assert gpu_count(job(tres_alloc_str="", tres_per_node="", tres_per_job="gres:gpu:3")) == 3
    assert gpu_count(job(tres_alloc_str="cpu=1,mem=1G", tres_per_node="")) == 0


def test_shards_mean_shared_gpus() -> None:
    shard = job(tres_alloc_str="cpu=1,gres/shard=16", tres_per_node="gres:shard:16")
    assert uses_shards(shard) and gpu_count(shard) == 0
    assert not uses_shards(job())


def test_shrink_keeps_the_type_and_offers_both_spellings() -> None:
    assert shrink_updates(job(), 1) == [{"Gres": "gpu:a100:1"}, {"TresPerNode": "gres/gpu:a100:1"}]
    untyped = job(tres_per_node="gres:gpu:4")
    assert shrink_updates(untyped, 2) == [{"Gres": "gpu:2"}, {"TresPerNode": "gres/gpu:2"}]
    assert shrink_updates(job(node_count=2), 1) == []
    per_job = job(tres_per_node="", tres_per_job="gres:gpu:a100:4")
    assert shrink_updates(per_job, 1)[0] == {"TresPerJob": "gres/gpu:a100:1"}
    assert shrink_updates(job(tres_per_node="gres:shard:8"), 1) == []


def test_requested_gpus_after_update() -> None:
    assert requested_gpus(job(tres_per_node="gres/gpu:a100:1")) == 1


def test_held_after_requeuehold_on_22_05() -> None:
    held = job(job_state="PENDING", state_reason="job_requeued_in_held_state", priority=0)
    assert is_held(held)
    assert is_held(job(job_state="PENDING", state_reason="JobHeldUser", priority=0))
    assert not is_held(job(job_state="PENDING", state_reason="Resources", priority=4294))
    assert not is_held(job(job_state="RUNNING", state_reason="None", priority=0))


def test_facts_read_class_opt_out_and_requeue() -> None:
    facts = job_facts(job(comment="aigc:type=train", admin_comment="aigc_class=infer aigc_reclaim=no", requeue=False))
    assert (facts.job_class, facts.opt_out, facts.requeue_allowed, facts.gpus, facts.shrinkable) == ("infer", True, False, 4, True)


def test_shards_count_as_gpu_fractions_of_their_node_type() -> None:
    shard = job(tres_alloc_str="cpu=1,gres/shard=20", tres_per_node="gres:shard:20", nodes="a100-01")
    assert shard_gpus(shard, {"a100-01": 80, "t4-01": 16}) == 0.25
    assert shard_gpus(shard, {}) == 0.0  # unknown node type: no guess
    assert shard_gpus(job(), {"a100-01": 80}) == 0.0
    assert job_facts(shard, {"a100-01": 80}).shard_gpus == 0.25


def test_node_names_of_a_job_plain_or_ranged() -> None:
    assert node_names("a100-01") == ["a100-01"] and node_names("") == []
    assert node_names("a100-[01-02],t4-01") == ["a100-01", "a100-02", "t4-01"]
    assert node_names("gpu-a") == ["gpu-a"]  # a dash alone is no range
    assert (first_node("a100-01"), first_node("a100-[03-04]"), first_node("t4-01,a100-01")) == ("a100-01", "a100-03", "a100-01")  # NodeSet's order


def test_shard_figures_take_the_first_node_of_a_ranged_or_listed_job() -> None:
    ranged = job(tres_alloc_str="cpu=2,gres/shard=40", tres_per_node="gres:shard:20", nodes="a100-[01-02]", node_count=2)
    assert shard_gpus(ranged, {"a100-01": 80, "a100-02": 40}) == 0.5  # 40 shards on the first node's 80-shard GPU
    assert shard_memory_limit_mib(ranged, {"a100-01": 1.0}) == 20 * 1024.0  # 20 shards per node x 1 GiB
    listed = job(tres_alloc_str="cpu=2,gres/shard=40", tres_per_node="gres:shard:20", nodes="t4-01,a100-01", node_count=2)
    assert shard_memory_limit_mib(listed, {"t4-01": 1.0, "a100-01": 4.0}) == 20 * 4.0 * 1024.0
    plain = job(tres_alloc_str="cpu=1,gres/shard=20", tres_per_node="gres:shard:20", nodes="a100-01")
    assert (shard_gpus(plain, {"a100-01": 80}), shard_memory_limit_mib(plain, {"a100-01": 1.0})) == (0.25, 20 * 1024.0)


def test_declared_signal_comes_from_the_admin_comment_stamp_only() -> None:
    assert declared_signal(job(admin_comment="aigc_class=train aigc_signal=B.USR1; site note")) == "B:USR1"
    assert declared_signal(job(admin_comment="aigc_class=train aigc_signal=10")) == "USR1"  # job_desc.warn_signal
    assert declared_signal(job(admin_comment="aigc_class=train aigc_signal=SIGUSR2")) == "USR2"
    # The job owner's comment, a word after the stamp, and nonsense declare nothing.
    assert declared_signal(job(comment="aigc_signal=B.USR1", admin_comment="aigc_class=train")) == ""
    assert declared_signal(job(admin_comment="aigc_class=train; aigc_signal=B.USR1")) == ""
    assert declared_signal(job(admin_comment="aigc_signal=X.USR1")) == ""
    assert declared_signal(job(admin_comment="aigc_signal=999")) == ""
    assert job_facts(job(admin_comment="aigc_class=train aigc_signal=B.USR1")).declared_signal == "B:USR1"


def test_shard_memory_limit_is_shards_times_gib_per_shard_of_the_node_type() -> None:
    shard = job(tres_alloc_str="cpu=1,gres/shard=20", tres_per_node="gres:shard:20", nodes="a100-01")
    assert shard_memory_limit_mib(shard, {"a100-01": 1.0}) == 20 * 1024.0
    assert shard_memory_limit_mib(shard, {"a100-01": 0.5}) == 10 * 1024.0
    assert shard_memory_limit_mib(shard, {}) == 0.0  # unknown node type: no limit, no verdict
    two_nodes = job(tres_alloc_str="cpu=2,gres/shard=16", nodes="a100-[01-02]", node_count=2)
    assert shard_memory_limit_mib(two_nodes, {"a100-01": 1.0, "a100-02": 1.0}) == 8 * 1024.0
    assert shard_memory_limit_mib(job(tres_alloc_str="cpu=1,gres/gpu=1", nodes="a100-01"), {"a100-01": 1.0}) == 0.0


def test_a_job_reads_the_same_from_22_05_and_24_11_json() -> None:
    """squeue --json (openapi v0.0.38) and scontrol --json (data_parser v0.0.42) give one JobInfo."""
    for fake in (FakeJob("7", gpus=2), FakeJob("8", shards=20), FakeJob("9", state="PENDING", priority=0)):
        assert job_from_json(fake.record(new=True)) == job_from_json(fake.record(new=False)) == fake.info()
