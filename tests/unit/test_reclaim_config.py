"""The `reclaim:` section: defaults, per-class overlay, and errors naming the key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurm_aigc.errors import ConfigError
from slurm_aigc.reclaim.config import (
    ReclaimConfig,
    load_reclaim_config,
    parse_reclaim_section,
)
from slurm_aigc.validation import Node

REPO = Path(__file__).resolve().parents[2]


def parse(value: Any) -> ReclaimConfig:
    return parse_reclaim_section(Node("test.yaml", "reclaim", value))


def test_empty_section_is_the_safe_default() -> None:
    config = parse(None)
    assert config.dry_run is True
    assert "interactive" in config.exempt.classes
    assert config.cancel_enabled is False
    assert all("cancel" not in steps for steps in config.defaults.ladder.values())


def test_class_overlays_defaults() -> None:
    config = parse({
        "poll_interval_s": 5,
        "defaults": {"window_s": 120, "grace_s": 30},
        "classes": {"infer": {"window_s": 600, "ladder": {"memory_held": ["notify"]}}},
    })
    infer = config.policy_for("infer")
    assert (infer.window_s, infer.grace_s) == (600.0, 30.0)
    assert infer.ladder["memory_held"] == ("notify",)
    assert infer.ladder["idle"] == config.defaults.ladder["idle"]
    assert config.policy_for("unknown-class") == config.defaults
    assert config.gap_s == 10.0
    assert config.lookback_s() == 600.0 + 20.0


def test_unknown_key_names_the_path() -> None:
    with pytest.raises(ConfigError, match=r"test.yaml: reclaim.classes.train: unknown key\(s\) window"):
        parse({"classes": {"train": {"window": 5}}})


def test_bad_type_names_the_path() -> None:
    with pytest.raises(ConfigError, match=r"reclaim.defaults.window_s: expected a number"):
        parse({"defaults": {"window_s": "long"}})


def test_shrink_is_only_for_over_allocation() -> None:
    with pytest.raises(ConfigError, match=r"reclaim.defaults.ladder.idle\[1\]: action 'shrink' not allowed"):
        parse({"defaults": {"ladder": {"idle": ["notify", "shrink"]}}})


def test_cancel_needs_to_be_enabled() -> None:
    section = {"classes": {"train": {"ladder": {"idle": ["notify", "cancel"]}}}}
    with pytest.raises(ConfigError, match=r"reclaim.classes.train.ladder.idle: cancel is off"):
        parse(section)
    assert parse({**section, "cancel_enabled": True}).policy_for("train").ladder["idle"] == ("notify", "cancel")


def test_thresholds_are_checked() -> None:
    with pytest.raises(ConfigError, match="percentage"):
        parse({"defaults": {"idle_util_pct": 150}})
    with pytest.raises(ConfigError, match="busy_util_pct must be above"):
        parse({"defaults": {"idle_util_pct": 50, "busy_util_pct": 40}})
    with pytest.raises(ConfigError, match="opt_out: expected one of allow, deny"):
        parse({"opt_out": "maybe"})


def test_signal_name_is_normalised() -> None:
    assert parse({"signal": "sigusr2"}).signal == "USR2"


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.yaml: no such file"):
        load_reclaim_config(tmp_path / "nope.yaml")


def test_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("classes: {}\nreclaim:\n  dry_run: false\n  exempt: {users: [root]}\n")
    config = load_reclaim_config(path)
    assert config.dry_run is False
    assert config.exempt.users == frozenset({"root"})
    assert config.exempt.classes == frozenset({"interactive"})


def test_shipped_policy_parses_and_is_dry_run() -> None:
    path = REPO / "etc" / "slurm-aigc.yaml"
    if not path.exists():
        pytest.skip("etc/slurm-aigc.yaml not written yet")
    config = load_reclaim_config(path)
    assert config.dry_run is True
    assert "interactive" in config.exempt.classes


@pytest.mark.parametrize("key", ["cooldown_s", "poll_interval_s", "gap_intervals", "stale_intervals"])
@pytest.mark.parametrize("bad", [".nan", ".inf"])
def test_the_controller_refuses_nan_and_infinity(tmp_path: Path, key: str, bad: str) -> None:
    # `cooldown_s: .nan` stepped the ladder every tick; `poll_interval_s: .nan` disabled the stale guard.
    path = tmp_path / "policy.yaml"
    path.write_text(f"reclaim:\n  {key}: {bad}\n")
    with pytest.raises(ConfigError, match=rf"reclaim\.{key}: expected a finite number"):
        load_reclaim_config(path)


def test_per_class_numbers_refuse_nan_too() -> None:
    with pytest.raises(ConfigError, match=r"reclaim.classes.infer.idle_util_pct: expected a finite number"):
        parse({"classes": {"infer": {"idle_util_pct": float("nan")}}})
    with pytest.raises(ConfigError, match=r"reclaim.defaults.min_samples: expected an integer >= 1"):
        parse({"defaults": {"min_samples": 0}})


def test_inventory_shards_come_from_the_same_read(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("inventory: {gpu_types: {l4: {memory_gib: 24, shards_per_gpu: 24}}}\nreclaim: {}\n")
    assert load_reclaim_config(path).shards_per_gpu == {"l4": 24}


def test_memory_guard_samples_default_and_validation() -> None:
    assert parse(None).over_memory_samples == 3
    assert parse({"over_memory_samples": 5}).over_memory_samples == 5
    with pytest.raises(ConfigError, match=r"reclaim.over_memory_samples"):
        parse({"over_memory_samples": 0})
    with pytest.raises(ConfigError, match=r"reclaim.over_memory_samples: expected an integer"):
        parse({"over_memory_samples": "many"})


def test_over_memory_ladder_requeues_by_default_and_cannot_shrink() -> None:
    assert parse(None).defaults.ladder["over_memory"] == ("notify", "requeue")
    with pytest.raises(ConfigError, match=r"reclaim.defaults.ladder.over_memory\[0\]: action 'shrink' not allowed"):
        parse({"defaults": {"ladder": {"over_memory": ["shrink"]}}})


def test_inventory_gives_gib_per_shard_of_sharded_types_only(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("inventory: {gpu_types: {l4: {memory_gib: 24, shards_per_gpu: 48}, v100: {memory_gib: 32}}}\n"
                    "reclaim: {}\n")
    assert load_reclaim_config(path).gib_per_shard == {"l4": 0.5}
