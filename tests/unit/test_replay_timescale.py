"""The replay policy compresses durations like the workload and keeps thresholds and ladders."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.model import AgentConfig, ClassPolicy, ReclaimConfig, ScoringConfig
from slurm_aigc.profiles import Phase
from slurm_aigc.replay.timescale import (
    Compression,
    compression_report,
    longest_hold_by_class,
    reclaim_reach,
    replay_policy,
    workload_compression,
)
from slurm_aigc.replay.workload import Workload, WorkloadJob

SHIPPED = Path(__file__).resolve().parents[2] / "etc" / "slurm-aigc.yaml"


def test_shipped_policy_scaled_60x_stays_valid_and_compresses_reclaim_timing(tmp_path: Path) -> None:
    site = yaml.safe_load(SHIPPED.read_text())
    scaled = replay_policy(site, 60, 2.0, publish_features=False)
    defaults = scaled["reclaim"]["defaults"]
    assert defaults["grace_s"] == site["reclaim"]["defaults"]["grace_s"] / 60
    assert defaults["window_s"] == site["reclaim"]["defaults"]["window_s"] / 60
    assert defaults["min_samples"] <= defaults["window_s"] / 2.0
    assert defaults["idle_util_pct"] == site["reclaim"]["defaults"]["idle_util_pct"]
    assert defaults["ladder"] == site["reclaim"]["defaults"]["ladder"]
    assert scaled["reclaim"]["classes"]["infer"]["window_s"] == site["reclaim"]["classes"]["infer"]["window_s"] / 60
    assert scaled["reclaim"]["poll_interval_s"] == scaled["agent"]["interval_s"] == 2.0
    assert scaled["agent"]["publish_features"] is False
    assert site["reclaim"]["defaults"]["grace_s"] != defaults["grace_s"]  # the input is not modified
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(scaled))
    load_policy(path)  # every section still validates


def test_short_durations_never_go_below_the_floor() -> None:
    scaled = replay_policy({"reclaim": {"cooldown_s": 30, "defaults": {"grace_s": 1, "window_s": 5}}}, 60, 2.0, publish_features=True)
    assert scaled["reclaim"]["cooldown_s"] == 2.0
    assert scaled["reclaim"]["defaults"]["window_s"] == 2.0
    assert scaled["reclaim"]["defaults"]["min_samples"] == 3


# ---------------------------------------------------------------- issue 14.6: can reclaim fire within the replay?

def _job(name: str, job_class: str, duration_s: float, time_limit_s: int = 600) -> WorkloadJob:
    return WorkloadJob(name=name, submit_offset_s=0.0, job_class=job_class, gpus=1, vram_gib_per_gpu=8.0,
                       duration_s=duration_s, time_limit_s=time_limit_s, profile=(Phase("busy", duration_s),),
                       requeue_profile=(), mem_used_gib_per_gpu=4.0, util_pct=50.0)


def test_a_file_without_a_compression_line_replays_at_1_and_says_so() -> None:
    assert workload_compression({}) == Compression(1.0, from_file=False)
    assert workload_compression({"compression": "60"}) == Compression(60.0, from_file=True)
    assert "no `# compression:` line" in workload_compression({}).describe()
    for bad in ("sixty", "0", "-2", "nan", "inf"):
        with pytest.raises(ValueError, match="compression"):
            workload_compression({"compression": bad})


def test_unscaled_site_windows_outlast_a_short_replay_and_every_class_is_warned() -> None:
    reclaim = load_policy(SHIPPED).reclaim  # grace 600 s + window 1800 s (infer: 3600 s)
    workload = Workload((_job("a", "infer", 120.0), _job("b", "train", 300.0)), meta={})
    lines = compression_report(workload, reclaim)
    assert lines[0].startswith("compression 1 (the workload has no")
    assert any("class infer" in line and "4200 s" in line for line in lines)
    assert any("class train" in line for line in lines)
    assert "cannot fire within this replay" in lines[-1] and "set one" in lines[-1]


def test_at_compression_60_the_windows_fit_and_nothing_is_warned() -> None:
    reclaim = load_policy(SHIPPED).reclaim
    workload = Workload((_job("a", "finetune", 120.0), _job("b", "train", 150.0)), meta={"compression": "60"})
    reach = {r.job_class: r for r in reclaim_reach(reclaim, 60.0, longest_hold_by_class(workload.jobs))}
    assert reach["finetune"].first_verdict_s == 10.0 + 30.0 and reach["finetune"].can_fire
    assert reach["train"].grace_s == 20.0  # the class's own grace, scaled like replay_policy scales it
    assert compression_report(workload, reclaim) == [workload_compression(workload.meta).describe()]


def test_only_the_classes_that_cannot_fire_are_warned_and_a_backlog_cut_counts() -> None:
    reclaim = load_policy(SHIPPED).reclaim
    # infer's window is 3600 s: at 60x, 10 + 60 = 70 s, longer than a 50 s infer job; finetune fits in 120 s.
    workload = Workload((_job("a", "infer", 50.0), _job("b", "finetune", 120.0)), meta={"compression": "60"})
    lines = compression_report(workload, reclaim)
    assert [line for line in lines if "class" in line] == [line for line in lines if "class infer" in line]
    assert len(lines) == 2  # no summary: finetune can still be reclaimed
    cut = compression_report(workload, reclaim, replay_s=30.0)  # a 30 s backlogged replay ends every job first
    assert any("class finetune" in line for line in cut) and "cannot fire" in cut[-1]


def test_a_hung_job_counts_until_its_time_limit() -> None:
    hung = _job("h", "train", 900.0, time_limit_s=120)
    assert longest_hold_by_class([hung, _job("x", "train", 60.0)]) == {"train": 120.0}


def test_keys_the_site_left_out_scale_the_loaders_defaults() -> None:
    # A policy without agent/scoring/reclaim timing: the replay scales the one set of defaults
    # (policy/model.py), not a second set (it once scaled a 60 s feature check for 1800 s).
    scaled = replay_policy({"reclaim": {"classes": {"infer": {"window_s": 600}}}}, 10, 1.0, publish_features=True)
    assert scaled["agent"]["feature_check_s"] == AgentConfig.feature_check_s / 10
    assert scaled["scoring"]["interval_s"] == ScoringConfig.interval_s / 10
    assert scaled["scoring"]["model_linger_s"] == ScoringConfig.model_linger_s / 10
    assert scaled["reclaim"]["cooldown_s"] == ReclaimConfig.cooldown_s / 10
    # The class inherits the defaults' min_samples (capped at half the scaled window's samples).
    assert scaled["reclaim"]["classes"]["infer"]["min_samples"] == min(ClassPolicy.min_samples, 30)


def test_a_class_without_min_samples_inherits_the_sites_defaults_value() -> None:
    policy = {"reclaim": {"defaults": {"min_samples": 12}, "classes": {"infer": {"window_s": 6000}}}}
    scaled = replay_policy(policy, 10, 1.0, publish_features=True)
    assert scaled["reclaim"]["classes"]["infer"]["min_samples"] == 12
