"""The publisher: GRES and comment parsing, feature naming/ownership, planning, and a tick
against a fake Slurm (with `scontrol reconfigure` forgetting updates) and a SQLite store."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_aigc.db import open_database
from slurm_aigc.errors import DatabaseError, SlurmCommandError
from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.controller import Controller
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.slurm import CommandResult, JobInfo, NodeInfo, SlurmCli, job_from_json, node_from_json
from slurm_aigc.telemetry import features as feat
from slurm_aigc.telemetry.config import ScoringConfig
from slurm_aigc.telemetry.gres import (
    alloc_tres_gpus,
    expand_nodes,
    gres_busy_gpus,
    gres_gpu_total,
    gres_indices,
    job_gpu_indices,
    node_gpu_allocations,
    split_gres,
)
from slurm_aigc.telemetry.publish_plan import features_tell_islands, island_layout
from slurm_aigc.telemetry.publisher import (
    Publisher,
    islands_from_features,
    node_view,
    parse_comment_tags,
    plan_cycle,
)
from slurm_aigc.telemetry.records import GpuReading, NodeReading
from slurm_aigc.telemetry.store import Publication, TelemetryStore
from tests.fakes.slurm import FakeJob, FakeNode, FakeSlurm

SHARDS_IDLE = "shard:a100:0(IDX:N/A)"

# --------------------------------------------------------------------------- gres


def test_split_gres_keeps_commas_inside_parentheses() -> None:
    text = "gpu:a100:2(IDX:0-1,4),shard:a100:8(8/80,0/80)"
    assert split_gres(text) == ["gpu:a100:2(IDX:0-1,4)", "shard:a100:8(8/80,0/80)"]
    assert split_gres("(null)") == [] and split_gres("") == []


@pytest.mark.parametrize(
    ("gres", "total"),
    [("gpu:a100:8,shard:a100:640", 8), ("gpu:8(S:0-1)", 8), ("gpu:a100:4(S:0),gpu:t4:2(S:1)", 6),
     ("shard:64", 0), ("(null)", 0), ("gpu:a100:", 0)],
)
def test_gpu_total_from_gres(gres: str, total: int) -> None:
    assert gres_gpu_total(gres) == total


def test_busy_gpus_from_whole_allocations_and_from_shards() -> None:
    assert gres_busy_gpus("gpu:a100:3(IDX:0-1,4)," + SHARDS_IDLE) == (3, frozenset({0, 1, 4}))
    assert gres_busy_gpus("gpu:a100:0(IDX:N/A),shard:a100:30(0/80,20/80,10/80,0/80)") == (2, frozenset({1, 2}))
    # Slurm 22.05 as the local cluster prints it: shards on GPU 0, two whole GPUs 1-2.
    assert gres_busy_gpus("gpu:a100:2(IDX:1-2),shard:a100:1(IDX:0)") == (3, frozenset({0, 1, 2}))
    assert gres_busy_gpus("gpu:t4:0(IDX:N/A),shard:t4:0(IDX:N/A)") == (0, frozenset())
    assert gres_busy_gpus("gpu:a100:2") == (2, frozenset())  # count without indices
    assert alloc_tres_gpus("cpu=4,mem=1G,gres/gpu=2,gres/gpu:a100=2") == 2
    assert alloc_tres_gpus("cpu=4,gres/shard=10") == 0


def _job(job_id: str, state: str, detail: list[tuple[str, str]]) -> JobInfo:
    names = [{"nodename": node} for node, _ in detail]
    return job_from_json({"job_id": int(job_id), "job_state": state, "gres_detail": [g for _, g in detail],
                          "job_resources": {"allocated_nodes": names}})


def test_job_gres_per_node_and_node_allocations() -> None:
    job = _job("7", "RUNNING", [("a100-01", "gpu:a100:2(IDX:0-1)"), ("a100-02", "gpu:a100:1(IDX:5)")])
    assert (job_gpu_indices(job, "a100-01"), job_gpu_indices(job, "a100-02")) == (frozenset({0, 1}), frozenset({5}))
    assert gres_indices("shard:8(8/16,0/16,3/16)") == {0, 2}  # Slurm 24.11's used/total per GPU
    others = [_job("8", "RUNNING", [("a100-02", "shard:a100:10(IDX:3)")]),
              _job("9", "PENDING", [("a100-02", "gpu:a100:1(IDX:6)")])]
    assert node_gpu_allocations([job, *others], "a100-02") == {"7": frozenset({5}), "8": frozenset({3})}
    assert expand_nodes("a100-[01-02],t4-01") == ["a100-01", "a100-02", "t4-01"]
    assert expand_nodes("a100-[01") == [] and expand_nodes("(null)") == []


# --------------------------------------------------------------------------- comments and features


@pytest.mark.parametrize(
    ("comment", "tags"),
    [
        ("aigc:class=infer,model=llama3-8b", {"model": "llama3-8b"}),  # the hook's grammar: no key class
        ("aigc:type=infer,model=llama3-8b,vram=20G", {"type": "infer", "model": "llama3-8b", "vram": "20G"}),
        ("nightly run aigc:model=sdxl;class=train trailing words", {"model": "sdxl_class_train"}),  # `,` splits, not `;`
        ("aigc_class=infer aigc:model=qwen2", {"model": "qwen2"}),
        ("model=not-ours aigc: garbage=== ,,=x", {}),
        ("", {}),
        ("aigc:model=", {}),
    ],
)
def test_comment_tags_read_only_aigc_pairs(comment: str, tags: dict[str, str]) -> None:
    assert parse_comment_tags(comment) == tags


def test_feature_names() -> None:
    assert feat.gpu_type_feature("NVIDIA A100-SXM4-80GB") == "a100"
    assert feat.gpu_type_feature("Tesla T4") == "t4"
    assert feat.gpu_type_feature("NVIDIA H100 80GB HBM3") == "h100"
    assert feat.gpu_type_feature("NVIDIA GeForce RTX 3090") == "rtx3090"
    assert feat.gpu_type_feature("NVIDIA L40S") == "l40s"
    assert feat.gpu_type_feature(None) is None
    assert [feat.memory_class_feature(m) for m in (81920, 15360, 46068, 143771, 24576)] == [
        "vram80g", "vram16g", "vram48g", "vram141g", "vram24g"]
    assert feat.nvlink_features([[0, 1, 2, 3, 4, 5, 6, 7]]) == ("nvlink", "nvlink8")
    assert feat.nvlink_features([[0], [1]]) == ()
    assert feat.nvfree_features(6) == ("nvfree2", "nvfree4", "nvfree6")
    assert feat.nvfree_features(8) == ("nvfree2", "nvfree4", "nvfree8")
    assert feat.nvfree_features(1) == ()
    assert feat.model_feature("meta-llama/Llama-3 8B!") == "model_meta-llama_Llama-3_8B"
    assert feat.model_feature("///") is None


def test_merge_never_drops_foreign_features() -> None:
    current = ("ib", "a100", "nvfree8", "model_old", "rack7")
    merged = feat.merge_features(current, ["nvfree4", "model_new"], feat.is_dynamic_feature)
    assert merged == ("ib", "a100", "rack7", "model_new", "nvfree4")
    static = feat.merge_features(merged, ["a100", "vram80g"], feat.is_static_feature)
    assert static == ("ib", "rack7", "model_new", "nvfree4", "a100", "vram80g")


def test_islands_from_the_agents_nvlink_feature() -> None:
    assert islands_from_features(8, ["a100", "nvlink8"]) == [list(range(8))]
    assert islands_from_features(8, ["nvlink", "nvlink4"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert islands_from_features(4, ["t4"]) == [[0], [1], [2], [3]]
    # Slurm's indices count MIG instances on a `mig` node: no island, whatever else is listed.
    assert islands_from_features(4, ["mig", "nvlink4"]) == [[0], [1], [2], [3]]
    assert island_layout(4, ["mig", "nvlink4"], [[0, 1, 2, 3]]) == [[0], [1], [2], [3]]
    assert island_layout(4, ["nvlink2"], [[0, 1, 2, 3]]) == [[0, 1, 2, 3]]
    assert island_layout(4, ["nvlink2"], None) == [[0, 1], [2, 3]]
    assert [features_tell_islands(f) for f in (["mig"], ["nvlink2"], ["a100", "nvlink"])] == [True, True, False]


def test_the_agent_publishes_only_an_island_size_the_publisher_reads_back_truly() -> None:
    # The publisher knows a node's islands only as runs of N consecutive indices (nvlink<N>).
    assert feat.consecutive_islands([[0, 1, 2, 3], [4, 5, 6, 7]], 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert feat.consecutive_islands([[0, 1, 2], [3]], 4) == [[0, 1, 2], [3]]
    # Bridges pairing GPU0-GPU2 and GPU1-GPU3: runs of 2 would be [0, 1] and [2, 3], no link in either.
    crossed = feat.consecutive_islands([[0, 2], [1, 3]], 4)
    assert crossed == [[0], [1], [2], [3]] and feat.nvlink_features(crossed) == ()
    # Eight linked GPUs in two cliques of 4 numbered apart: only runs of 2 hold.
    assert feat.consecutive_islands([[0, 1, 4, 5], [2, 3, 6, 7]], 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # MIG GPUs (skipped) leave the whole ones their island.
    assert feat.consecutive_islands([list(range(8))], 8, skip={0, 1, 2, 3}) == [[4, 5, 6, 7]]
    for islands, count in (([[0, 2], [1, 3]], 4), ([[0, 1, 4, 5], [2, 3, 6, 7]], 8), ([[0, 1, 2, 3], [4, 5, 6, 7]], 8)):
        published = feat.nvlink_features(feat.consecutive_islands(islands, count))
        read_back = islands_from_features(count, list(published))
        assert all(any(set(run) <= set(island) for island in islands) for run in read_back if len(run) > 1)


def test_no_nvfree_on_a_node_with_mig_gpus() -> None:
    # Slurm's GPU indices count MIG instances there: free instances are no NVLink island.
    fake = FakeNode("dgx-01", features=["a100", "mig", "nvlink", "nvlink4"], gres="gpu:8", gres_used="gpu:0(IDX:N/A)")
    node = node_from_json(fake.record(new=False))
    assert node_view(node, 0.0, frozenset()).free_nvlink_set == 1
    assert node_view(node, 0.0, frozenset(), [[0, 1, 2, 3], [4, 5, 6, 7]]).free_nvlink_set == 1  # remembered
    whole = node_from_json(FakeNode("dgx-02", features=["a100", "nvlink", "nvlink4"], gres="gpu:8",
                                    gres_used="gpu:0(IDX:N/A)").record(new=False))
    assert node_view(whole, 0.0, frozenset()).free_nvlink_set == 4


def test_node_view_free_sets_from_gres_used() -> None:
    fake = FakeNode("a100-01", features=["a100", "nvlink8"], gres_used="gpu:a100:2(IDX:0-1)," + SHARDS_IDLE)
    view = node_view(node_from_json(fake.record(new=False)), 30.0, frozenset())
    assert (view.gpus_total, view.gpus_alloc, view.free_nvlink_set) == (8, 2, 6)
    # Without GresUsed (`scontrol show node` without -d) the count comes from AllocTRES.
    fake.alloc_gpus, fake.gres_used = 3, ""
    plain = node_view(node_from_json(fake.record(new=False)), None, frozenset())
    assert (plain.gpus_alloc, plain.free_nvlink_set) == (3, 5)


# --------------------------------------------------------------------------- planning (pure)


def nodes_of(fakes: list[FakeNode]) -> list[NodeInfo]:
    return [node_from_json(f.record(new=False)) for f in fakes]


def test_plan_cycle_publishes_features_and_weights_and_models() -> None:
    fakes = [
        FakeNode("a100-01", features=["a100", "nvlink8", "ib"]),
        FakeNode("a100-02", features=["a100", "nvlink8"], gres_used="gpu:a100:2(IDX:0-1)," + SHARDS_IDLE),
        FakeNode("cpu-01", gres="(null)", gres_used="(null)"),
    ]
    jobs = [FakeJob("11", "a100-02", comment="aigc:class=infer,model=llama3-8b", admin_comment=""),
            FakeJob("12", "a100-02", comment="aigc:type=train,model=not-served", admin_comment="aigc_class=train"),
            FakeJob("14", "a100-02", comment="aigc:type=infer,model=sdxl,vram=20G", state="COMPLETED", admin_comment=""),
            FakeJob("15", "a100-01", comment="aigc:model=whisper", admin_comment="aigc_class=train"),
            FakeJob("13", "a100-01", comment="aigc:model=qwen", state="PENDING", admin_comment="")]
    fake_slurm = FakeSlurm(fakes, jobs)
    slurm_jobs = SlurmCli(runner=fake_slurm).jobs()
    plans = {p.node: p for p in plan_cycle(nodes_of(fakes), slurm_jobs, {"a100-01": 80.0, "a100-02": 10.0}, {},
                                            ScoringConfig())}
    assert set(plans) == {"a100-01", "a100-02"}  # a CPU node is left alone
    assert plans["a100-01"].features_after == ("a100", "nvlink8", "ib", "nvfree2", "nvfree4", "nvfree8")
    assert plans["a100-02"].features_after == ("a100", "nvlink8", "model_llama3-8b", "nvfree2", "nvfree4", "nvfree6")
    assert plans["a100-01"].weight_after is not None and plans["a100-02"].weight_after is not None


def test_hysteresis_and_reassert() -> None:
    fake = FakeNode("a100-01", features=["a100", "nvlink8", "nvfree2", "nvfree4", "nvfree8"], weight=50)
    config = ScoringConfig(hysteresis=10, policies={"cool_first": 1.0})
    nodes = nodes_of([fake])
    # cool_first with 48 % util wants round(100 - 0.52*99) = 49: within the band of the 50 we wrote -> nothing.
    assert plan_cycle(nodes, [], {"a100-01": 48.0}, {"a100-01": 50}, config) == []
    # 30 % wants round(100 - 0.70*99) = 31: outside the band -> written.
    (plan,) = plan_cycle(nodes, [], {"a100-01": 30.0}, {"a100-01": 50}, config)
    assert (plan.weight_before, plan.weight_after, plan.features_after) == (50, 31, None)
    # Slurm shows 1 after a reconfigure although we wrote 49: re-assert even inside the band.
    fake.weight = 1
    (plan,) = plan_cycle(nodes_of([fake]), [], {"a100-01": 48.0}, {"a100-01": 49}, config)
    assert plan.weight_after == 49 and "re-assert" in plan.reason


def test_thousand_nodes_plan_in_well_under_a_second() -> None:
    # A correctness check at scale (every node planned once); the timing target lives in the benchmark.
    fakes = [FakeNode(f"gpu-{i:04d}", features=["a100", "nvlink8"]) for i in range(1000)]
    plans = plan_cycle(nodes_of(fakes), [], {}, {}, ScoringConfig())
    assert len(plans) == 1000 and all(p.features_after for p in plans)


# --------------------------------------------------------------------------- the daemon part


@pytest.fixture
def store(tmp_path: Path) -> TelemetryStore:
    return TelemetryStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"))


def add_util(store: TelemetryStore, node: str, util: float, ts: float) -> None:
    gpus = tuple(GpuReading(index=i, sm_util_pct=util, memory_total_mib=81920.0) for i in range(8))
    reading = NodeReading(node, datetime.fromtimestamp(ts, UTC), "sim", gpus)
    store.write_poll(reading, {}, [])


def test_tick_writes_then_stays_quiet_then_reasserts_after_reconfigure(store: TelemetryStore) -> None:
    now = time.time()
    fakes = [FakeNode("a100-01", features=["a100", "ib"]), FakeNode("a100-02", features=["a100", "nvlink8"])]
    slurm = FakeSlurm(fakes, [FakeJob("5", "a100-01", comment="aigc:class=infer,model=sdxl", admin_comment="")])
    add_util(store, "a100-01", 90.0, now - 10)
    add_util(store, "a100-02", 5.0, now - 10)
    add_util(store, "a100-02", 95.0, now - 3600)  # outside the window: ignored
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(), clock=lambda: now)

    first = publisher.tick()
    assert {p.node for p in first} == {"a100-01", "a100-02"}
    assert slurm.nodes["a100-01"].features[:2] == ["a100", "ib"]  # admin features kept, first
    assert "model_sdxl" in slurm.nodes["a100-01"].features and "nvfree8" in slurm.nodes["a100-02"].features
    assert slurm.nodes["a100-01"].weight > slurm.nodes["a100-02"].weight  # busier -> higher weight

    updates = len(slurm.updates())
    assert publisher.tick() == [] and len(slurm.updates()) == updates

    slurm.nodes["a100-02"].conf_features = ["a100"]  # nvlink8 came from the agent's `scontrol update`
    SlurmCli(runner=slurm).reconfigure()
    assert slurm.nodes["a100-01"].features == ["a100", "ib"] and slurm.nodes["a100-01"].weight == 1
    again = publisher.tick()
    assert {p.node for p in again} == {"a100-01", "a100-02"}
    assert "model_sdxl" in slurm.nodes["a100-01"].features and slurm.nodes["a100-01"].weight > 1
    assert "nvfree8" in slurm.nodes["a100-02"].features  # islands remembered while the agent's feature is gone

    records = store.publications("a100-01")
    assert len(records) == 2 and not any(r.dry_run for r in records)
    assert records[1].weight_before == 1 and records[1].features_before == ("a100", "ib")


def test_a_mig_node_gets_no_nvfree_after_a_reconfigure_either(store: TelemetryStore) -> None:
    # GPUs 0-3 in MIG mode, 4-7 whole: the agent publishes mig and nvlink4. A reconfigure drops
    # both; the islands remembered from nvlink4 must not come back on indices that count instances.
    fake = FakeNode("dgx-01", features=["a100", "mig", "nvlink", "nvlink4"], gres="gpu:8", gres_used="gpu:0(IDX:N/A)")
    slurm = FakeSlurm([fake])
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig())
    publisher.tick()
    assert not any(f.startswith("nvfree") for f in slurm.nodes["dgx-01"].features)
    fake.conf_features = ["a100"]
    SlurmCli(runner=slurm).reconfigure()
    publisher.tick()
    assert "mig" in slurm.nodes["dgx-01"].features  # the static features put back ...
    assert not any(f.startswith("nvfree") for f in slurm.nodes["dgx-01"].features)  # ... and no nvfree


def test_a_restarted_publisher_remembers_its_weights(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100"])])
    Publisher(SlurmCli(runner=slurm), store, ScoringConfig()).tick()
    written = slurm.nodes["a100-01"].weight
    slurm.nodes["a100-01"].weight = written + 2  # e.g. restored from slurm.conf by a restart
    Publisher(SlurmCli(runner=slurm), store, ScoringConfig(hysteresis=50)).tick()
    assert slurm.nodes["a100-01"].weight == written


def test_features_the_agent_wrote_meanwhile_survive_the_write(store: TelemetryStore) -> None:
    fake = FakeNode("a100-01", features=["a100"])
    slurm = FakeSlurm([fake], [FakeJob("3", "a100-01", comment="aigc:model=whisper", admin_comment="")])
    original = slurm.__call__
    node_reads: list[str] = []

    def runner(argv, timeout_s, stdin=None):  # type: ignore[no-untyped-def]
        if list(argv) == ["sinfo", "--json"]:  # 22.05: SlurmCli.nodes() reads sinfo --json
            node_reads.append(argv[-1])
            if len(node_reads) == 2:  # the re-read right before the write, after planning
                fake.features = ["a100", "nvlink8", "vram80g"]
        return original(argv, timeout_s, stdin)

    Publisher(SlurmCli(runner=runner), store, ScoringConfig()).tick()
    assert fake.features == ["a100", "nvlink8", "vram80g", "model_whisper"]


def test_dry_run_writes_nothing_and_records_each_change_once(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "nvlink8"])])
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(), dry_run=True)
    assert len(publisher.tick()) == 1
    assert publisher.tick() == []
    assert slurm.updates() == [] and slurm.nodes["a100-01"].features == ["a100", "nvlink8"]
    (record,) = store.publications()
    assert record.dry_run and "nvfree8" in (record.features_after or ())
    publisher.set_config(ScoringConfig(), dry_run=False)  # reload after going live: what it only simulated, it writes
    assert len(publisher.tick()) == 1
    assert "nvfree8" in slurm.nodes["a100-01"].features and len(slurm.updates()) == 1


def test_a_slurm_outage_fails_the_tick_for_the_loop_to_back_off(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01")])
    slurm.down = True
    with pytest.raises(Exception, match="Unable to contact"):
        Publisher(SlurmCli(runner=slurm), store, ScoringConfig()).tick()


def listed(listing: Path) -> str:
    """The published-features file without its `# written <epoch>` header."""
    header, _, rest = listing.read_text().partition("\n")
    assert header.startswith("# written ")
    return rest


def test_model_lingers_then_is_unlisted_a_grace_before_slurm_loses_it(store: TelemetryStore, tmp_path: Path) -> None:
    listing = tmp_path / "published-features.txt"
    job = FakeJob("5", "a100-01", comment="aigc:type=infer,model=sdxl aigc_class=infer", admin_comment="")
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100"])], [job])
    config = ScoringConfig(published_features_file=str(listing), model_linger_s=100, model_unlist_grace_s=30)
    now = [1000.0]
    publisher = Publisher(SlurmCli(runner=slurm), store, config, clock=lambda: now[0])
    publisher.tick()
    assert listed(listing) == "model_sdxl a100\n" and "model_sdxl" in slurm.nodes["a100-01"].features

    job.state = "COMPLETED"
    now[0] += 99  # within the linger: still a feature, still listed (its cache is warm there)
    publisher.tick()
    assert listed(listing) == "model_sdxl a100\n" and "model_sdxl" in slurm.nodes["a100-01"].features

    now[0] += 2  # past the linger: unlisted first, the feature stays while hooks re-read the list
    publisher.tick()
    assert listed(listing) == "" and "model_sdxl" in slurm.nodes["a100-01"].features

    seen_while_removing: list[str] = []
    original = slurm._update_node

    def update(args: list[str], values: dict[str, str]):  # type: ignore[no-untyped-def]
        seen_while_removing.append(listed(listing))  # what the hook could read during the write
        return original(args, values)

    slurm._update_node = update  # type: ignore[method-assign]
    now[0] += 30  # past linger + grace: removed, never listed while Slurm drops it
    publisher.tick()
    assert seen_while_removing and set(seen_while_removing) == {""}
    assert "model_sdxl" not in slurm.nodes["a100-01"].features

    dry = tmp_path / "dry.txt"
    job.state = "RUNNING"
    Publisher(SlurmCli(runner=slurm), store, ScoringConfig(published_features_file=str(dry)), dry_run=True).tick()
    assert not dry.exists()


def test_a_model_served_elsewhere_does_not_keep_a_lingering_node_listed(store: TelemetryStore, tmp_path: Path) -> None:
    # Seen in the 16-node replay: model X ran on an a100 and still runs on a t4; the a100's
    # line stayed listed until Slurm dropped the feature, and a hook that had read
    # `model_X a100` added --prefer a100&model_X, which Slurm refused.
    listing = tmp_path / "published-features.txt"
    on_a100 = FakeJob("5", "a100-01", comment="aigc:type=infer,model=sd aigc_class=infer", admin_comment="")
    on_t4 = FakeJob("6", "t4-01", comment="aigc:type=infer,model=sd aigc_class=infer", admin_comment="")
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100"]), FakeNode("t4-01", features=["t4"])], [on_a100, on_t4])
    config = ScoringConfig(published_features_file=str(listing), model_linger_s=100, model_unlist_grace_s=30)
    now = [1000.0]
    publisher = Publisher(SlurmCli(runner=slurm), store, config, clock=lambda: now[0])
    publisher.tick()
    assert listed(listing) == "model_sd a100\nmodel_sd t4\n"

    on_a100.state = "COMPLETED"
    now[0] += 101  # past the a100's linger; the t4 still serves the model
    publisher.tick()
    assert listed(listing) == "model_sd t4\n" and "model_sd" in slurm.nodes["a100-01"].features
    now[0] += 30
    publisher.tick()
    assert "model_sd" not in slurm.nodes["a100-01"].features and listed(listing) == "model_sd t4\n"


def test_restarted_publisher_unlists_unserved_models_before_removing_them(store: TelemetryStore, tmp_path: Path) -> None:
    listing = tmp_path / "published-features.txt"
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "model_old"])])
    config = ScoringConfig(published_features_file=str(listing), model_linger_s=100, model_unlist_grace_s=30)
    now = [1000.0]
    publisher = Publisher(SlurmCli(runner=slurm), store, config, clock=lambda: now[0])
    publisher.tick()
    assert "model_old" in slurm.nodes["a100-01"].features and "model_old" not in listing.read_text()
    now[0] += 31
    publisher.tick()
    assert "model_old" not in slurm.nodes["a100-01"].features


def test_tick_when_due_honours_the_scoring_interval(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "nvlink8"])])
    now = [100.0]
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(interval_s=30), monotonic=lambda: now[0])
    assert publisher.tick_when_due()  # first cycle runs and writes
    slurm.nodes["a100-01"].features = ["a100", "nvlink8"]  # something Slurm forgot meanwhile
    now[0] += 29
    assert publisher.tick_when_due() == [] and "nvfree8" not in slurm.nodes["a100-01"].features
    now[0] += 1
    assert publisher.tick_when_due() and "nvfree8" in slurm.nodes["a100-01"].features


def test_one_failing_node_does_not_starve_the_others(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "nvlink8"]), FakeNode("a100-02", features=["a100", "nvlink8"])],
                      fail={"scontrol update NodeName=a100-01 ": "slurm_update error: Invalid node name specified"})
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig())
    with pytest.raises(SlurmCommandError, match="Invalid node name"):
        publisher.tick()
    assert "nvfree8" in slurm.nodes["a100-02"].features
    assert [p.node for p in store.publications()] == ["a100-02"]


class TimedOutSlurm(FakeSlurm):
    """`scontrol update` gives up waiting (run_command's timeout); slurmctld applied it when `applied`."""

    def __init__(self, nodes: Sequence[FakeNode], applied: bool) -> None:
        super().__init__(nodes)
        self.applied = applied

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        if "update" not in argv:
            return super().__call__(argv, timeout_s, stdin)
        if self.applied:
            super().__call__(argv, timeout_s, stdin)
        else:
            self.calls.append(list(argv))
        raise SlurmCommandError(argv, None, f"no answer within {timeout_s:.0f} s")


@pytest.mark.parametrize("applied", [True, False])
def test_a_timed_out_write_stays_on_record_when_slurm_shows_it(store: TelemetryStore, applied: bool) -> None:
    slurm = TimedOutSlurm([FakeNode("a100-01", features=["a100", "nvlink8"])], applied)
    with pytest.raises(SlurmCommandError, match="timed out"):  # a failure all the same, as before
        Publisher(SlurmCli(runner=slurm), store, ScoringConfig()).tick()
    node = slurm.nodes["a100-01"]
    assert ("nvfree8" in node.features) is applied
    assert [(p.features_after, p.weight_after) for p in store.publications("a100-01")] == (
        [(tuple(node.features), node.weight)] if applied else [])
    reads_after = slurm.calls[slurm.calls.index(slurm.updates()[0]) + 1:]
    assert len(reads_after) == 1  # one re-read of the node, only after the timeout


def test_a_change_that_cannot_be_recorded_is_not_written(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "nvlink8"]), FakeNode("a100-02", features=["a100", "nvlink8"])])

    def refused(_publication: Publication) -> int:
        raise DatabaseError("cannot write node_publications: server has gone away")

    store.record_publication = refused  # type: ignore[method-assign]
    with pytest.raises(DatabaseError, match="gone away"):
        Publisher(SlurmCli(runner=slurm), store, ScoringConfig()).tick()
    assert slurm.updates() == []  # recorded before it is done: nothing unrecorded reached Slurm


