"""Policy validation: typed result for the shipped file, errors naming file + key path + problem."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from slurm_aigc.errors import ConfigError
from slurm_aigc.policy.loader import load_policy, parse_policy_text
from slurm_aigc.policy.paths import shipped_policy


def shipped() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(shipped_policy().read_text())
    return document


def parse(document: dict[str, Any]) -> Any:
    return parse_policy_text(yaml.safe_dump(document), "pol.yaml")


def test_shipped_policy_loads_with_types_sorted_and_foreign_sections() -> None:
    policy = load_policy(shipped_policy())
    assert [t.name for t in policy.inventory.gpu_types] == ["t4", "a100"]
    a100 = policy.inventory.gpu_types[1]
    assert a100.gib_per_shard == 1.0 and a100.nvlink and a100.feature == "a100"
    assert set(policy.classes) >= {"train", "finetune", "infer", "imagegen", "videogen", "audio", "batch", "interactive"}
    assert policy.detection[0].interactive is True
    assert set(policy.sections) == {"reclaim", "scoring", "agent"}


@pytest.mark.parametrize(("edit", "key_path", "words"), [
    (lambda d: d.update(hooks={}), "", "unknown key(s) hooks"),
    (lambda d: d["inventory"]["gpu_types"]["a100"].update(mem=1), "inventory.gpu_types.a100", "unknown key(s) mem"),
    (lambda d: d["inventory"]["gpu_types"]["a100"].update(memory_gib=-1), "inventory.gpu_types.a100.memory_gib", "> 0"),
    (lambda d: d["inventory"]["gpu_types"]["t4"].update(memory_gib="lots"), "inventory.gpu_types.t4.memory_gib", "a number"),
    (lambda d: d["detection"]["rules"][1].update({"class": "nope"}), "detection.rules[1].class", "unknown class"),
    (lambda d: d["rewrites"]["shard"].update(max_fraction=1.5), "rewrites.shard.max_fraction", "(0, 1]"),
    (lambda d: d["rewrites"]["nvlink"].update(method="magic"), "rewrites.nvlink.method", "'types' or 'feature'"),
    (lambda d: d["rewrites"]["model_prefer"].update(published_features_file="rel.txt"),
     "rewrites.model_prefer.published_features_file", "absolute path"),
    (lambda d: d["classes"].pop("interactive"), "classes", "interactive"),
    (lambda d: d["classes"].update(unknown={}), "classes.unknown", "reserved"),
    (lambda d: d["classes"]["infer"].update(partition="a b"), "classes.infer.partition", "partition name"),
    (lambda d: d["hook"].update(strict_tags="yes"), "hook.strict_tags", "true/false"),
    (lambda d: d["hook"].update(untouched_classes=["gone"]), "hook.untouched_classes[0]", "unknown class"),
    (lambda d: d["inventory"]["gpu_types"]["a100"].update(feature="a b"), "inventory.gpu_types.a100.feature", "feature"),
])
def test_errors_name_file_key_path_and_problem(edit: Any, key_path: str, words: str) -> None:
    document = shipped()
    edit(document)
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.source == "pol.yaml"
    assert caught.value.key_path == key_path
    assert words in caught.value.problem


def test_foreign_section_is_validated_by_its_owner() -> None:
    document = shipped()
    document["scoring"] = {"no_such_scoring_key": 1}
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path.startswith("scoring")


def test_invalid_yaml_and_missing_file() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_policy_text("inventory: [\n", "bad.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy("/nonexistent/slurm-aigc.yaml")


def test_optional_sections_default() -> None:
    document = {"inventory": {"gpu_types": {"l40s": {"memory_gib": 48}}}, "classes": {"interactive": {}, "infer": {}}}
    policy = parse(document)
    assert policy.detection == ()
    assert policy.rewrites.shard.classes == ("infer",)  # defaults filtered to the classes that exist
    assert policy.inventory.gpu_types[0].shards_per_gpu == 0 and not policy.inventory.gpu_types[0].nvlink


def test_storage_retention_defaults_and_is_validated() -> None:
    assert load_policy(shipped_policy()).storage.raw_retention_hours == 48.0
    document = shipped()
    del document["storage"]
    assert parse(document).storage.raw_retention_hours == 48.0
    for bad in (0, -1, float("nan"), float("inf"), "2d"):
        document["storage"] = {"raw_retention_hours": bad}
        with pytest.raises(ConfigError) as caught:
            parse(document)
        assert caught.value.key_path == "storage.raw_retention_hours"
