"""The job_submit hook's rules, run as Lua 5.1 in lupa with a slurmctld-like `slurm` table."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_aigc.policy.hookruntime import (
    ERROR,
    INFINITE,
    NICE_OFFSET,
    SUCCESS,
    HookResult,
    HookRuntime,
)
from slurm_aigc.policy.loader import parse_policy_text
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.reclaim.jobs import declared_signal
from slurm_aigc.tags import stamp, trusted_class, trusted_share_no, trusted_tags
from slurm_aigc.telemetry.features import model_feature
from tests.fakes.slurm import FakeJob

ALICE = 1001
SHARD_ENTRY = "shard:"
SCRIPT = "#!/bin/bash\nsrun python serve.py\n"


def runtime_for(tmp_path: Path, **overrides: Any) -> HookRuntime:
    """The shipped policy with `overrides` merged in (section -> keys), published features in tmp_path."""
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["model_prefer"]["published_features_file"] = str(tmp_path / "published-features.txt")
    document["rewrites"]["model_prefer"]["refresh_seconds"] = 0
    for section, values in overrides.items():
        target = document
        for key in section.split("."):
            target = target.setdefault(key, {})
        target.update(values)
    policy = parse_policy_text(yaml.safe_dump(document), "test-policy.yaml")
    return HookRuntime(render_hook(policy))


@pytest.fixture
def hook(tmp_path: Path) -> HookRuntime:
    return runtime_for(tmp_path)


def submit(hook: HookRuntime, uid: int = ALICE, **fields: Any) -> HookResult:
    fields.setdefault("script", SCRIPT)
    fields.setdefault("name", "job")
    fields.setdefault("user_id", uid)
    return hook.submit(fields, submit_uid=uid)


def test_small_inference_becomes_shards_on_types_where_it_fits(hook: HookRuntime) -> None:
    result = submit(hook, comment="exp42 aigc:type=infer,vram=20G", tres_per_node="gres:gpu:1")
    assert result.rc == SUCCESS and result.job_class == "infer"
    # 20 GiB is more than half a 16 GiB t4, so only a100 may take it; infer's expected SM (0.5)
    # asks for 40 of its 80 shards, so at most two such jobs share one a100.
    assert result.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:40")
    assert result.changes["features"] == (None, "a100")


def test_a_sharded_job_goes_ahead_in_the_queue_unless_its_user_chose_a_nice(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"rewrites.shard": {"nice": -100}})
    sharded = submit(hook, comment="aigc:type=infer,vram=6G", tres_per_node="gres:gpu:1")
    assert sharded.changes["nice"] == (None, NICE_OFFSET - 100)  # None: unset (NO_VAL)
    assert any("nice -100" in message for message in sharded.messages)
    polite = submit(hook, comment="aigc:type=infer,vram=6G", tres_per_node="gres:gpu:1", nice=NICE_OFFSET + 50)
    assert "nice" not in polite.changes and polite.changes["tres_per_node"][1] == "gres:shard:8"
    whole = submit(hook, comment="aigc:type=infer,vram=6G,share=no", tres_per_node="gres:gpu:1")
    assert "nice" not in whole.changes
    train = submit(hook, comment="aigc:type=train", tres_per_node="gres:gpu:1")
    assert "nice" not in train.changes


def test_the_shipped_shard_nice_zero_leaves_the_queue_order_alone(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=6G", tres_per_node="gres:gpu:1")
    assert result.changes["tres_per_node"][1] == "gres:shard:8" and "nice" not in result.changes


def test_tiny_job_of_a_low_sm_class_shards_anywhere_without_constraint(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"rewrites.shard": {"expected_sm": {"infer": 0.05, "imagegen": 0.05}}})
    result = submit(hook, comment="aigc:type=imagegen,vram=6.5G", tres_per_node="gres/gpu:1")
    # ceil(6.5) GiB covers 5 % of an a100 (4 shards) and of a t4 (1): both types keep it.
    assert result.changes["tres_per_node"] == ("gres/gpu:1", "gres/shard:7")  # 24.11 style kept
    assert "features" not in result.changes


def test_share_no_keeps_a_whole_gpu_but_fits_the_type(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=20G,share=no", tres_per_node="gres:gpu:1")
    assert "tres_per_node" not in result.changes
    assert result.changes["features"] == (None, "a100")


def test_vram_that_fits_no_small_type_keeps_job_off_it(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=60G", tres_per_node="gres:gpu:1")
    assert result.changes["features"] == (None, "a100")
    assert "tres_per_node" not in result.changes


def test_vram_fit_is_anded_with_the_users_constraint(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=batch,vram=40G", tres_per_node="gres:gpu:2", features="ib&ssd")
    assert result.changes["features"] == ("ib&ssd", "ib&ssd&a100")


def test_complex_user_constraint_is_left_alone_and_user_told(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=batch,vram=40G", tres_per_node="gres:gpu:2", features="[ib|eth]")
    assert "features" not in result.changes
    assert any("constraint" in m for m in result.messages)


def test_typed_request_too_small_is_kept_but_user_warned(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=40G,share=no", tres_per_node="gres:gpu:t4:1")
    assert "tres_per_node" not in result.changes and "features" not in result.changes
    assert any("t4" in m and "vram=40G" in m for m in result.messages)


def test_multi_gpu_train_on_one_node_goes_to_nvlink_types(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=train", tres_per_node="gres:gpu:8", min_nodes=1)
    assert result.changes["features"] == (None, "a100")
    assert result.after["admin_comment"] == "aigc_class=train" and "comment" not in result.changes


def test_multi_node_train_is_not_constrained(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=train", tres_per_node="gres:gpu:8", min_nodes=2)
    assert "features" not in result.changes


def test_nvlink_feature_method_uses_published_feature(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"rewrites.nvlink": {"method": "feature", "feature": "nvlink"}})
    result = submit(hook, comment="aigc:type=finetune", tres_per_job="gres:gpu:4")
    assert result.changes["features"] == (None, "nvlink")


def test_nvlink_no_opts_out(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=train,nvlink=no", tres_per_node="gres:gpu:4")
    assert "features" not in result.changes


def test_model_prefer_only_for_published_model_features(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path)
    unpublished = submit(hook, comment="aigc:type=infer,model=llama3-8b", tres_per_node="gres:gpu:1")
    assert "prefer" not in unpublished.changes  # Slurm would reject an unknown --prefer feature
    write_listing(tmp_path / "published-features.txt", "model_llama3-8b\nmodel_sdxl\n")
    published = submit(hook, comment="aigc:type=infer,model=llama3-8b", tres_per_node="gres:gpu:1")
    assert published.changes["prefer"] == (None, "model_llama3-8b")


def test_a_retag_of_a_pending_job_keeps_the_prefer_it_cannot_see(tmp_path: Path) -> None:
    # The job record shows the hook no `prefer`: a re-tag adding model=M must not replace the
    # job's own --prefer=fast (which it would, as `<constraint>&model_M`, if it guessed).
    hook = runtime_for(tmp_path)
    write_listing(tmp_path / "published-features.txt", "model_m a100\n")
    pending = {"job_state": 0, "name": "serve", "tres_per_node": "gres:gpu:1", "prefer": "fast",
               "admin_comment": "aigc_class=infer", "comment": "aigc:type=infer"}
    retag = hook.modify({"comment": "aigc:type=infer,model=m"}, pending, modify_uid=ALICE)
    assert "prefer" not in retag.changes
    both = hook.modify({"comment": "aigc:type=infer,model=m", "prefer": "a100"}, pending, modify_uid=ALICE)
    assert both.changes["prefer"][1].endswith("model_m")  # an update that sets a prefer is added to
    plain = hook.modify({"comment": "aigc:type=infer,vram=20G"}, pending, modify_uid=ALICE)
    flagged = hook.modify({"comment": "aigc:type=infer,vram=20G"}, {**pending, "job_state": 0x10000000},
                          modify_uid=ALICE)  # JOB_RESV_DEL_HOLD on a pending job: still pending
    assert flagged.changes == plain.changes == {"features": (None, "a100")}


def test_a_compute_bound_class_is_never_shared(hook: HookRuntime) -> None:
    # imagegen's expected SM (0.9) is above max_sm (0.5): one such job fills a GPU's compute, and
    # 11 of them sharing an a100 by VRAM alone ran past their limits (docs/benchmarks.md).
    result = submit(hook, comment="aigc:type=imagegen,vram=7G,share=yes", tres_per_node="gres:gpu:1")
    assert result.rc == SUCCESS and "tres_per_node" not in result.changes


def test_the_shard_count_caps_co_tenants_by_expected_sm(hook: HookRuntime) -> None:
    # A GRES request has one count: the one keeping the most types wins, else the smaller type's.
    assert hook.shard_request("infer", 7.0) == (8, ["t4"], 0.5)  # ceil(0.5 x 16): two per t4, not 40 on a100
    assert hook.shard_request("infer", 9.0) == (40, ["a100"], 0.5)  # over half a t4: two per a100
    assert hook.shard_request("infer", 30.0, {"sm": 0.25}) == (30, ["a100"], 0.25)  # memory beyond the SM share
    assert hook.shard_request("infer", 41.0)[0] is None  # over max_fraction of the largest GPU
    assert hook.shard_request("infer", 7.0, {"sm": 0.05}) == (7, ["t4", "a100"], 0.05)  # VRAM rules both
    assert hook.shard_request("infer", 2.0, {"sm": 0.1}) == (8, ["t4", "a100"], 0.1)  # a100 needs 8, a t4 2
    assert hook.shard_request("infer", 0.001, {"sm": 0.001})[0] == 1  # never shard:0
    assert hook.shard_request("imagegen", 7.0)[0] is None


@pytest.mark.parametrize("learned", [None, {}, {"sm": "high"}, {"sm": 0}, {"sm": -0.2}, {"sm": 1.5},
                                     {"sm": float("nan")}, {"sm": float("inf")}, {"vram": 7}])
def test_an_absent_or_bad_learned_sm_falls_back_to_the_class_default(hook: HookRuntime, learned: Any) -> None:
    assert hook.shard_request("infer", 7.0, learned) == (8, ["t4"], 0.5)


def test_a_learned_sm_decides_sharing_either_way(hook: HookRuntime) -> None:
    # The agents' history beats the class default: a light image server shares, a busy one does not.
    assert hook.shard_request("imagegen", 7.0, {"sm": 0.25}) == (7, ["t4"], 0.25)  # VRAM needs more than SM here
    assert hook.shard_request("imagegen", 12.0, {"sm": 0.25}) == (20, ["a100"], 0.25)  # four per a100
    assert hook.shard_request("infer", 7.0, {"sm": 0.8})[0] is None


def test_share_no_is_never_shared_whatever_the_expected_sm(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"rewrites.shard": {"expected_sm": {"infer": 0.01, "imagegen": 0.01}}})
    for tres in ("gres:gpu:1", "gres/gpu:1"):
        result = submit(hook, comment="aigc:type=infer,vram=4G,share=no", tres_per_node=tres)
        assert "tres_per_node" not in result.changes and SHARD_ENTRY not in str(result.after)
    shared = submit(hook, comment="aigc:type=infer,vram=4G", tres_per_node="gres:gpu:1")
    assert shared.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:4")  # the same job without share=no


def test_the_shard_rewrite_says_which_sm_it_used(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=7G", tres_per_node="gres:gpu:1")
    assert any("SM 0.5 (class) -> 8 shard(s)" in line for line in result.messages)


def test_model_prefer_only_when_a_node_serving_the_model_also_meets_the_constraint(tmp_path: Path) -> None:
    # Measured on 22.05: `--prefer a100&model_X` while only a t4 served X was refused at submit
    # ("Requested node configuration is not available").
    hook = runtime_for(tmp_path)
    listing = tmp_path / "published-features.txt"
    comment = "aigc:type=infer,model=sd-m0016,vram=10G,share=yes"  # 40-shard job: a100 only
    write_listing(listing, "model_sd-m0016 t4 vram16g\n")
    only_t4 = submit(hook, comment=comment, tres_per_node="gres:gpu:1")
    assert only_t4.accepted and only_t4.changes["features"] == (None, "a100")
    assert "prefer" not in only_t4.changes
    write_listing(listing, "model_sd-m0016 t4 vram16g\nmodel_sd-m0016 a100 nvlink vram80g\n")
    both = submit(hook, comment=comment, tres_per_node="gres:gpu:1")
    assert both.changes["prefer"] == (None, "a100&model_sd-m0016")
    # A bare line is a node with no other feature (the publisher writes one for a node without
    # features): it meets no constraint. It once meant "any node", and a featureless t4 serving
    # the model got every `--constraint=ib` job of that model a --prefer no node met: refused.
    write_listing(listing, "model_sd-m0016\n")
    assert "prefer" not in submit(hook, comment=comment, tres_per_node="gres:gpu:1").changes
    plain = submit(hook, comment="aigc:type=batch,model=sd-m0016", tres_per_node="gres:gpu:1")
    assert plain.changes["prefer"] == (None, "model_sd-m0016")  # no constraint: that node will do


def test_model_prefer_repeats_the_constraint_it_must_not_escape(tmp_path: Path) -> None:
    # Slurm 22.05 tries --prefer in place of --constraint, so a bare model feature could
    # land a 20 GiB shard job on a t4 that serves the model.
    hook = runtime_for(tmp_path, **{"rewrites.model_prefer": {"published_features_file": None}})
    sharded = submit(hook, comment="aigc:type=infer,model=m,vram=20G", tres_per_node="gres:gpu:1")
    assert sharded.changes["prefer"] == (None, "a100&model_m")
    user_or = submit(hook, comment="aigc:type=batch,model=m", tres_per_node="gres:gpu:1", features="a100|t4")
    assert user_or.changes["prefer"] == (None, "(a100|t4)&model_m")
    user_prefer = submit(hook, comment="aigc:type=batch,model=m", tres_per_node="gres:gpu:1", prefer="fast")
    assert user_prefer.changes["prefer"] == ("fast", "fast&model_m")
    counted = submit(hook, comment="aigc:type=batch,model=m", tres_per_node="gres:gpu:1", features="[a100*1&t4*1]")
    assert "prefer" not in counted.changes


def test_model_id_is_sanitised(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"rewrites.model_prefer": {"published_features_file": None}})
    result = submit(hook, comment="aigc:type=infer,model=meta-llama//Llama-3-8B! more", tres_per_node="gres:gpu:1")
    # The tag value ends at whitespace; cleaned like the publisher's model_feature().
    assert result.changes["prefer"] == (None, model_feature("meta-llama//Llama-3-8B!"))
    long_id = submit(hook, comment="aigc:type=infer,model=" + "m" * 100, tres_per_node="gres:gpu:1")
    assert long_id.changes["prefer"] == (None, model_feature("m" * 100))


def test_class_defaults_apply_only_to_unset_fields_and_usable_partitions(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"classes.imagegen": {"partition": "gpu", "qos": "short", "time_minutes": 120}})
    result = submit(hook, comment="aigc:type=imagegen,share=no")
    assert result.changes["partition"] == (None, "gpu")
    assert result.changes["qos"] == (None, "short")
    assert result.changes["time_limit"] == (None, 120)
    user_set = submit(hook, comment="aigc:type=imagegen,share=no", partition="other", qos="long", time_limit=30)
    assert not {"partition", "qos", "time_limit"} & set(user_set.changes)


def test_class_default_partition_the_user_cannot_use_is_skipped(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"classes.train": {"partition": "big"}})
    result = submit(hook, comment="aigc:type=train")
    assert "partition" not in result.changes  # "big" is not in part_list


def test_class_default_time_above_partition_max_is_skipped(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"classes.train": {"time_minutes": 600}})
    parts = {"gpu": {"name": "gpu", "max_time": 60, "flag_default": 1}}
    result = hook.submit({"comment": "aigc:type=train", "script": SCRIPT, "partition": "gpu"}, submit_uid=ALICE, partitions=parts)
    assert "time_limit" not in result.changes
    unlimited = hook.submit({"comment": "aigc:type=train", "script": SCRIPT, "partition": "gpu"}, submit_uid=ALICE,
                            partitions={"gpu": {"name": "gpu", "max_time": INFINITE}})
    assert unlimited.changes["time_limit"] == (None, 600)


@pytest.mark.parametrize("fields", [
    {"comment": "aigc:type=infer,vram=20G", "tres_per_node": "gres:gpu:1", "script": None},  # srun: interactive
    {"comment": "aigc:type=interactive", "tres_per_node": "gres:gpu:1", "script": None},
    {"comment": "just text", "tres_per_node": "gres:gpu:8"},
    {"comment": None, "tres_per_node": "gres:gpu:1", "name": "notebook"},
])
def test_interactive_and_unknown_jobs_are_untouched(hook: HookRuntime, fields: dict[str, Any]) -> None:
    fields = {"script": SCRIPT, "name": "job", **fields}
    if fields.get("script") is None and "aigc:type=interactive" not in str(fields.get("comment")):
        fields["comment"] = None  # srun with no tag
    result = hook.submit(fields, submit_uid=ALICE)
    assert result.rc == SUCCESS and set(result.changes) == {"admin_comment"} and result.messages == []
    assert result.job_class in ("interactive", "unknown")
    # Left as submitted, but stamped: the daemons must know an interactive job is one.
    assert result.after["admin_comment"] == f"aigc_class={result.job_class}"


def test_a_batch_job_cannot_claim_to_be_interactive(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=interactive,reclaim=no", tres_per_node="gres:gpu:1")
    assert result.job_class == "unknown" and result.after["admin_comment"] == "aigc_class=unknown aigc_reclaim=no"
    assert any("type=interactive" in m and "srun/salloc" in m for m in result.messages)



def test_learned_defaults_never_take_interactive_away(tmp_path: Path) -> None:
    table = tmp_path / "learned.txt"
    table.write_bytes(b"# slurm-aigc learned defaults v1\n1001 sd-gen train 20 0.4 5 5 - aigc-alice\n")
    hook = runtime_for(tmp_path, learned={"enabled": True, "file": str(table), "refresh_seconds": 0, "max_entries": 100})
    batch = submit(hook, name="sd-gen-0099", tres_per_node="gres:gpu:1")
    assert batch.job_class == "train" and trusted_tags(batch.after["admin_comment"])["learned"] == "1"
    # An untagged salloc named like the owner's batch jobs stays an exempt session.
    session = submit(hook, name="sd-gen-0100", tres_per_node="gres:gpu:1", script=None)
    assert session.job_class == "interactive" and session.after["admin_comment"] == "aigc_class=interactive"
    assert set(session.changes) == {"admin_comment"} and session.messages == []


def test_a_tagged_jobs_history_refines_its_expected_sm_and_nothing_else(tmp_path: Path) -> None:
    """Issue 14.3: the class default is refined from the agents' history per user, name and class.
    A tagged job keeps its class and vram; the SM its owner's jobs of that name and class drew
    decides its shard request, either way."""
    table = tmp_path / "learned.txt"
    table.write_bytes(b"# slurm-aigc learned defaults v1\n"
                      b"1001 llama3-8b-chat infer 30 0.2 5 5 - aigc-alice\n"
                      b"1001 sdxl-serve infer 12 0.9 5 5 - aigc-alice\n"
                      b"1001 mixed-name train 70 0.2 5 5 - aigc-alice\n")
    hook = runtime_for(tmp_path, learned={"enabled": True, "file": str(table), "refresh_seconds": 0, "max_entries": 100})
    light = submit(hook, name="llama3-8b-chat-0007", comment="aigc:type=infer,vram=7G", tres_per_node="gres:gpu:1")
    # SM 0.2 is 16 of an a100's 80 shards (five such jobs per a100), and 16 also fits a t4's 16:
    # both types keep it. The class default (0.5) asked for 8 shards, of t4s only.
    assert light.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:16")
    assert any("SM 0.2 (learned) -> 16 shard(s)" in line for line in light.messages)
    stamp = trusted_tags(light.after["admin_comment"])
    assert stamp["class"] == "infer" and "learned" not in stamp  # its class is its tag's: evidence for the learner
    assert not any("from your earlier jobs" in line for line in light.messages)  # nothing filled in
    heavy = submit(hook, name="sdxl-serve-2", comment="aigc:type=infer,vram=7G", tres_per_node="gres:gpu:1")
    assert "tres_per_node" not in heavy.changes  # its history computes above max_sm: a GPU of its own
    other = submit(hook, name="mixed-name-1", comment="aigc:type=infer,vram=7G", tres_per_node="gres:gpu:1")
    assert any("SM 0.5 (class) -> 8 shard(s)" in line for line in other.messages)  # a train history says nothing of infer
    vram = submit(hook, name="llama3-8b-chat-0008", comment="aigc:type=infer", tres_per_node="gres:gpu:1")
    assert "tres_per_node" not in vram.changes  # the tag gave no vram, and a tagged job's is never filled in
    bob = submit(hook, uid=1002, name="llama3-8b-chat-0007", comment="aigc:type=infer,vram=7G", tres_per_node="gres:gpu:1")
    assert any("SM 0.5 (class)" in line for line in bob.messages)  # alice's history is hers


def test_learned_defaults_leave_jobs_without_gpus_alone(tmp_path: Path) -> None:
    # The owner's GPU jobs named `prep` were learned as infer; their CPU-only data preparation,
    # named alike, must not get the infer class (its qos, its time limit) from the table.
    table = tmp_path / "learned.txt"
    table.write_bytes(b"# slurm-aigc learned defaults v1\n1001 prep infer 20 0.4 5 5 - aigc-alice\n")
    hook = runtime_for(tmp_path, learned={"enabled": True, "file": str(table), "refresh_seconds": 0, "max_entries": 100})
    cpu = submit(hook, name="prep-0007")
    assert cpu.job_class == "unknown" and set(cpu.changes) == {"admin_comment"} and cpu.messages == []
    for gres in ("gres:gpu:1", "gres/gpu:a100:1", "gres:shard:20", "gpu:1,gres:shard:8"):
        gpu = submit(hook, name="prep-0008", tres_per_node=gres)
        assert gpu.job_class == "infer", gres


def test_root_is_untouched(hook: HookRuntime) -> None:
    result = submit(hook, uid=0, comment="aigc:type=infer,vram=20G", tres_per_node="gres:gpu:1")
    assert result.rc == SUCCESS and result.changes == {"admin_comment": (None, "aigc_class=infer")}  # only stamped
    own = submit(hook, uid=0, comment="aigc:type=infer", admin_comment="aigc_class=batch; by hand")
    assert own.changes == {}  # root's own stamp is kept


def test_untagged_job_classified_by_name_and_gpu_count(hook: HookRuntime) -> None:
    named = submit(hook, name="llama-SFT-run", tres_per_node="gres:gpu:2")
    assert named.job_class == "finetune"
    assert named.changes["features"] == (None, "a100")
    no_gpu = submit(hook, name="vllm-serve")  # infer rule needs min_gpus: 1
    assert no_gpu.job_class == "unknown" and set(no_gpu.changes) == {"admin_comment"}


def test_the_class_is_stamped_into_the_admin_comment_and_user_stamps_are_dropped(hook: HookRuntime) -> None:
    result = submit(hook, comment="run aigc:type=batch aigc_class=interactive aigc_reclaim=no x", tres_per_node="gres:gpu:1",
                    admin_comment="aigc_class=interactive; sent in a crafted request")
    assert result.after["comment"] == "run aigc:type=batch x"
    assert result.after["admin_comment"] == "aigc_class=batch; sent in a crafted request"
    assert trusted_class(result.after["admin_comment"]) == "batch"


def test_malformed_tag_is_ignored_and_reported_in_lenient_mode(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=lots,color=red", tres_per_node="gres:gpu:1")
    assert result.rc == SUCCESS and result.job_class == "infer"
    assert "tres_per_node" not in result.changes
    assert any("vram=lots" in m and "color=red" in m for m in result.messages)


def test_strict_mode_rejects_naming_the_bad_part_and_the_fix(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, hook={"strict_tags": True})
    result = submit(hook, comment="aigc:type=infer,vram=lots", tres_per_node="gres:gpu:1")
    assert result.rc == ERROR and result.changes == {}
    assert result.user_msg is not None and "vram=lots" in result.user_msg and "vram=20G" in result.user_msg
    good = submit(hook, comment="aigc:type=infer,vram=20G", tres_per_node="gres:gpu:1")
    assert good.rc == SUCCESS


def test_every_rewrite_is_logged_with_the_aigc_tag_and_told_to_the_user(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=20G", tres_per_node="gres:gpu:1")
    logged = result.logged("log")
    rewrites = set(result.changes) - {"admin_comment"}  # the stamp is no rewrite of the user's request
    assert len(logged) == len(rewrites) == 2
    assert all(line.startswith("aigc: rewrite ") for line in logged)
    assert len(result.messages) == len(rewrites)


def test_gpus_per_job_becomes_shards_per_node(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=8G", tres_per_job="gres:gpu:1")
    assert result.changes["tres_per_job"] == ("gres:gpu:1", None)
    assert result.changes["tres_per_node"] == (None, "gres:shard:8")


def test_other_gres_entries_are_kept(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=8G", tres_per_node="gres:license_x:1,gres:gpu:1")
    assert result.changes["tres_per_node"] == ("gres:license_x:1,gres:gpu:1", "gres:license_x:1,gres:shard:8")


def test_cpus_per_gpu_blocks_the_shard_rewrite(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=8G", tres_per_node="gres:gpu:1", cpus_per_tres="gres:gpu:4")
    assert "tres_per_node" not in result.changes


def test_unparseable_gres_is_left_alone(hook: HookRuntime) -> None:
    result = submit(hook, comment="aigc:type=infer,vram=8G", tres_per_node="gres:gpu:a100:x:y")
    assert "tres_per_node" not in result.changes and result.rc == SUCCESS


def test_modify_retags_a_pending_job_without_touching_its_gres(hook: HookRuntime) -> None:
    record = {"job_state": 0, "comment": "old", "gres": "gres:gpu:1", "name": "job", "min_nodes": 1}
    result = hook.modify({"comment": "aigc:type=infer,vram=20G"}, record, modify_uid=ALICE)
    # 22.05 fails the whole `scontrol update` when job_modify changes the GRES of a pending job.
    assert not {"tres_per_node", "tres_per_job"} & set(result.changes)
    assert result.changes["features"] == (None, "a100")  # vram_fit still keeps it off t4
    # 22.05 refuses an owner's whole update when job_modify sets admin_comment: never on modify.
    assert not {"comment", "admin_comment"} & set(result.changes)
    # 22.05 discards log_user in job_modify (with an error line): only the log is written.
    assert result.messages == [] and result.logged("log")


def test_modify_of_running_or_unrelated_fields_does_nothing(hook: HookRuntime) -> None:
    running = {"job_state": 1, "comment": "aigc:type=infer,vram=20G", "gres": "gres:gpu:1"}
    assert hook.modify({"comment": "aigc:type=train"}, running, modify_uid=ALICE).changes == {}
    pending = {"job_state": 0, "comment": "aigc:type=infer,vram=20G aigc_class=infer", "gres": "gres:shard:20"}
    assert hook.modify({"time_limit": 30}, pending, modify_uid=ALICE).changes == {}


def test_modify_keeps_the_stamp_and_drops_user_stamps(hook: HookRuntime) -> None:
    record = {"job_state": 0, "comment": "x", "gres": "gres:gpu:1", "admin_comment": "aigc_class=batch"}
    result = hook.modify({"comment": "aigc:type=infer,vram=20G aigc_class=interactive"}, record, modify_uid=ALICE)
    # The re-tag places the owner's own job; the stamp the daemons trust stays as submitted.
    assert result.job_class == "infer" and result.changes["features"] == (None, "a100")
    assert result.changes["comment"] == ("aigc:type=infer,vram=20G aigc_class=interactive", "aigc:type=infer,vram=20G")
    assert "admin_comment" not in result.after  # job_desc.admin_comment left unset: the record keeps its stamp


def test_an_admins_admin_comment_update_keeps_the_stamp(hook: HookRuntime) -> None:
    record = {"job_state": 1, "comment": "x", "admin_comment": "aigc_class=train aigc_reclaim=no"}
    kept = hook.modify({"admin_comment": "site note"}, record, modify_uid=0)
    assert kept.after["admin_comment"] == "aigc_class=train aigc_reclaim=no; site note"
    cleared = hook.modify({"admin_comment": ""}, record, modify_uid=0)
    assert cleared.after["admin_comment"] == "aigc_class=train aigc_reclaim=no"
    reclassed = hook.modify({"admin_comment": "aigc_class=infer"}, record, modify_uid=0)  # on purpose
    assert reclassed.after["admin_comment"] == "aigc_class=infer aigc_reclaim=no"
    signal = hook.modify({"admin_comment": "aigc_signal=B:USR1; by hand"}, record, modify_uid=0)
    assert signal.after["admin_comment"] == "aigc_signal=B:USR1 aigc_class=train aigc_reclaim=no; by hand"


def test_reclaim_opt_out_is_a_valid_key_for_the_hook(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, hook={"strict_tags": True})
    result = submit(hook, comment="aigc:type=infer,reclaim=no,vram=20G", tres_per_node="gres:gpu:1")
    assert result.rc == SUCCESS and result.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:40")
    assert submit(hook, comment="aigc:type=infer,reclaim=maybe").rc == ERROR


def test_share_no_is_stamped_where_its_owner_cannot_take_it_back(hook: HookRuntime) -> None:
    """On 22.05 the controller requeues a shard job Slurm put on a share=no job's GPU
    (gpuconflict.py): it reads the stamp, which a later edit of the comment cannot change."""
    result = submit(hook, comment="aigc:type=infer,vram=7G,share=no", tres_per_node="gres:gpu:1")
    assert result.after["admin_comment"] == "aigc_class=infer aigc_share=no"
    assert trusted_share_no(result.after["admin_comment"])
    assert result.after["admin_comment"] == stamp("infer", share_no=True)
    assert submit(hook, comment="aigc:type=infer,vram=7G,share=yes").after["admin_comment"] == "aigc_class=infer"
    crafted = submit(hook, comment="aigc:type=infer,vram=7G aigc_share=no", tres_per_node="gres:gpu:1",
                     admin_comment="aigc_share=no; sent in a crafted request")
    assert not trusted_share_no(crafted.after["admin_comment"]) and "aigc_share" not in crafted.after["comment"]
    record = {"job_state": 0, "comment": "aigc:type=infer,vram=7G", "gres": "gres:shard:8",
              "admin_comment": "aigc_class=infer"}
    retag = hook.modify({"comment": "aigc:type=infer,vram=7G,share=no"}, record, modify_uid=ALICE)
    assert retag.rc == SUCCESS and "admin_comment" not in retag.after


@pytest.mark.parametrize(("tag", "stamped", "declared"), [
    ("aigc:type=train,signal=B.USR1", "aigc_class=train aigc_signal=B.USR1", "B:USR1"),
    ("aigc:type=train,reclaim=no,signal=b:sigusr2", "aigc_class=train aigc_reclaim=no aigc_signal=B.USR2", "B:USR2"),
    ("notes aigc:signal=usr1", "aigc_class=unknown aigc_signal=USR1", "USR1"),  # untouched classes are stamped too
])
def test_a_signal_tag_is_stamped_into_the_admin_comment(hook: HookRuntime, tag: str, stamped: str, declared: str) -> None:
    """job_submit/lua cannot see --signal: the user's own `aigc:signal=` declares it, for their own job only."""
    result = submit(hook, comment=tag, tres_per_node="gres:gpu:1")
    assert result.rc == SUCCESS and result.after["admin_comment"] == stamped and result.messages == []
    job = FakeJob("7", admin_comment=stamped).info()
    assert declared_signal(job) == declared  # what reclaim reads