def test_writes_per_cycle_are_capped_and_the_rest_follow_in_later_cycles(store: TelemetryStore) -> None:
    # After `scontrol reconfigure` every node lacks what we wrote: not all in one burst.
    slurm = FakeSlurm([FakeNode(f"a100-{i:02d}", features=["a100", "nvlink8"]) for i in range(1, 6)])
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(max_writes_per_cycle=2))
    assert [len(publisher.tick()) for _ in range(4)] == [2, 2, 1, 0]
    assert len(slurm.updates()) == 5 and all("nvfree8" in node.features for node in slurm.nodes.values())


def test_a_cycle_given_a_job_listing_lists_no_jobs_and_plans_from_it(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "nvlink8"])])  # Slurm itself lists no job
    served = job_from_json(FakeJob("5", "a100-01", comment="aigc:class=infer,model=sdxl", admin_comment="").record(False))
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(), dry_run=True)
    plans = publisher.tick([served])
    assert [c for c in slurm.calls if "--version" not in c] == [["sinfo", "--json"]]
    assert "model_sdxl" in (plans[0].features_after or ())


def test_a_cycle_given_both_listings_reads_nothing_from_slurm(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "nvlink8"])])
    nodes = SlurmCli(runner=slurm).nodes()
    served = job_from_json(FakeJob("5", "a100-01", comment="aigc:class=infer,model=sdxl", admin_comment="").record(False))
    before = len(slurm.calls)
    plans = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(), dry_run=True).tick([served], nodes)
    assert [c for c in slurm.calls[before:] if "--version" not in c] == []
    assert "model_sdxl" in (plans[0].features_after or ())


