"""Scoring plugins, their combination into Slurm weights, and the `scoring:` config section."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from slurm_aigc.errors import ConfigError
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.telemetry import scoring
from slurm_aigc.telemetry.config import parse_scoring_section
from slurm_aigc.telemetry.scoring import (
    IslandUse,
    NodeView,
    cool_first,
    node_weight,
    pack_keep_islands,
)
from slurm_aigc.validation import Node


def view(name: str, islands: list[tuple[list[int], list[int]]], util: float | None = None) -> NodeView:
    uses = tuple(IslandUse(tuple(gpus), tuple(free)) for gpus, free in islands)
    total = sum(len(gpus) for gpus, _ in islands)
    free = sum(len(f) for _, f in islands)
    return NodeView(name, total, total - free, uses, util)


DGX_FREE = [(list(range(8)), list(range(8)))]
DGX_TWO_USED = [(list(range(8)), list(range(2, 8)))]
PCIE4_FREE = [([i], [i]) for i in range(4)]
PCIE4_HALF = [([0], []), ([1], []), ([2], [2]), ([3], [3])]
QUADS_ONE_BROKEN = [([0, 1, 2, 3], [0, 1, 2, 3]), ([4, 5, 6, 7], [5, 6, 7])]

SLURM_RANGE = (1, 100)
ONLY = {"cool_first": {"cool_first": 1.0}, "pack": {"pack_keep_islands": 1.0}}


def weight(v: NodeView, policies: dict[str, float]) -> int:
    return node_weight(v, policies, *SLURM_RANGE)


def test_cool_first_gives_a_busier_node_a_higher_slurm_weight() -> None:
    cool, busy = view("cool", DGX_FREE, util=5.0), view("busy", DGX_FREE, util=90.0)
    assert weight(busy, ONLY["cool_first"]) > weight(cool, ONLY["cool_first"])
    assert cool_first(view("unknown", DGX_FREE, util=None)) == scoring.NEUTRAL_SCORE
    assert weight(view("idle", DGX_FREE, util=0.0), ONLY["cool_first"]) == 1
    assert weight(view("hot", DGX_FREE, util=100.0), ONLY["cool_first"]) == 100


def test_pack_keep_islands_fills_broken_islands_before_whole_free_ones() -> None:
    whole = view("whole", DGX_FREE)
    broken = view("broken", DGX_TWO_USED)
    quads = view("quads", QUADS_ONE_BROKEN)
    # Slurm prefers the lower weight: the broken island first, the pristine DGX last.
    assert weight(broken, ONLY["pack"]) < weight(quads, ONLY["pack"]) < weight(whole, ONLY["pack"])
    assert whole.free_nvlink_set == 8 and broken.free_nvlink_set == 6 and quads.free_nvlink_set == 4


def test_pack_keep_islands_is_best_fit_without_nvlink_and_keeps_nvlink_nodes_for_last() -> None:
    assert pack_keep_islands(view("half", PCIE4_HALF)) > pack_keep_islands(view("empty", PCIE4_FREE))
    assert pack_keep_islands(view("pcie", PCIE4_FREE)) > pack_keep_islands(view("dgx", DGX_FREE))
    full = NodeView("full", 8, 8, (IslandUse(tuple(range(8)), ()),))
    assert pack_keep_islands(full) == 100.0
    assert pack_keep_islands(NodeView("cpu", 0, 0)) == scoring.NEUTRAL_SCORE


def test_scores_add_up_by_weight() -> None:
    v = view("n", DGX_TWO_USED, util=40.0)
    both = scoring.combined_score(v, {"cool_first": 1.0, "pack_keep_islands": 3.0})
    assert both == pytest.approx((cool_first(v) + 3 * pack_keep_islands(v)) / 4)
    assert scoring.combined_score(v, {"cool_first": 0.0}) == scoring.NEUTRAL_SCORE


def test_slurm_weight_maps_scores_onto_the_configured_range_inverted() -> None:
    assert scoring.slurm_weight(100.0, 10, 50) == 10
    assert scoring.slurm_weight(0.0, 10, 50) == 50
    assert scoring.slurm_weight(50.0, 10, 50) == 30
    assert scoring.slurm_weight(250.0, 10, 50) == 10  # clamped


@given(
    util=st.floats(min_value=0, max_value=100),
    alloc=st.integers(min_value=0, max_value=8),
    low=st.integers(min_value=0, max_value=1000),
    span=st.integers(min_value=1, max_value=1000),
)
def test_weight_always_inside_the_range(util: float, alloc: int, low: int, span: int) -> None:
    free = tuple(range(alloc, 8))
    v = NodeView("n", 8, alloc, (IslandUse(tuple(range(8)), free),), util)
    w = node_weight(v, {"cool_first": 1.0, "pack_keep_islands": 2.0}, low, low + span)
    assert low <= w <= low + span


def test_site_plugins_register_by_name_once() -> None:
    def prefer_even(v: NodeView) -> float:
        return 100.0 if len(v.name) % 2 == 0 else 0.0

    scoring.register("test_prefer_even", prefer_even)
    try:
        with pytest.raises(ValueError):
            scoring.register("test_prefer_even", prefer_even)
        config = parse_scoring_section(Node("x.yaml", "scoring", {"policies": {"test_prefer_even": 2}}))
        assert config.policy_weights() == {"test_prefer_even": 2.0}
    finally:
        del scoring.SCORERS["test_prefer_even"]


# --------------------------------------------------------------------------- config


def section(value: object) -> Node:
    return Node("etc/slurm-aigc.yaml", "scoring", value)


def test_documented_default_yaml_parses_to_the_defaults() -> None:
    document = yaml.safe_load(shipped_policy().read_text())
    parsed = parse_scoring_section(section(document["scoring"]))
    defaults = parse_scoring_section(section(None))
    assert parsed.policy_weights() == defaults.policy_weights()
    assert (parsed.weight_min, parsed.weight_max, parsed.hysteresis, parsed.max_writes_per_cycle) == (
        defaults.weight_min, defaults.weight_max, defaults.hysteresis, defaults.max_writes_per_cycle)
    assert parsed.serving_classes == ("infer", "imagegen")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"weigth_max": 5}, "scoring: unknown key(s) weigth_max"),
        ({"policies": {"coolest": 1}}, "scoring.policies: unknown scoring plugin 'coolest'"),
        ({"policies": {"cool_first": -1}}, "scoring.policies.cool_first: expected a non-negative weight"),
        ({"policies": {"cool_first": "high"}}, "scoring.policies.cool_first: expected a number"),
        ({"weight_min": 50, "weight_max": 10}, "need 0 <= weight_min < weight_max"),
        ({"interval_s": 0}, "scoring.interval_s: expected a positive number"),
        ({"hysteresis": -2}, "scoring.hysteresis"),
        ({"max_writes_per_cycle": 0}, "scoring.max_writes_per_cycle"),
        ({"serving_classes": "infer"}, "scoring.serving_classes: expected a list of strings"),
        ([1, 2], "scoring: expected a mapping"),
    ],
)
def test_bad_scoring_sections_name_file_and_key(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_scoring_section(section(value))
    assert str(error.value).startswith("etc/slurm-aigc.yaml: ")
    assert message in str(error.value)