@pytest.mark.parametrize("value", ["TERM", "KILL", "SIGINT", "10", "B:HUP", "X.USR1", "USR1;rm", "B.", "SIG"])
def test_a_signal_that_ends_a_job_or_is_not_a_name_is_a_tag_error(tmp_path: Path, value: str) -> None:
    lenient = submit(runtime_for(tmp_path), comment=f"aigc:type=train,signal={value}", tres_per_node="gres:gpu:1")
    assert lenient.rc == SUCCESS and lenient.after["admin_comment"] == "aigc_class=train"  # no signal declared
    assert any(f"'signal={value}'" in m and "-- ignored" in m for m in lenient.messages)
    strict = submit(runtime_for(tmp_path, hook={"strict_tags": True}), comment=f"aigc:type=train,signal={value}")
    assert strict.rc == ERROR and strict.changes == {} and strict.user_msg is not None
    assert f"'signal={value}'" in strict.user_msg and "USR1, USR2, CONT, URG, WINCH" in strict.user_msg


def test_only_the_tag_declares_a_signal_user_stamp_words_are_dropped(hook: HookRuntime) -> None:
    written = submit(hook, comment="run aigc:type=train aigc_signal=B.USR1 x", tres_per_node="gres:gpu:1")
    assert written.after["comment"] == "run aigc:type=train x"
    assert trusted_tags(written.after["admin_comment"]) == {"class": "train"}
    crafted = submit(hook, comment="aigc:type=train", admin_comment="aigc_signal=B.USR1; sent in a crafted request")
    assert crafted.after["admin_comment"] == "aigc_class=train; sent in a crafted request"
    # The declaration is made at submit: a re-tag of a pending job never writes the stamp (22.05
    # would refuse the owner's whole update), so the record keeps what was declared then.
    record = {"job_state": 0, "comment": "aigc:type=train", "gres": "gres:gpu:1", "admin_comment": "aigc_class=train"}
    retag = hook.modify({"comment": "aigc:type=train,signal=B.USR1"}, record, modify_uid=ALICE)
    assert retag.rc == SUCCESS and "admin_comment" not in retag.after