def test_a_cycle_keeps_its_node_listing_for_the_controller(store: TelemetryStore) -> None:
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "nvlink8"]), FakeNode("t4-01", gres="gpu:t4:4")])
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(), dry_run=True)
    assert publisher.last_nodes is None
    publisher.tick()
    first = publisher.last_nodes
    assert first is not None and [(n.name, n.gres) for n in first] == [("a100-01", "gpu:a100:8,shard:a100:640"),
                                                                        ("t4-01", "gpu:t4:4")]
    publisher.tick()
    assert publisher.last_nodes is not first  # a new listing: the controller tells them apart by identity


def test_controller_and_publisher_together_list_the_jobs_once_per_tick(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100", "nvlink8"])],
                      [FakeJob("5", "a100-01", comment="aigc:class=infer,model=sdxl", admin_comment="", gpus=0)])
    cli = SlurmCli(runner=slurm)  # a job holding no GPU: reclaim waits for no GPU samples of it
    publisher = Publisher(cli, TelemetryStore(open_database(url)), ScoringConfig(), dry_run=True)
    controller = Controller(cli, ReclaimStore(open_database(url)), ReclaimConfig(dry_run=True),
                            publisher_tick=publisher.tick)
    controller.tick()
    assert [c for c in slurm.calls if "--version" not in c] == [["squeue", "--json"], ["sinfo", "--json"]]
    assert "model_sdxl" in store_features(url, "a100-01")


