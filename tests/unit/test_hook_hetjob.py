"""Heterogeneous jobs: only an sbatch hetjob's leader carries the script (Slurm's sbatch.c), so a
later component arrives at job_submit without one and must not pass for srun/salloc."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurm_aigc.policy.hookruntime import NO_VAL, SUCCESS, HookResult, HookRuntime
from slurm_aigc.tags import trusted_class
from tests.unit.test_hook_rules import ALICE, SCRIPT, runtime_for


@pytest.fixture
def hook(tmp_path: Path) -> HookRuntime:
    return runtime_for(tmp_path)


def component(hook: HookRuntime, offset: int | None, script: str | None, **fields: Any) -> HookResult:
    """One component as slurmctld hands it to job_submit: `het_job_offset` NO_VAL outside a hetjob."""
    desc = {"name": "job", "user_id": ALICE, "het_job_offset": offset, "script": script, **fields}
    return hook.submit(desc, submit_uid=ALICE)


def test_the_gpu_component_of_an_sbatch_hetjob_is_not_interactive(hook: HookRuntime) -> None:
    # #SBATCH -n1 / #SBATCH hetjob / #SBATCH --gres=gpu:8: the leader has the script, the GPUs do not.
    leader = component(hook, 0, SCRIPT)
    gpus = component(hook, 1, None, tres_per_node="gres:gpu:8")
    assert leader.job_class == "unknown" and gpus.job_class == "unknown"
    assert trusted_class(gpus.after["admin_comment"]) == "unknown"  # reclaimable, not exempt


def test_a_later_component_is_classed_by_the_other_rules(hook: HookRuntime) -> None:
    named = component(hook, 2, None, name="llama-pretrain", tres_per_node="gres:gpu:8")
    assert named.rc == SUCCESS and named.job_class == "train"
    tagged = component(hook, 1, None, comment="aigc:type=infer,vram=20G", tres_per_node="gres:gpu:1")
    assert tagged.job_class == "infer" and tagged.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:40")


def test_a_later_component_cannot_claim_to_be_interactive(hook: HookRuntime) -> None:
    result = component(hook, 1, None, comment="aigc:type=interactive", tres_per_node="gres:gpu:8")
    assert result.job_class == "unknown" and trusted_class(result.after["admin_comment"]) == "unknown"
    assert any("type=interactive" in m for m in result.messages)


@pytest.mark.parametrize("offset", [NO_VAL, 0, None])  # srun/salloc; a salloc hetjob's leader; harness default
def test_srun_salloc_and_a_salloc_hetjob_leader_stay_interactive(hook: HookRuntime, offset: int | None) -> None:
    result = component(hook, offset, None, tres_per_node="gres:gpu:8")
    assert result.job_class == "interactive" and result.after["admin_comment"] == "aigc_class=interactive"
    assert set(result.changes) == {"admin_comment"}