# --------------------------------------------------------------------------- a stale listing prefers nothing


def write_listing(path: Path, lines: str, age_s: float = 0.0) -> None:
    """The published-features file as the publisher writes it, `age_s` seconds ago."""
    path.write_text(f"# written {int(time.time() - age_s)}\n{lines}")


def test_a_stale_or_headerless_listing_prefers_nothing(tmp_path: Path) -> None:
    # After a slurmctld restart Slurm has forgotten model_X; a listing no live publisher renewed
    # still names it, and Slurm rejects a --prefer naming a feature no node has.
    hook = runtime_for(tmp_path)
    listing = tmp_path / "published-features.txt"
    job = {"comment": "aigc:type=infer,model=llama3-8b", "tres_per_node": "gres:gpu:1"}
    write_listing(listing, "model_llama3-8b a100\n")
    assert submit(hook, **job).changes["prefer"] == (None, "model_llama3-8b")
    # Shipped: scoring.interval_s 30 on a 10 s controller tick, refresh_seconds 0 here -> 90 s.
    write_listing(listing, "model_llama3-8b a100\n", age_s=89)
    assert submit(hook, **job).changes["prefer"] == (None, "model_llama3-8b")
    for stale in ("# written 1000\nmodel_llama3-8b a100\n",  # the publisher stopped long ago
                  "model_llama3-8b a100\n",  # no header: an older publisher
                  f"# written {int(time.time()) + 3600}\nmodel_llama3-8b a100\n",  # a clock an hour ahead
                  "# written soon\nmodel_llama3-8b a100\n"):
        listing.write_text(stale)
        result = submit(hook, **job)
        assert result.accepted and "prefer" not in result.changes, stale
    write_listing(listing, "model_llama3-8b a100\n", age_s=91)
    assert "prefer" not in submit(hook, **job).changes