def store_features(url: str, node: str) -> tuple[str, ...]:
    """The features the (dry-run) publisher recorded for `node` last."""
    records = TelemetryStore(open_database(url)).publications(node)
    return records[-1].features_after or () if records else ()


def test_a_dry_run_cycle_records_its_changes_in_one_transaction(tmp_path: Path) -> None:
    class CountingStore(TelemetryStore):
        calls: list[int] = []

        def record_publications(self, publications: Sequence[Publication]) -> None:
            self.calls.append(len(publications))
            super().record_publications(publications)

    store = CountingStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"))
    slurm = FakeSlurm([FakeNode(f"a100-0{i}", features=["a100", "nvlink8"]) for i in range(1, 4)])
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(), dry_run=True)
    plans = publisher.tick()
    assert publisher.tick() == [] and store.calls == [3]  # nothing changed in the second cycle: no transaction
    assert [(r.node, r.features_after, r.weight_after, r.dry_run) for r in store.publications()] == [
        (p.node, p.features_after, p.weight_after, True) for p in plans]


# --------------------------------------------------------------------------- review fixes


def test_every_live_cycle_renews_the_listing_header_and_a_failed_one_does_not(store: TelemetryStore,
                                                                              tmp_path: Path) -> None:
    # The hook prefers nothing from a listing whose header is too old: after a slurmctld restart
    # Slurm has forgotten the model features, and only a live publisher puts them back.
    listing = tmp_path / "published-features.txt"
    job = FakeJob("5", "a100-01", comment="aigc:type=infer,model=sdxl", admin_comment="aigc_class=infer")
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100"])], [job])
    now = [1000.0]
    config = ScoringConfig(published_features_file=str(listing))
    publisher = Publisher(SlurmCli(runner=slurm), store, config, clock=lambda: now[0])
    for _ in range(3):  # nothing changes after the first cycle: the header is renewed anyway
        publisher.tick()
        assert listing.read_text() == f"# written {int(now[0])}\nmodel_sdxl a100\n"
        now[0] += 30.7
    slurm.down = True  # slurmctld stopped: the cycle fails, the file keeps its old time
    with pytest.raises(SlurmCommandError):
        publisher.tick()
    assert listing.read_text().startswith("# written 1061\n")


