"""The publisher's pure planner split from its daemon: lost static features come back in bulk,
and a cycle's slurmctld reads do not grow with the number of nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_aigc.db import open_database
from slurm_aigc.slurm import NodeInfo, SlurmCli
from slurm_aigc.telemetry.config import ScoringConfig
from slurm_aigc.telemetry.publish_plan import (
    cap_sightings,
    lingering_models,
    listable_models,
    merge_ours,
    plan_cycle,
    remember_static,
    served_model,
)
from slurm_aigc.telemetry.publisher import Publisher
from slurm_aigc.telemetry.store import TelemetryStore
from tests.fakes.slurm import FakeJob, FakeNode, FakeSlurm

AGENT_WROTE = ["a100", "nvlink", "nvlink8", "vram80g"]


@pytest.fixture
def store(tmp_path: Path) -> TelemetryStore:
    return TelemetryStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"))


def node(name: str, *features: str) -> NodeInfo:
    return NodeInfo(name=name, state="IDLE", cpus=32, gres="gpu:a100:8", gres_used="", available_features=features,
                    active_features=features, weight=1, partitions=("gpu",), fields={})


def test_remember_static_restores_a_strict_subset_and_takes_a_new_set() -> None:
    seen, restore = remember_static({}, [node("a", *AGENT_WROTE, "ib"), node("b", "ib")])
    assert seen == {"a": tuple(AGENT_WROTE)} and restore == {}
    seen, restore = remember_static(seen, [node("a", "a100", "ib", "nvfree2")])  # after scontrol reconfigure
    assert restore == {"a": ("nvlink", "nvlink8", "vram80g")} and seen["a"] == tuple(AGENT_WROTE)
    seen, restore = remember_static(seen, [node("a", "h100", "vram80g")])  # the agent published a new set
    assert restore == {} and seen["a"] == ("h100", "vram80g")


def test_merge_ours_replaces_dynamic_and_adds_lost_static_only() -> None:
    merged = merge_ours(("ib", "a100", "nvfree2", "model_x"), ("nvfree4",), ("a100", "vram80g"))
    assert merged == ("ib", "a100", "nvfree4", "vram80g")


def reads(slurm: FakeSlurm, since: int) -> list[list[str]]:
    """slurmctld reads made after call number `since` (updates and `--version` left out)."""
    return [call for call in slurm.calls[since:] if "update" not in call and "--version" not in call]


def test_the_publisher_puts_back_static_features_slurm_forgot(store: TelemetryStore) -> None:
    nodes = [FakeNode(f"a100-{i:02d}", features=["a100"]) for i in range(1, 4)]
    slurm = FakeSlurm(nodes)
    for fake in nodes:
        fake.features = list(AGENT_WROTE)  # what the agents published
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig())
    publisher.tick()
    assert SlurmCli(runner=slurm).run("scontrol", ["reconfigure"]).returncode == 0
    assert all(fake.features == ["a100"] for fake in nodes)
    publisher.tick()
    assert all(set(AGENT_WROTE) <= set(fake.features) for fake in nodes)


@pytest.mark.parametrize("count", [4, 64])
def test_a_cycle_reads_slurm_a_fixed_number_of_times_whatever_the_node_count(store: TelemetryStore, count: int) -> None:
    slurm = FakeSlurm([FakeNode(f"a100-{i:03d}", features=["a100", "nvlink8"]) for i in range(count)])
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig())
    publisher.tick()  # every node gets features and a weight
    assert len(slurm.updates()) == count
    assert len(reads(slurm, 0)) == 3  # nodes, jobs, and nodes again right before the writes
    before = len(slurm.calls)
    publisher.tick()  # nothing changed: two listings, no write
    assert len(reads(slurm, before)) == 2 and len(slurm.updates()) == count


def test_a_job_the_hook_stamped_unknown_serves_no_model() -> None:
    # No `type=` tag and no detection rule called it serving; its owner can rewrite `model=`.
    tagged = "aigc:model=llama"
    assert served_model(FakeJob("1", comment=tagged, admin_comment="aigc_class=unknown").info(), ["infer"]) is None
    assert served_model(FakeJob("2", comment=tagged, admin_comment="aigc_class=train").info(), ["infer"]) is None
    assert served_model(FakeJob("3", comment=tagged, admin_comment="aigc_class=infer").info(), ["infer"]) == "llama"
    assert served_model(FakeJob("4", comment=tagged, admin_comment="").info(), ["infer"]) == "llama"  # never stamped


def test_a_node_never_holds_more_model_features_than_the_cap() -> None:
    linger, grace, now = 300.0, 30.0, 1000.0
    sightings = {("n", "model_a"): now - 100, ("n", "model_b"): now - 50}  # lingering: no job serves them
    served = {"n": {"model_c": 1, "model_d": 3, "model_e": 1}}
    capped = cap_sightings(sightings, served, now, linger, grace, 2)
    # d and c (more jobs than e, then by name) are wanted; a and b leave: unlisted at once, kept on
    # the node a grace more (a hook may have read them), and until then no room for d and c.
    assert capped == {("n", "model_a"): now - linger, ("n", "model_b"): now - linger}
    assert listable_models(capped, now, linger) == set()
    later = cap_sightings(capped, served, now + grace, linger, grace, 2)
    assert lingering_models(later, now + grace, linger + grace) == {"n": {"model_c", "model_d"}}
    assert listable_models(later, now + grace, linger) == {("n", "model_c"), ("n", "model_d")}


def test_plan_cycle_without_history_publishes_the_models_with_most_jobs() -> None:
    jobs = [FakeJob(str(i), "a100-01", comment=f"aigc:type=infer,model={m}", admin_comment="aigc_class=infer").info()
            for i, m in enumerate(["x", "y", "y", "z", "z", "z"])]
    (plan,) = plan_cycle([node("a100-01", "a100")], jobs, {}, {}, ScoringConfig(max_models_per_node=2))
    assert [f for f in plan.features_after or () if f.startswith("model_")] == ["model_y", "model_z"]