def test_the_listing_age_bound_follows_the_publisher_interval_and_the_refresh(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, scoring={"interval_s": 300})  # 3 x 300 s
    listing = tmp_path / "published-features.txt"
    job = {"comment": "aigc:type=infer,model=m", "tres_per_node": "gres:gpu:1"}
    write_listing(listing, "model_m\n", age_s=890)
    assert submit(hook, **job).changes["prefer"] == (None, "model_m")
    write_listing(listing, "model_m\n", age_s=910)
    assert "prefer" not in submit(hook, **job).changes



def runtime_for_slurm(tmp_path: Path, version: tuple[int, ...] | None, enabled: Any = "auto") -> HookRuntime:
    """The shipped policy rendered for Slurm `version` (rewrites.whole_as_shards: `enabled`)."""
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["whole_as_shards"] = {"enabled": enabled}
    policy = parse_policy_text(yaml.safe_dump(document), "test-policy.yaml")
    return HookRuntime(render_hook(policy, slurm_version=version))


def test_on_slurm_22_05_a_whole_gpu_at_risk_beside_a_shard_job_asks_for_all_its_shards(tmp_path: Path) -> None:
    # Slurm 22.05 gives a GPU whole while a shard job still runs on it (docs/hook.md); all of a
    # GPU's shards it never hands out beside one. A 13 GiB fine-tune does not fit a t4 beside the
    # 8 GiB shard job the shard rule puts there: it is pinned to t4 as shard:16, a whole t4.
    hook = runtime_for_slurm(tmp_path, (22, 5, 8))
    finetune = submit(hook, comment="aigc:type=finetune,vram=13G", tres_per_node="gres:gpu:1")
    assert finetune.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:16")
    assert finetune.changes["features"] == (None, "t4")
    assert any("whole_as_shards" in message for message in finetune.messages)
    # 60 GiB does not fit an a100 beside a 40 GiB shard job: all of an a100's shards.
    big = submit(hook, comment="aigc:type=finetune,vram=60G", tres_per_node="gres:gpu:1")
    assert big.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:80") and big.changes["features"] == (None, "a100")
    # share=no: a GPU of its own, which all of its shards are, whatever its size.
    alone = submit(hook, comment="aigc:type=infer,vram=30G,share=no", tres_per_node="gres:gpu:1")
    assert alone.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:80")
    # A typed request without vram= (risk unknown): that type's shards, the type kept as a constraint.
    typed = submit(hook, comment="aigc:type=train", tres_per_node="gres:gpu:t4:1")
    assert typed.changes["tres_per_node"] == ("gres:gpu:t4:1", "gres:shard:16") and typed.changes["features"] == (None, "t4")
    # Per job on one node: the count moves to the node, as the shard rule does.
    per_job = submit(hook, comment="aigc:type=finetune,vram=60G", tres_per_job="gres:gpu:1")
    assert per_job.changes["tres_per_job"] == ("gres:gpu:1", None) and per_job.changes["tres_per_node"] == (None, "gres:shard:80")
    # 16 GiB would fill a t4 to the brim (real ones hold 15) and fits an a100 beside any shard job:
    # the t4 is dropped and the job keeps gpu:1.
    brim = submit(hook, comment="aigc:type=finetune,vram=16G", tres_per_node="gres:gpu:1")
    assert "tres_per_node" not in brim.changes and brim.changes["features"] == (None, "a100")