def test_the_write_cap_reaches_every_node_least_recently_written_first(store: TelemetryStore) -> None:
    # Five nodes that differ from Slurm every cycle, two writes a cycle: in Slurm's order the
    # last three were never written.
    fakes = [FakeNode(f"a100-{i:02d}", features=["a100", "nvlink8"]) for i in range(1, 6)]
    slurm = FakeSlurm(fakes)
    publisher = Publisher(SlurmCli(runner=slurm), store, ScoringConfig(max_writes_per_cycle=2))
    written: list[str] = []
    for _ in range(3):
        for fake in fakes:
            fake.features = ["a100", "nvlink8"]  # Slurm forgot what we wrote (reconfigure)
        before = len(slurm.updates())
        publisher.tick()
        written += [call[2].removeprefix("NodeName=") for call in slurm.updates()[before:]]
    assert written[:2] == ["a100-01", "a100-02"] and len(written) == 6
    assert set(written) == {fake.name for fake in fakes}


def test_the_publisher_keeps_the_active_features_a_node_features_plugin_chose(store: TelemetryStore) -> None:
    fake = FakeNode("a100-01", features=["a100", "nvlink8", "mode_a", "mode_b"])
    slurm = FakeSlurm([fake])

    def runner(argv, timeout_s, stdin=None):  # type: ignore[no-untyped-def]
        answer = slurm(argv, timeout_s, stdin)
        if list(argv) == ["sinfo", "--json"]:  # node_features/helpers: booted in mode_a
            document = json.loads(answer.stdout)
            record = document["nodes"][0]
            record["active_features"] = ",".join(f for f in record["features"].split(",") if f != "mode_b")
            answer = replace(answer, stdout=json.dumps(document))
        return answer

    Publisher(SlurmCli(runner=runner), store, ScoringConfig()).tick()
    (update,) = slurm.updates()
    assert "AvailableFeatures=a100,nvlink8,mode_a,mode_b,nvfree2,nvfree4,nvfree8" in update
    assert "ActiveFeatures=a100,nvlink8,mode_a,nvfree2,nvfree4,nvfree8" in update


