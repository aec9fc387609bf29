"""The workload generator: seeded and deterministic, compression and clamps as documented,
trace fields mapped to AIGC classes, every usage pattern well formed, load sized to the cluster."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import pytest

from slurm_aigc.profiles import format_phases
from slurm_aigc.profiles import total_seconds as profile_seconds
from slurm_aigc.replay.generator import (
    GeneratorError,
    GeneratorParams,
    genai_sessions,
    generate,
    with_overrides,
)
from slurm_aigc.replay.traces import (
    DEFAULT_FILES,
    TraceJob,
    read_genai,
    read_openb,
    read_philly,
    read_trace,
)
from slurm_aigc.replay.workload import (
    Workload,
    format_workload,
    parse_workload,
    span_s,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
SHARED_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
ONLY_BUSY = {f"{c}.usage.{k}": "0" for c in ("infer", "imagegen", "train", "finetune") for k in ("bursty", "idle_tail", "over_allocated", "hung")}


def busy_params(**overrides: str) -> GeneratorParams:
    params = with_overrides(GeneratorParams(), {**ONLY_BUSY, **{f"{c}.usage.busy": "1" for c in ("infer", "imagegen", "train", "finetune")}})
    return with_overrides(params, overrides)


def philly_rows(count: int, gap_s: float = 600.0, duration_s: float = 3000.0, gpus: int = 1) -> list[TraceJob]:
    return [TraceJob("philly", i + 2, f"p{i}", 1.5e9 + i * gap_s, duration_s, gpus, group="vc") for i in range(count)]


def fixture_sources() -> dict[str, list[TraceJob]]:
    return {
        "alibaba-2023": list(read_openb(FIXTURES / "openb_pod_list_small.csv").jobs),
        "genai-2026": list(read_genai(FIXTURES / "lora_request_trace_small.csv").jobs),
        "philly": list(read_philly(FIXTURES / "pollux_philly_jobs_small.csv").jobs),
    }


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    sources = fixture_sources()
    first = format_workload(generate(sources, GeneratorParams(seed=11)))
    again = format_workload(generate(fixture_sources(), GeneratorParams(seed=11)))
    other = format_workload(generate(sources, GeneratorParams(seed=12)))
    assert first == again
    assert first != other


def test_arrivals_and_durations_are_divided_by_the_compression_factor() -> None:
    rows = philly_rows(15, gap_s=600.0, duration_s=3000.0)  # one 150 s window at compression 60
    params = busy_params(compression="60", window_start_s="0", load_target="1000", max_jobs="1000", min_duration_s="1")
    workload = generate({"philly": rows}, params)
    assert [j.submit_offset_s for j in workload.jobs] == [10.0 * i for i in range(15)]
    assert {j.duration_s for j in workload.jobs} == {50.0}
    slower = generate({"philly": rows}, dataclasses.replace(params, compression=120.0, arrival_window_s=300.0))
    assert [j.submit_offset_s for j in slower.jobs] == [5.0 * i for i in range(15)]
    assert {j.duration_s for j in slower.jobs} == {25.0}
    assert workload.meta["compression"] == "60"


def test_durations_are_clamped_and_time_limits_are_whole_minutes() -> None:
    rows = [*philly_rows(1, duration_s=10.0), *philly_rows(1, duration_s=1e6)[:0]]
    rows.append(TraceJob("philly", 99, "long", 1.5e9 + 30, 1e6, 1))
    params = busy_params(window_start_s="0", load_target="1000")
    jobs = generate({"philly": rows}, params).jobs
    assert sorted(j.duration_s for j in jobs) == [params.min_duration_s, params.max_duration_s]
    for job in jobs:
        assert job.time_limit_s % 60 == 0
        assert job.time_limit_s >= job.duration_s * params.time_limit_factor


def test_stacked_windows_reach_the_load_target_and_stay_spread() -> None:
    rows = philly_rows(400, gap_s=600.0, duration_s=3000.0)
    params = busy_params(window_start_s="0", load_target="1.0", capacity_gpus="8", max_jobs="1000")
    jobs = generate({"philly": rows}, params).jobs
    demand = sum(j.gpus * j.duration_s for j in jobs)
    budget = 1.0 * 8 * params.arrival_window_s
    assert budget <= demand < budget + 50.0  # the last job kept crosses the budget
    offsets = [j.submit_offset_s for j in jobs]
    assert min(offsets) < 0.25 * params.arrival_window_s and max(offsets) > 0.75 * params.arrival_window_s
    capped = generate({"philly": rows}, dataclasses.replace(params, max_jobs=5)).jobs
    assert len(capped) == 5


def test_openb_rows_map_to_classes_vram_and_tags() -> None:
    params = busy_params(window_start_s="0", load_target="1000", compression="1", arrival_window_s="100000")
    jobs = {j.source: j for j in generate({"alibaba-2023": fixture_sources()["alibaba-2023"]}, params).jobs}
    assert "alibaba-2023:4" not in jobs  # CPU-only pod dropped
    share = jobs["alibaba-2023:3"]  # gpu_milli 460 of a 16 GiB share
    assert (share.job_class, share.gpus, share.vram_gib_per_gpu, share.share) == ("infer", 1, 8.0, "yes")
    assert share.tags.startswith("aigc:type=infer,model=") and "vram=8G" in share.tags and "share=yes" in share.tags
    assert jobs["alibaba-2023:2"].job_class == "infer"  # LS pod holding a whole GPU
    assert jobs["alibaba-2023:13"].job_class == "finetune"  # BE pod holding a whole GPU
    train = jobs["alibaba-2023:6"]
    assert (train.job_class, train.gpus, train.nvlink, train.share) == ("train", 8, "yes", "")
    assert "nvlink=yes" in train.tags
    for job in jobs.values():
        assert job.mem_used_gib_per_gpu <= job.vram_gib_per_gpu
        assert job.user in params.users


def test_philly_sizes_are_capped_at_one_node() -> None:
    params = busy_params(window_start_s="0", load_target="1000", compression="1", arrival_window_s="100000")
    jobs = generate({"philly": fixture_sources()["philly"]}, params).jobs
    assert sorted(j.gpus for j in jobs) == [1, 1, 2, 8, 8]
    assert {j.job_class for j in jobs if j.gpus > 1} == {"train"}
    assert {j.job_class for j in jobs if j.gpus == 1} == {"finetune"}


def test_genai_requests_become_serving_sessions_per_model() -> None:
    rows = fixture_sources()["genai-2026"]
    sessions = genai_sessions(rows, GeneratorParams(genai_session_gap_s=900.0))
    by_model: dict[str, list[float]] = {}
    for session in sessions:
        by_model.setdefault(session.model, []).append(session.duration_s)
    # M0000: two requests 50 s apart, then one 1.5 h later (a new session).
    assert by_model["sd-m0000"] == [70.0, 25.0]
    assert len(by_model["sd-m0001"]) == 1
    first = next(s for s in sessions if s.model == "sd-m0000")
    assert first.vram_gib == math.ceil(6.0 + 0.5 * 1 + 0.5 * 4)  # base + 1 LoRA + 4 images
    assert {s.job_class for s in sessions} == {"imagegen"}
    merged = genai_sessions(rows, GeneratorParams(genai_session_gap_s=1e6))
    assert len([s for s in merged if s.model == "sd-m0000"]) == 1


@pytest.mark.parametrize("kind", ["idle_tail", "hung", "over_allocated", "bursty"])
def test_each_usage_pattern_has_its_shape(kind: str) -> None:
    forced = {f"train.usage.{k}": "1" if k == kind else "0" for k in ("busy", "bursty", "idle_tail", "over_allocated", "hung")}
    params = with_overrides(GeneratorParams(), {**forced, "window_start_s": "0", "load_target": "1000"})
    jobs = generate({"philly": philly_rows(10, duration_s=6000.0, gpus=4)}, params).jobs
    assert jobs
    for job in jobs:
        kinds = [p.kind for p in job.profile]
        assert kinds[0] == "loading"
        assert job.duration_s == profile_seconds(job.profile)
        if kind == "idle_tail":
            assert kinds[-1] == "idle"
            assert params.idle_tail_s_range[0] - 1 <= job.profile[-1].seconds <= params.idle_tail_s_range[1] + 1
            assert job.requeue_profile == ()
        elif kind == "hung":
            assert kinds[-1] == "hung"
            assert job.duration_s > job.time_limit_s  # it hangs until Slurm's time limit ends it
            assert "hung" not in [p.kind for p in job.requeue_profile]
        elif kind == "over_allocated":
            assert job.gpus_used == 1 and job.gpus == 4
            assert profile_seconds(job.requeue_profile) < job.duration_s
        else:
            assert "idle" in kinds and kinds[-1] == "busy"
            busy = [p.seconds for p in job.profile if p.kind == "busy"]
            assert len(busy) >= 2 and set(busy[:-1]) == {params.burst_busy_s}
            assert {p.seconds for p in job.profile if p.kind == "idle"} == {params.burst_idle_s}


def test_single_gpu_jobs_are_never_over_allocated() -> None:
    forced = {"finetune.usage.busy": "0", "finetune.usage.over_allocated": "1", "finetune.usage.idle_tail": "0", "finetune.usage.hung": "0"}
    params = with_overrides(GeneratorParams(), {**forced, "window_start_s": "0", "load_target": "1000"})
    jobs = generate({"philly": philly_rows(10)}, params).jobs
    assert all(j.gpus_used == 0 for j in jobs)


def test_overrides_are_typed_and_unknown_keys_rejected() -> None:
    params = with_overrides(
        GeneratorParams(),
        {"seed": "3", "users": "a, b", "idle_tail_s_range": "60,90", "infer.loading_s": "5", "infer.usage.hung": "0.5",
         "mix_weights": "philly:1,genai-2026:2", "window_start_s": "100"},
    )
    assert (params.seed, params.users, params.idle_tail_s_range) == (3, ("a", "b"), (60.0, 90.0))
    assert (params.infer.loading_s, params.infer.usage.hung) == (5.0, 0.5)
    assert params.mix_weights == (("philly", 1.0), ("genai-2026", 2.0))
    assert params.window_start_s == 100.0
    with pytest.raises(GeneratorError, match="unknown generator parameter 'sed'"):
        with_overrides(GeneratorParams(), {"sed": "1"})
    with pytest.raises(GeneratorError, match="cannot read"):
        with_overrides(GeneratorParams(), {"seed": "x"})
    with pytest.raises(GeneratorError, match="unknown usage kind"):
        with_overrides(GeneratorParams(), {"infer.usage.napping": "1"})


def test_bad_params_and_empty_traces_are_errors() -> None:
    with pytest.raises(GeneratorError, match="compression"):
        generate({"philly": philly_rows(3)}, GeneratorParams(compression=0))
    with pytest.raises(GeneratorError, match="no usable GPU rows"):
        generate({"alibaba-2023": [TraceJob("alibaba-2023", 2, "cpu", 0.0, 60.0, 0)]}, GeneratorParams())
    with pytest.raises(GeneratorError, match="past the trace's last arrival"):
        generate({"philly": philly_rows(3)}, GeneratorParams(window_start_s=1e9))
    with pytest.raises(GeneratorError, match="unknown trace source"):
        generate({"borg": philly_rows(3)}, GeneratorParams())


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"infer.loading_s": "nan"}, "infer.loading_s"),  # was: ValueError from round(nan)
        ({"finetune.loading_s": "inf"}, "finetune.loading_s"),
        ({"time_limit_factor": "inf"}, "time_limit_factor"),  # was: OverflowError from math.ceil(inf)
        ({"time_limit_factor": "nan"}, "time_limit_factor"),
        ({"compression": "inf"}, "compression"),  # was: accepted, every job submitted at 0 s
        ({"compression": "nan"}, "compression"),
        ({"arrival_window_s": "inf"}, "arrival_window_s"),  # was: an infinite arrival window
        ({"arrival_window_s": "1e308"}, "arrival_window_s"),
        ({"min_duration_s": "nan"}, "min_duration_s"),
        ({"max_duration_s": "inf"}, "max_duration_s"),
        ({"load_target": "nan"}, "load_target"),
        ({"max_jobs": "1" + "0" * 400}, "max_jobs"),  # was: OverflowError from max_jobs x weight
        ({"capacity_gpus": "1" + "0" * 400}, "capacity_gpus"),
        ({"window_start_s": "nan"}, "window_start_s"),
        ({"finetune.util_pct_range": "nan,50"}, "finetune.util_pct_range"),
        ({"train.vram_gib_range": "30,inf"}, "train.vram_gib_range"),
        ({"finetune.usage.busy": "nan"}, "finetune.usage.busy"),
        ({"mix_weights": "philly:inf"}, "mix_weights philly"),
        ({"mem_use_fraction_range": "0.5,nan"}, "mem_use_fraction_range"),
        ({"hung_overrun_s": "inf"}, "hung_overrun_s"),
        ({"burst_busy_s": "0.001"}, "burst_busy_s"),
    ],
)
def test_non_finite_and_absurd_params_are_named_errors(overrides: dict[str, str], named: str) -> None:
    params = with_overrides(GeneratorParams(), overrides)
    with pytest.raises(GeneratorError, match=rf"generator parameters: {named} must be"):
        generate({"philly": philly_rows(3, gpus=2)}, params)


def test_mix_shares_the_load_by_weight() -> None:
    workload = generate(fixture_sources(), GeneratorParams(seed=5, load_target=1000, compression=1, arrival_window_s=1e5))
    sources = {j.source.split(":")[0] for j in workload.jobs}
    assert sources == {"alibaba-2023", "genai-2026", "philly"}
    names = [j.name for j in workload.jobs]
    assert len(set(names)) == len(names)
    assert parse_workload(format_workload(workload)) == workload


def shared_sources() -> dict[str, list[TraceJob]]:
    for path in DEFAULT_FILES.values():
        if not (SHARED_TRACES / path).is_file():
            pytest.skip(f"{SHARED_TRACES / path} absent")
    return _read_shared()


@functools.cache
def _read_shared() -> dict[str, list[TraceJob]]:
    return {trace: list(read_trace(trace, SHARED_TRACES).jobs) for trace in DEFAULT_FILES}


@pytest.mark.shared
def test_default_mix_from_the_shared_traces_suits_the_local_cluster() -> None:
    params = GeneratorParams()
    workload: Workload = generate(shared_sources(), params)
    jobs = workload.jobs
    assert 30 <= len(jobs) <= params.max_jobs
    classes = {j.job_class for j in jobs}
    assert {"infer", "imagegen", "train"} <= classes
    shareable = sum(1 for j in jobs if j.share == "yes")
    assert shareable >= len(jobs) / 2  # mostly small inference/imagegen, the case shards serve
    assert any(j.gpus > 1 for j in jobs)
    assert any(j.profile[-1].kind == "idle" for j in jobs)
    assert any(j.profile[-1].kind == "hung" for j in jobs)
    demand = sum(j.gpus * min(j.duration_s, j.time_limit_s) for j in jobs)
    assert demand >= params.load_target * params.capacity_gpus * params.arrival_window_s  # stock Slurm must queue
    assert span_s(jobs) <= 5.5 * 60  # a few minutes when nothing queues
    assert max(j.submit_offset_s for j in jobs) < params.arrival_window_s
    assert parse_workload(format_workload(workload)) == workload


@pytest.mark.shared
def test_generated_profiles_play_in_gpu_load() -> None:
    loadgen = pytest.importorskip("slurm_aigc.telemetry.loadgen")
    for job in generate(shared_sources(), GeneratorParams(seed=2)).jobs:
        for profile in (job.profile, job.requeue_profile):
            if profile:
                loadgen.parse_profile_spec(format_phases(profile))


def test_the_policy_expected_sm_lies_in_the_generators_sm_range_for_each_shared_class() -> None:
    # The benchmark measures compute-aware sharing against the generator's SM draws
    # (docs/replay.md): a policy default outside them would test a different assumption.
    from slurm_aigc.policy.loader import load_policy
    from slurm_aigc.policy.paths import shipped_policy

    shard = load_policy(shipped_policy()).rewrites.shard
    params = GeneratorParams()
    for job_class in shard.classes:
        low, high = params.class_params(job_class).util_pct_range
        assert low / 100 <= shard.expected_sm[job_class] <= high / 100, job_class
        assert shard.expected_sm[job_class] == pytest.approx((low + high) / 200, abs=0.05), job_class