def test_on_slurm_22_05_at_most_two_shard_jobs_share_a_gpu(tmp_path: Path) -> None:
    # 22.05 gives a GPU whole once one of its shard jobs ends, while all the others still run there
    # (three 5-shard jobs on a t4, measured: tests/integration/test_slurm_shards.py). The whole-job
    # risk counts one shard job left, so there a shard job asks for more than a third of a GPU.
    old, new = runtime_for_slurm(tmp_path, (22, 5, 8)), runtime_for_slurm(tmp_path, (24, 11, 5))
    assert new.shard_request("infer", 2.0, {"sm": 0.1}) == (8, ["t4", "a100"], 0.1)  # four per t4
    assert old.shard_request("infer", 2.0, {"sm": 0.1}) == (6, ["t4"], 0.1)  # 16 // 3 + 1: two per t4
    assert new.shard_request("imagegen", 12.0, {"sm": 0.25}) == (20, ["a100"], 0.25)  # four per a100
    assert old.shard_request("imagegen", 12.0, {"sm": 0.25}) == (27, ["a100"], 0.25)  # two per a100
    # The shipped class SM already asks for half a GPU: the same on both releases.
    assert old.shard_request("infer", 7.0) == new.shard_request("infer", 7.0) == (8, ["t4"], 0.5)
    # Through the hook, a light class asks for 6 of a t4's 16 shards, not 2.
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["whole_as_shards"] = {"enabled": True}
    document["rewrites"]["shard"]["expected_sm"]["infer"] = 0.1
    light = HookRuntime(render_hook(parse_policy_text(yaml.safe_dump(document), "test-policy.yaml")))
    result = submit(light, comment="aigc:type=infer,vram=2G", tres_per_node="gres:gpu:1")
    assert result.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:6") and result.changes["features"] == (None, "t4")


