"""Reading GPU counts, shrink updates and holds from `scontrol show job` (22.05 and newer formats)."""

from __future__ import annotations

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
from slurm_aigc.slurm import JobInfo, job_from_fields, parse_key_values
from tests.fakes.reclaim_slurm import FakeJob


def job(**fields: str) -> JobInfo:
    line = FakeJob("5", gpus=4).line()
    base = parse_key_values(line)
    base.update(fields)
    return job_from_fields(base)


def test_gpu_count_from_alloc_tres_then_request() -> None:
    assert gpu_count(job()) == 4
    pending = job(AllocTRES="(null)", TresPerNode="gres/gpu:a100:2", NumNodes="2")
    assert gpu_count(pending) == 4  # per node x nodes (23.02+ spelling)
    assert gpu_count(job(AllocTRES="(null)", TresPerNode="(null)", TresPerJob="gres:gpu:3")) == 3
    assert gpu_count(job(AllocTRES="cpu=1,mem=1G", TresPerNode="(null)")) == 0


def test_shards_mean_shared_gpus() -> None:
    shard = job(AllocTRES="cpu=1,gres/shard=16", TresPerNode="gres:shard:16")
    assert uses_shards(shard) and gpu_count(shard) == 0
    assert not uses_shards(job())


def test_shrink_keeps_the_type_and_offers_both_spellings() -> None:
    assert shrink_updates(job(), 1) == [{"Gres": "gpu:a100:1"}, {"TresPerNode": "gres/gpu:a100:1"}]
    untyped = job(TresPerNode="gres:gpu:4")
    assert shrink_updates(untyped, 2) == [{"Gres": "gpu:2"}, {"TresPerNode": "gres/gpu:2"}]
    assert shrink_updates(job(NumNodes="2"), 1) == []
    per_job = job(TresPerNode="(null)", TresPerJob="gres:gpu:a100:4")
    assert shrink_updates(per_job, 1)[0] == {"TresPerJob": "gres/gpu:a100:1"}
    assert shrink_updates(job(TresPerNode="gres:shard:8"), 1) == []


def test_requested_gpus_after_update() -> None:
    assert requested_gpus(job(TresPerNode="gres/gpu:a100:1")) == 1


def test_held_after_requeuehold_on_22_05() -> None:
    held = job(JobState="PENDING", Reason="job_requeued_in_held_state", Priority="0")
    assert is_held(held)
    assert is_held(job(JobState="PENDING", Reason="JobHeldUser", Priority="0"))
    assert not is_held(job(JobState="PENDING", Reason="Resources", Priority="4294"))
    assert not is_held(job(JobState="RUNNING", Reason="None", Priority="0"))


def test_facts_read_class_opt_out_and_requeue() -> None:
    facts = job_facts(job(Comment="aigc:type=train", AdminComment="aigc_class=infer aigc_reclaim=no", Requeue="0"), 0.0)
    assert (facts.job_class, facts.opt_out, facts.requeue_allowed, facts.gpus, facts.shrinkable) == ("infer", True, False, 4, True)


def test_shards_count_as_gpu_fractions_of_their_node_type() -> None:
    shard = job(AllocTRES="cpu=1,gres/shard=20", TresPerNode="gres:shard:20", NodeList="a100-01")
    assert shard_gpus(shard, {"a100-01": 80, "t4-01": 16}) == 0.25
    assert shard_gpus(shard, {}) == 0.0  # unknown node type: no guess
    assert shard_gpus(job(), {"a100-01": 80}) == 0.0
    assert job_facts(shard, 0.0, {"a100-01": 80}).shard_gpus == 0.25


def test_node_names_of_a_job_plain_or_ranged() -> None:
    assert node_names("a100-01") == ["a100-01"] and node_names("") == []
    assert node_names("a100-[01-02],t4-01") == ["a100-01", "a100-02", "t4-01"]
    assert node_names("gpu-a") == ["gpu-a"]  # a dash alone is no range
    assert (first_node("a100-01"), first_node("a100-[03-04]"), first_node("t4-01,a100-01")) == ("a100-01", "a100-03", "a100-01")  # NodeSet's order


def test_shard_figures_take_the_first_node_of_a_ranged_or_listed_job() -> None:
    ranged = job(AllocTRES="cpu=2,gres/shard=40", TresPerNode="gres:shard:20", NodeList="a100-[01-02]", NumNodes="2")
    assert shard_gpus(ranged, {"a100-01": 80, "a100-02": 40}) == 0.5  # 40 shards on the first node's 80-shard GPU
    assert shard_memory_limit_mib(ranged, {"a100-01": 1.0}) == 20 * 1024.0  # 20 shards per node x 1 GiB
    listed = job(AllocTRES="cpu=2,gres/shard=40", TresPerNode="gres:shard:20", NodeList="t4-01,a100-01", NumNodes="2")
    assert shard_memory_limit_mib(listed, {"t4-01": 1.0, "a100-01": 4.0}) == 20 * 4.0 * 1024.0
    plain = job(AllocTRES="cpu=1,gres/shard=20", TresPerNode="gres:shard:20", NodeList="a100-01")
    assert (shard_gpus(plain, {"a100-01": 80}), shard_memory_limit_mib(plain, {"a100-01": 1.0})) == (0.25, 20 * 1024.0)


def test_declared_signal_comes_from_the_admin_comment_stamp_only() -> None:
    assert declared_signal(job(AdminComment="aigc_class=train aigc_signal=B.USR1; site note")) == "B:USR1"
    assert declared_signal(job(AdminComment="aigc_class=train aigc_signal=10")) == "USR1"  # job_desc.warn_signal
    assert declared_signal(job(AdminComment="aigc_class=train aigc_signal=SIGUSR2")) == "USR2"
    # The job owner's comment, a word after the stamp, and nonsense declare nothing.
    assert declared_signal(job(Comment="aigc_signal=B.USR1", AdminComment="aigc_class=train")) == ""
    assert declared_signal(job(AdminComment="aigc_class=train; aigc_signal=B.USR1")) == ""
    assert declared_signal(job(AdminComment="aigc_signal=X.USR1")) == ""
    assert declared_signal(job(AdminComment="aigc_signal=999")) == ""
    assert job_facts(job(AdminComment="aigc_class=train aigc_signal=B.USR1"), 0.0).declared_signal == "B:USR1"


def test_shard_memory_limit_is_shards_times_gib_per_shard_of_the_node_type() -> None:
    shard = job(AllocTRES="cpu=1,gres/shard=20", TresPerNode="gres:shard:20", NodeList="a100-01")
    assert shard_memory_limit_mib(shard, {"a100-01": 1.0}) == 20 * 1024.0
    assert shard_memory_limit_mib(shard, {"a100-01": 0.5}) == 10 * 1024.0
    assert shard_memory_limit_mib(shard, {}) == 0.0  # unknown node type: no limit, no verdict
    two_nodes = job(AllocTRES="cpu=2,gres/shard=16", NodeList="a100-[01-02]", NumNodes="2")
    assert shard_memory_limit_mib(two_nodes, {"a100-01": 1.0, "a100-02": 1.0}) == 8 * 1024.0
    assert shard_memory_limit_mib(job(AllocTRES="cpu=1,gres/gpu=1", NodeList="a100-01"), {"a100-01": 1.0}) == 0.0
