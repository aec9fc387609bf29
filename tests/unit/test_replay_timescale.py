"""The replay policy compresses durations like the workload and keeps thresholds and ladders."""

from __future__ import annotations

from pathlib import Path

import yaml

from slurm_aigc.policy.loader import load_policy
from slurm_aigc.replay.timescale import replay_policy

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
