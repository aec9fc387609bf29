"""Read etc/slurm-aigc.yaml into a typed `Policy`; every error names file, key path and problem.

Mirrors `slurm-aigc policy check`. Sections owned by other packages (`reclaim`, `scoring`,
`agent`) are validated by their own parsers when those are importable.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from slurm_aigc.errors import ConfigError
from slurm_aigc.policy.model import (
    UNKNOWN_CLASS,
    ClassDefaults,
    DetectionRule,
    GpuType,
    HookSettings,
    Inventory,
    ModelPreferRule,
    NvlinkRule,
    Policy,
    Rewrites,
    ShardRule,
    StorageConfig,
    Toggle,
    VramFitRule,
)
from slurm_aigc.validation import Node, get, mapping, optional, string_list

TOP_LEVEL = {"inventory", "classes", "detection", "rewrites", "hook", "storage", "reclaim", "scoring", "agent"}
# section -> (module, parser) of the packages that own it.
FOREIGN_SECTIONS: dict[str, tuple[str, str]] = {
    "reclaim": ("slurm_aigc.reclaim.config", "parse_reclaim_section"),
    "scoring": ("slurm_aigc.telemetry.config", "parse_scoring_section"),
    "agent": ("slurm_aigc.telemetry.config", "parse_agent_section"),
}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_FEATURE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file (`slurm-aigc policy check --policy PATH`)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(source, "", f"cannot read: {error.strerror or error}") from error
    return parse_policy_text(text, source)


def parse_policy_text(text: str, source: str) -> Policy:
    """Validate YAML text; `source` names it in errors."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(source, where, f"not valid YAML: {getattr(error, 'problem', error)}") from error
    return parse_policy(Node(source, "", document))


def parse_policy(root: Node) -> Policy:
    mapping(root, TOP_LEVEL, required={"inventory", "classes"})
    inventory = _inventory(root.child("inventory"))
    classes = _classes(root.child("classes"))
    known = set(classes) | {UNKNOWN_CLASS}
    detection = _detection(_child(root, "detection"), known)
    rewrites = _rewrites(_child(root, "rewrites"), known)
    hook = _hook(_child(root, "hook"), known)
    storage = _storage(_child(root, "storage"))
    sections = {name: _foreign(root, name) for name in FOREIGN_SECTIONS if name in root.value}
    return Policy(root.source, inventory, classes, detection, rewrites, hook, storage, sections)


def _child(node: Node, key: str) -> Node:
    """A sub-node, reading an absent or null section as an empty mapping."""
    if node.value.get(key) is None:
        return Node(node.source, f"{node.path}.{key}" if node.path else key, {})
    return node.child(key)