def test_on_slurm_22_05_the_risk_bound_is_the_largest_shard_job_the_policy_allows(tmp_path: Path) -> None:
    # With max_sm 0.75 a shard job may hold 60 of an a100's 80 GiB (its SM share of the shards),
    # so a whole 30 GiB job is at risk beside it and asks for all of a GPU's shards; at the
    # shipped 0.5 it fits beside the largest (40 GiB) and keeps gpu:1.
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["whole_as_shards"] = {"enabled": True}
    document["rewrites"]["shard"]["max_sm"] = 0.75
    wide = HookRuntime(render_hook(parse_policy_text(yaml.safe_dump(document), "test-policy.yaml")))
    assert wide.shard_request("infer", 9.0, {"sm": 0.75}) == (60, ["a100"], 0.75)
    job = {"comment": "aigc:type=finetune,vram=30G", "tres_per_node": "gres:gpu:1"}
    assert submit(wide, **job).changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:80")
    assert "tres_per_node" not in submit(runtime_for_slurm(tmp_path, (22, 5, 8)), **job).changes


@pytest.mark.parametrize("fields", [
    {"comment": "aigc:type=imagegen,vram=7G", "tres_per_node": "gres:gpu:1"},  # fits a t4 beside any shard job
    {"comment": "aigc:type=finetune,vram=30G", "tres_per_node": "gres:gpu:1"},  # fits an a100 beside any shard job
    {"comment": "aigc:type=finetune", "tres_per_node": "gres:gpu:1"},  # no vram=: t4 or a100, counts differ
    {"comment": "aigc:type=train,vram=60G", "tres_per_node": "gres:gpu:2"},  # more than one GPU
    {"comment": "aigc:type=finetune,vram=60G", "tres_per_node": "gres:gpu:1", "min_nodes": 2},
    {"comment": "aigc:type=finetune,vram=60G", "tres_per_node": "gres:gpu:1", "mem_per_tres": "gres:gpu:4096"},
    {"name": "notes", "tres_per_node": "gres:gpu:a100:1"},  # an unknown class is left as submitted
])
def test_whole_as_shards_leaves_what_it_cannot_or_need_not_ask_that_way(tmp_path: Path, fields: dict[str, Any]) -> None:
    result = submit(runtime_for_slurm(tmp_path, (22, 5, 8)), **fields)
    assert SHARD_ENTRY not in str(result.changes.get("tres_per_node", ("", ""))[1])