def test_an_owner_rewriting_model_each_cycle_cannot_grow_a_nodes_features(store: TelemetryStore,
                                                                           tmp_path: Path) -> None:
    listing = tmp_path / "published-features.txt"
    stamped = "aigc_class=infer"
    served = [FakeJob(str(i), "a100-01", comment="aigc:type=infer,model=llama", admin_comment=stamped) for i in (1, 2)]
    churn = FakeJob("3", "a100-01", comment="aigc:type=infer,model=m0", admin_comment=stamped)
    unknown = FakeJob("4", "a100-01", comment="aigc:model=not-serving", admin_comment="aigc_class=unknown")
    slurm = FakeSlurm([FakeNode("a100-01", features=["a100"])], [*served, churn, unknown])
    config = ScoringConfig(published_features_file=str(listing), max_models_per_node=3, model_linger_s=300,
                           model_unlist_grace_s=30)
    now = [1000.0]
    publisher = Publisher(SlurmCli(runner=slurm), store, config, clock=lambda: now[0])
    for cycle in range(20):
        churn.comment = f"aigc:type=infer,model=m{cycle}"  # `scontrol update JobId=3 Comment=...` by its owner
        publisher.tick()
        models = [f for f in slurm.nodes["a100-01"].features if f.startswith("model_")]
        assert len(models) <= 3 and "model_llama" in models and "model_not-serving" not in models
        listed_models = [line.split()[0] for line in listed(listing).splitlines()]
        assert set(listed_models) <= set(models)
        now[0] += 30
    assert "model_m19" in models  # the newest name is served; the older ones left a grace after unlisting