def _name(node: Node, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(node.value, str) or not pattern.match(node.value):
        raise node.error(f"expected a {what} (letters, digits, _ . -), got {node.value!r}")
    return node.value


def _inventory(node: Node) -> Inventory:
    mapping(node, {"gpu_types", "shard_gres"}, required={"gpu_types"})
    types_node = node.child("gpu_types")
    mapping(types_node, set(types_node.value or {}))
    if not types_node.value:
        raise types_node.error("declare at least one GPU type")
    types = [_gpu_type(types_node.child(name), str(name)) for name in types_node.value]
    shard_gres = optional(node, "shard_gres", str) or "shard"
    return Inventory(tuple(sorted(types, key=lambda t: (t.memory_gib, t.name))), shard_gres)


def _gpu_type(node: Node, name: str) -> GpuType:
    if not _NAME_RE.match(name):
        raise node.error("GPU type names use letters, digits, _ . - only")
    mapping(node, {"memory_gib", "shards_per_gpu", "nvlink", "feature", "nodes"}, required={"memory_gib"})
    memory = get(node, "memory_gib", float)
    if memory <= 0:
        raise node.child("memory_gib").error(f"must be > 0, got {memory}")
    shards = optional(node, "shards_per_gpu", int) or 0
    if shards < 0:
        raise node.child("shards_per_gpu").error(f"must be >= 0, got {shards}")
    feature: str | None = name
    if "feature" in node.value:
        raw = node.value["feature"]
        feature = None if raw is None else _name(node.child("feature"), _FEATURE_RE, "node feature name")
    nvlink = get(node, "nvlink", bool, False) if "nvlink" in node.value else False
    return GpuType(name, memory, shards, nvlink, feature, optional(node, "nodes", str) or "")


def _classes(node: Node) -> dict[str, ClassDefaults]:
    if not isinstance(node.value, Mapping) or not node.value:
        raise node.error("expected a mapping of class name -> defaults")
    classes: dict[str, ClassDefaults] = {}
    for name in node.value:
        child = node.child(name)
        if not isinstance(name, str) or not re.match(r"^[a-z][a-z0-9_]*$", name):
            raise child.error("class names are lower-case letters, digits and _")
        if name == UNKNOWN_CLASS:
            raise child.error("'unknown' is reserved for jobs no rule classifies")
        classes[name] = _class_defaults(child)
    if "interactive" not in classes:
        raise node.error("the class 'interactive' must exist (jobs without a batch script)")
    return classes


def _class_defaults(node: Node) -> ClassDefaults:
    mapping(node, {"partition", "qos", "time_minutes", "description"})
    partition = optional(node, "partition", str)
    if partition is not None:
        _name(node.child("partition"), _PARTITION_RE, "partition name")
    qos = optional(node, "qos", str)
    if qos is not None:
        _name(node.child("qos"), _PARTITION_RE, "QOS name")
    minutes = optional(node, "time_minutes", int)
    if minutes is not None and minutes <= 0:
        raise node.child("time_minutes").error(f"must be > 0, got {minutes}")
    return ClassDefaults(partition, qos, minutes)


def _detection(node: Node, known: set[str]) -> tuple[DetectionRule, ...]:
    mapping(node, {"rules"})
    if node.value.get("rules") is None:
        return ()
    rules_node = node.child("rules")
    if not isinstance(rules_node.value, list):
        raise rules_node.error("expected a list of rules")
    return tuple(_detection_rule(rules_node.child(i), known) for i in range(len(rules_node.value)))


def _detection_rule(node: Node, known: set[str]) -> DetectionRule:
    mapping(node, {"class", "name", "min_gpus", "max_gpus", "interactive"}, required={"class"})
    class_name = _known_class(node.child("class"), known)
    globs = string_list(node, "name")
    for index, glob in enumerate(globs):
        if not glob or "\0" in glob:
            raise node.child("name").child(index).error("empty name pattern")
    min_gpus, max_gpus = optional(node, "min_gpus", int), optional(node, "max_gpus", int)
    if min_gpus is not None and max_gpus is not None and min_gpus > max_gpus:
        raise node.error(f"min_gpus {min_gpus} > max_gpus {max_gpus}")
    interactive = optional(node, "interactive", bool)
    return DetectionRule(class_name, globs, min_gpus, max_gpus, interactive)


def _known_class(node: Node, known: set[str]) -> str:
    if node.value not in known:
        raise node.error(f"unknown class {node.value!r}; classes: {', '.join(sorted(known))}")
    return str(node.value)


def _class_list(node: Node, key: str, known: set[str], default: tuple[str, ...]) -> tuple[str, ...]:
    if key not in node.value:
        return tuple(c for c in default if c in known)
    values = string_list(node, key)
    for index, _value in enumerate(values):
        _known_class(node.child(key).child(index), known)
    return values


def _enabled(node: Node) -> bool:
    return get(node, "enabled", bool, True) if "enabled" in node.value else True


def _rewrites(node: Node, known: set[str]) -> Rewrites:
    mapping(node, {"shard", "vram_fit", "nvlink", "model_prefer", "class_defaults", "comment_class"})
    return Rewrites(
        shard=_shard(_child(node, "shard"), known),
        vram_fit=_vram_fit(_child(node, "vram_fit")),
        nvlink=_nvlink(_child(node, "nvlink"), known),
        model_prefer=_model_prefer(_child(node, "model_prefer")),
        class_defaults=_toggle(_child(node, "class_defaults")),
        comment_class=_toggle(_child(node, "comment_class")),
    )


def _shard(node: Node, known: set[str]) -> ShardRule:
    mapping(node, {"enabled", "classes", "max_fraction"})
    fraction = get(node, "max_fraction", float, ShardRule.max_fraction)
    if not 0 < fraction <= 1:
        raise node.child("max_fraction").error(f"must be in (0, 1], got {fraction}")
    return ShardRule(_enabled(node), _class_list(node, "classes", known, ShardRule.classes), fraction)


def _vram_fit(node: Node) -> VramFitRule:
    mapping(node, {"enabled", "reject_misfit"})
    reject = get(node, "reject_misfit", bool, False) if "reject_misfit" in node.value else False
    return VramFitRule(_enabled(node), reject)


def _nvlink(node: Node, known: set[str]) -> NvlinkRule:
    mapping(node, {"enabled", "classes", "method", "feature"})
    method = get(node, "method", str, "types")
    if method not in ("types", "feature"):
        raise node.child("method").error(f"expected 'types' or 'feature', got {method!r}")
    feature = _name(node.child("feature"), _FEATURE_RE, "node feature name") if "feature" in node.value else "nvlink"
    classes = _class_list(node, "classes", known, NvlinkRule.classes)
    return NvlinkRule(_enabled(node), classes, "feature" if method == "feature" else "types", feature)


def _model_prefer(node: Node) -> ModelPreferRule:
    mapping(node, {"enabled", "feature_prefix", "published_features_file", "refresh_seconds"})
    prefix = get(node, "feature_prefix", str, "model_")
    if not re.match(r"^[A-Za-z0-9_.-]*$", prefix):
        raise node.child("feature_prefix").error(f"letters, digits, _ . - only, got {prefix!r}")
    path = ModelPreferRule.published_features_file
    if "published_features_file" in node.value:
        path = optional(node, "published_features_file", str)
        if path is not None and not path.startswith("/"):
            raise node.child("published_features_file").error(f"expected an absolute path, got {path!r}")
    refresh = get(node, "refresh_seconds", int, 10)
    if refresh < 0:
        raise node.child("refresh_seconds").error(f"must be >= 0, got {refresh}")
    return ModelPreferRule(_enabled(node), prefix, path, refresh)


def _toggle(node: Node) -> Toggle:
    mapping(node, {"enabled"})
    return Toggle(_enabled(node))


def _hook(node: Node, known: set[str]) -> HookSettings:
    mapping(node, {"strict_tags", "debug_log", "skip_root", "untouched_classes", "comment_class_key"})
    flags = {key: get(node, key, bool, False) if key in node.value else None for key in ("strict_tags", "debug_log", "skip_root")}
    untouched = _class_list(node, "untouched_classes", known, HookSettings.untouched_classes)
    key = get(node, "comment_class_key", str, "aigc_class")
    if not re.match(r"^[a-z][a-z0-9_]*$", key):
        raise node.child("comment_class_key").error(f"lower-case letters, digits and _ only, got {key!r}")
    return HookSettings(
        strict_tags=bool(flags["strict_tags"]),
        debug_log=bool(flags["debug_log"]),
        skip_root=True if flags["skip_root"] is None else bool(flags["skip_root"]),
        untouched_classes=untouched,
        comment_class_key=key,
    )


def _storage(node: Node) -> StorageConfig:
    mapping(node, {"raw_retention_hours"})
    hours = get(node, "raw_retention_hours", float, StorageConfig.raw_retention_hours)
    if not math.isfinite(hours) or hours <= 0:
        raise node.child("raw_retention_hours").error(f"expected a positive number of hours, got {hours}")
    return StorageConfig(hours)


def _foreign(root: Node, name: str) -> object:
    """Validate a section another package owns, through its parser, if that package is present."""
    module_name, parser_name = FOREIGN_SECTIONS[name]
    node = _child(root, name)
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return node.value
    parser: Callable[[Node], Any] | None = getattr(module, parser_name, None)
    if parser is None:
        return node.value
    return parser(node)