@pytest.mark.parametrize(("version", "enabled", "asks_shards"), [
    ((22, 5, 8), "auto", True), ((24, 5, 1), "auto", True), ((24, 11, 5), "auto", False), ((26, 5, 0), "auto", False),
    (None, "auto", False), ((24, 11, 5), True, True), ((22, 5, 8), False, False),
])
def test_whole_as_shards_auto_follows_the_slurm_release_rendered_for(tmp_path: Path, version: tuple[int, ...] | None,
                                                                     enabled: Any, asks_shards: bool) -> None:
    result = submit(runtime_for_slurm(tmp_path, version, enabled), comment="aigc:type=finetune,vram=60G",
                    tres_per_node="gres:gpu:1")
    assert (result.changes.get("tres_per_node") == ("gres:gpu:1", "gres:shard:80")) is asks_shards


def test_a_retag_never_changes_the_gres_of_a_pending_job_on_22_05(tmp_path: Path) -> None:
    # 22.05 refuses a GRES change in `scontrol update` and fails the whole update.
    record = {"job_state": 0, "comment": "old", "gres": "gres:gpu:1", "name": "job", "min_nodes": 1}
    result = runtime_for_slurm(tmp_path, (22, 5, 8)).modify({"comment": "aigc:type=finetune,vram=30G"}, record,
                                                            modify_uid=ALICE)
    assert not {"tres_per_node", "tres_per_job"} & set(result.changes)
    assert result.changes["features"] == (None, "a100")
