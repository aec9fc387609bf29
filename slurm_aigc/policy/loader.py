"""Read etc/slurm-aigc.yaml, once, into a typed `Policy` of every section; errors name file, key path, problem.

The one reader of the policy file: `slurm-aigc policy check|render|install`, the hook's
`classify`, the controller (`reclaim`, `scoring`), the agent (`agent`) and the database
(`storage`) all get their settings from `load_policy`. Everything here but `load_policy`
(which reads the file it is given) is pure; the defaults are those of `slurm_aigc.policy.model`;
which file and the environment's values come from the caller (`slurm_aigc.policy.site`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from slurm_aigc.errors import ConfigError
from slurm_aigc.policy.model import (
    SHARD_GRES,
    SLURM_MAX_NICE,
    UNCLASSIFIED,
    UNKNOWN_CLASS,
    ClassDefaults,
    DetectionRule,
    GpuType,
    HookSettings,
    Inventory,
    ModelPreferRule,
    NvlinkMethod,
    NvlinkRule,
    Policy,
    Rewrites,
    ScoringConfig,
    ShardRule,
    Toggle,
    VramFitRule,
    WholeAsShardsRule,
)
from slurm_aigc.policy.sections import (
    agent_section,
    learned_section,
    reclaim_section,
    scoring_section,
    storage_section,
)
from slurm_aigc.validation import (
    MAX_DURATION_S,
    MAX_GPU_MEMORY_GIB,
    Node,
    absolute_path,
    choice,
    flag,
    get,
    integer,
    mapping,
    number,
    optional,
    section,
    string_list,
    word,
)

TOP_LEVEL = {"inventory", "classes", "detection", "rewrites", "hook", "storage", "reclaim", "scoring", "agent", "learned"}
# What the job_submit hook cannot do without; a daemon's file may leave them out.
HOOK_REQUIRED = {"inventory", "classes"}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_FEATURE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
# Shards gres.conf gives one GPU. The hook asks for `shard:N` with N up to this, rendered into
# Lua 5.1 (doubles) and handed to Slurm: 10,000 is one shard per 8 MiB of an 80 GiB GPU, finer
# than any job asks for, and every N stays an exact integer.
MAX_SHARDS_PER_GPU = 10_000
# A class's default time limit: a year. Slurm keeps minutes in 32 bits, the top values meaning
# NO_VAL and INFINITE; a partition's MaxTime is shorter (or UNLIMITED, which needs no default).
MAX_TIME_MINUTES = 365 * 24 * 60
# `min_gpus` / `max_gpus` of a detection rule: GPUs one job asks for; the largest jobs use tens of thousands.
MAX_JOB_GPUS = 100_000


def load_policy(path: str | Path | None, *, hook_sections: bool = True, simgpu_dir: str | None = None) -> Policy:
    """Read and validate the policy file at `path` (`slurm-aigc policy check --policy PATH`).

    The caller finds the file and reads the environment (`policy.site.load_site_policy`):
    `simgpu_dir` is `$SLURM_AIGC_SIMGPU_DIR`, the agent's when `agent.simgpu_dir` is absent.
    `path` None: no file was found; `hook_sections` False (the daemons, which may also leave
    out `inventory` and `classes`) then gets the model's defaults, the hook a ConfigError.
    """
    if path is None:
        if hook_sections:
            raise ConfigError("(no policy file)", "", "the job_submit hook needs a policy file")
        return parse_policy(Node("(defaults)", "", {}), hook_sections=False, simgpu_dir=simgpu_dir)
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise ConfigError(source, "", "no such file") from error
    except OSError as error:
        raise ConfigError(source, "", f"cannot read: {error.strerror or error}") from error
    except UnicodeDecodeError as error:  # a binary file, or one saved as Latin-1 / UTF-16
        raise ConfigError(source, "", f"not UTF-8 text (byte {error.start})") from error
    return parse_policy_text(text, source, hook_sections=hook_sections, simgpu_dir=simgpu_dir)


def parse_policy_text(text: str, source: str, *, hook_sections: bool = True, simgpu_dir: str | None = None) -> Policy:
    """Validate YAML text; `source` names it in errors."""
    try:
        document = _yaml_document(text, source)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(source, where, f"not valid YAML: {getattr(error, 'problem', error)}") from error
    return parse_policy(Node(source, "", document), hook_sections=hook_sections, simgpu_dir=simgpu_dir)


class _PolicyYamlLoader(yaml.SafeLoader):
    """`yaml.safe_load`'s loader, with integers too long for Python a YAML error (with its line)
    instead of a ValueError out of `int()` (over 4,300 digits, Python 3.11's limit)."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(None, None, f"integer of {len(node.value)} characters",
                                                    node.start_mark) from None


_PolicyYamlLoader.add_constructor("tag:yaml.org,2002:int", _PolicyYamlLoader.construct_yaml_int)


def _yaml_document(text: str, source: str) -> Any:
    """`yaml.safe_load(text)`, refusing a repeated key (see `_unique_keys`)."""
    loader = _PolicyYamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _unique_keys(node, "", source, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _unique_keys(node: yaml.Node, path: str, source: str, seen: set[int]) -> None:
    """Refuse a key repeated in one mapping: YAML's loaders keep the last and drop the first without
    a word (`max_fraction: 0.5` then `max_fraction: 0.9`; a second `reclaim:` replaced the first)."""
    if id(node) in seen:  # an alias (*name) of a node already checked; it may also contain itself
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _unique_keys(item, f"{path}[{index}]", source, seen)
    elif isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], yaml.Node] = {}
        for key, value in node.value:
            sub = f"{path}.{key.value}" if path else str(key.value)
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":  # `<<:` may be overridden
                earlier = first.setdefault((key.tag, key.value), key)
                if earlier is not key:
                    raise ConfigError(source, sub, f"key repeated (line {earlier.start_mark.line + 1}, again on line "
                                                   f"{key.start_mark.line + 1}); YAML would keep only the last: keep one")
            _unique_keys(value, sub, source, seen)


def parse_policy(root: Node, *, hook_sections: bool = True, simgpu_dir: str | None = None) -> Policy:
    """Every section of a loaded document; see `load_policy` for the keywords."""
    mapping(root, TOP_LEVEL, required=HOOK_REQUIRED if hook_sections else set())
    root = Node(root.source, root.path, root.value or {})
    inventory = _inventory(root.child("inventory")) if hook_sections or "inventory" in root.value else Inventory(())
    # A daemon's file may say `classes: {}`: the hook's sections are then not its concern.
    classes = _classes(root.child("classes")) if hook_sections or root.value.get("classes") else {}
    known = set(classes) | {UNKNOWN_CLASS}
    reclaim = reclaim_section(section(root, "reclaim"))
    rewrites = _rewrites(section(root, "rewrites"), known)
    if classes:
        _check_daemon_classes(root, known | {UNCLASSIFIED})
    return Policy(
        source=root.source,
        inventory=inventory,
        classes=classes,
        detection=_detection(section(root, "detection"), known),
        rewrites=rewrites,
        hook=_hook(section(root, "hook"), known),
        storage=storage_section(section(root, "storage")),
        reclaim=replace(reclaim, shards_per_gpu={t.name: t.shards_per_gpu for t in inventory.gpu_types},
                        gib_per_shard={t.name: t.gib_per_shard for t in inventory.gpu_types if t.shards_per_gpu}),
        scoring=_checked_grace(root, scoring_section(section(root, "scoring"), rewrites.model_prefer.published_features_file),
                               rewrites.model_prefer),
        agent=agent_section(section(root, "agent"), simgpu_dir),
        learned=learned_section(section(root, "learned")),
    )


def _checked_grace(root: Node, scoring: ScoringConfig, prefer: ModelPreferRule) -> ScoringConfig:
    """`scoring.model_unlist_grace_s` must outlast the hook's cache of the listing.

    The publisher unlists a model, then removes the feature a grace later; a hook that read the
    listing just before the unlisting keeps it `refresh_seconds`. A grace no longer than that
    lets the hook --prefer a feature Slurm no longer has, and Slurm rejects the job.
    """
    refresh = prefer.refresh_seconds
    if prefer.enabled and refresh > 0 and scoring.model_unlist_grace_s <= refresh:
        raise ConfigError(
            root.source, "scoring.model_unlist_grace_s",
            f"must be longer than rewrites.model_prefer.refresh_seconds ({refresh} s), got "
            f"{scoring.model_unlist_grace_s:g}: a hook that read the listing before the publisher unlisted a model "
            f"would --prefer it after Slurm dropped it, and Slurm rejects such a job")
    return scoring


def _check_daemon_classes(root: Node, known: set[str]) -> None:
    """Class names the daemons key on must be classes of the file (a typo would silently match nothing)."""
    reclaim, scoring = section(root, "reclaim"), section(root, "scoring")
    for name in section(reclaim, "classes").value:
        _known_class(Node(root.source, f"reclaim.classes.{name}", name), known)
    for node, key in ((section(reclaim, "exempt"), "classes"), (scoring, "serving_classes")):
        for index, _name in enumerate(string_list(node, key)):
            _known_class(node.child(key).child(index), known)


def _inventory(node: Node) -> Inventory:
    mapping(node, {"gpu_types", "shard_gres"}, required={"gpu_types"})
    types_node = node.child("gpu_types")
    mapping(types_node, set(types_node.value or {}))
    if not types_node.value:
        raise types_node.error("declare at least one GPU type")
    types = [_gpu_type(types_node.child(name), str(name)) for name in types_node.value]
    # The hook asks for `<shard_gres>:<GiB>` instead of gpu:1: only Slurm's sharing GRES
    # means "part of one GPU" (`shard_gres: gpu` asked for 40 whole GPUs).
    shard_gres = choice(node, "shard_gres", (SHARD_GRES,), SHARD_GRES)
    return Inventory(tuple(sorted(types, key=lambda t: (t.memory_gib, t.name))), shard_gres)


def _gpu_type(node: Node, name: str) -> GpuType:
    if not _NAME_RE.match(name):
        raise node.error("GPU type names use letters, digits, _ . - only")
    mapping(node, {"memory_gib", "shards_per_gpu", "nvlink", "feature", "nodes"}, required={"memory_gib"})
    memory = number(node, "memory_gib", 0.0, above=0, cap=MAX_GPU_MEMORY_GIB)
    shards = (integer(node, "shards_per_gpu", 0, minimum=0, cap=MAX_SHARDS_PER_GPU)
              if node.value.get("shards_per_gpu") is not None else 0)
    feature: str | None = name
    if "feature" in node.value:
        raw = node.value["feature"]
        feature = None if raw is None else word(node.child("feature"), _FEATURE_RE, "node feature name")
    nvlink = flag(node, "nvlink", False)
    return GpuType(name, memory, shards, nvlink, feature, optional(node, "nodes", str) or "")

# The `actions.job_class` column's length (slurm_aigc/db.py; a test holds the two equal): MariaDB and
# PostgreSQL refuse a longer name, which failed reclaim's audit of every job of the class. Not read
# from the column: the hook loads this module, and importing the database layer would slow it down.
CLASS_NAME_MAX = 32


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
        if len(name) > CLASS_NAME_MAX:
            raise child.error(f"class name {name!r} has {len(name)} characters; at most {CLASS_NAME_MAX} "
                              "(the length the reclaim audit trail stores)")
        classes[name] = _class_defaults(child)
    if "interactive" not in classes:
        raise node.error("the class 'interactive' must exist (jobs without a batch script)")
    return classes


def _class_defaults(node: Node) -> ClassDefaults:
    mapping(node, {"partition", "qos", "time_minutes", "description"})
    node = Node(node.source, node.path, node.value or {})
    partition, qos = optional(node, "partition", str), optional(node, "qos", str)
    if partition is not None:
        word(node.child("partition"), _PARTITION_RE, "partition name")
    if qos is not None:
        word(node.child("qos"), _PARTITION_RE, "QOS name")
    minutes = (integer(node, "time_minutes", 1, minimum=1, cap=MAX_TIME_MINUTES)
               if node.value.get("time_minutes") is not None else None)
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
    min_gpus, max_gpus = _gpu_count(node, "min_gpus"), _gpu_count(node, "max_gpus")
    if min_gpus is not None and max_gpus is not None and min_gpus > max_gpus:
        raise node.error(f"min_gpus {min_gpus} > max_gpus {max_gpus}")
    interactive = optional(node, "interactive", bool)
    return DetectionRule(class_name, globs, min_gpus, max_gpus, interactive)


def _gpu_count(node: Node, key: str) -> int | None:
    """A rule's GPU count, or None when absent or null."""
    if node.value.get(key) is None:
        return None
    return integer(node, key, 0, minimum=0, cap=MAX_JOB_GPUS)


def _known_class(node: Node, known: set[str]) -> str:
    if node.value not in known:
        raise node.error(f"unknown class {node.value!r}; classes: {', '.join(sorted(known))}")
    return str(node.value)


def _class_list(node: Node, key: str, known: set[str], default: tuple[str, ...]) -> tuple[str, ...]:
    """Class names that must exist; the model's default list is kept to the classes the file has."""
    if key not in node.value:
        return tuple(c for c in default if c in known)
    values = string_list(node, key)
    for index, _value in enumerate(values):
        _known_class(node.child(key).child(index), known)
    return values


# Keys a site's older policy file may still have, and why they went: named in the error
# instead of a bare "unknown key", so an admin knows to delete them rather than fix them.
_REMOVED_KEYS = {
    "rewrites": {"comment_class": "this key was removed: the hook no longer appends the class to the comment, it stamps "
                                  "it into the AdminComment (docs/tags.md); delete the key"},
    "hook": {"comment_class_key": "this key was removed: the class is no longer written into the comment (it is stamped "
                                  "as aigc_class= into the AdminComment, docs/tags.md); delete the key"},
}


def _refuse_removed(node: Node, section_name: str) -> None:
    """An old policy's removed key is an error naming it and saying it was removed."""
    if not isinstance(node.value, Mapping):
        return
    for key, why in _REMOVED_KEYS[section_name].items():
        if key in node.value:
            raise node.child(key).error(why)


def _rewrites(node: Node, known: set[str]) -> Rewrites:
    _refuse_removed(node, "rewrites")
    mapping(node, {"shard", "vram_fit", "nvlink", "whole_as_shards", "model_prefer", "class_defaults"})
    return Rewrites(
        shard=_shard(section(node, "shard"), known),
        vram_fit=_vram_fit(section(node, "vram_fit")),
        nvlink=_nvlink(section(node, "nvlink"), known),
        whole_as_shards=_whole_as_shards(section(node, "whole_as_shards")),
        model_prefer=_model_prefer(section(node, "model_prefer")),
        class_defaults=_toggle(section(node, "class_defaults")),
    )


def _shard(node: Node, known: set[str]) -> ShardRule:
    mapping(node, {"enabled", "classes", "max_fraction", "expected_sm", "max_sm", "nice"})
    base = ShardRule()
    fraction = number(node, "max_fraction", base.max_fraction, above=0, maximum=1, what="fraction")
    classes = _class_list(node, "classes", known, base.classes)
    max_sm = number(node, "max_sm", base.max_sm, above=0, maximum=1, what="fraction")
    expected = _expected_sm(node, known, base.expected_sm)
    missing = [c for c in classes if c not in expected]
    if missing:  # the hook must never guess a shared class's compute share
        where = section(node, "expected_sm")
        raise where.error(f"no expected SM fraction (0..1] for shared class(es) {', '.join(missing)}")
    nice = integer(node, "nice", base.nice, minimum=-SLURM_MAX_NICE, maximum=0)
    return ShardRule(flag(node, "enabled", base.enabled), classes, fraction, expected, max_sm, nice)


def _expected_sm(node: Node, known: set[str], default: Mapping[str, float]) -> Mapping[str, float]:
    """`expected_sm: {class: fraction in (0, 1]}`; the default kept to the classes the file has."""
    if "expected_sm" not in node.value:
        return {c: f for c, f in default.items() if c in known}
    child = node.child("expected_sm")
    mapping(child, known)
    return {str(c): number(child, c, 0.0, above=0, maximum=1, what="fraction") for c in child.value}


def _vram_fit(node: Node) -> VramFitRule:
    mapping(node, {"enabled", "reject_misfit"})
    base = VramFitRule()
    return VramFitRule(flag(node, "enabled", base.enabled), flag(node, "reject_misfit", base.reject_misfit))


def _nvlink(node: Node, known: set[str]) -> NvlinkRule:
    mapping(node, {"enabled", "classes", "method", "feature"})
    base = NvlinkRule()
    method: NvlinkMethod = "feature" if choice(node, "method", ("types", "feature"), base.method) == "feature" else "types"
    feature = word(node.child("feature"), _FEATURE_RE, "node feature name") if "feature" in node.value else base.feature
    classes = _class_list(node, "classes", known, base.classes)
    return NvlinkRule(flag(node, "enabled", base.enabled), classes, method, feature)


def _whole_as_shards(node: Node) -> WholeAsShardsRule:
    """`enabled: auto` (the default), true or false."""
    mapping(node, {"enabled"})
    value = node.value.get("enabled", WholeAsShardsRule().enabled)
    if value != "auto" and not isinstance(value, bool):
        raise node.child("enabled").error(f"expected auto, true or false, got {value!r}")
    return WholeAsShardsRule(value)


def _model_prefer(node: Node) -> ModelPreferRule:
    mapping(node, {"enabled", "feature_prefix", "published_features_file", "refresh_seconds"})
    base = ModelPreferRule()
    prefix = get(node, "feature_prefix", str, base.feature_prefix)
    if prefix != base.feature_prefix:  # kept in the grammar only so that files stating it still load
        raise node.child("feature_prefix").error(
            f"must be {base.feature_prefix!r}, got {prefix!r}: the publisher names the features it writes "
            f"{base.feature_prefix}<id> (slurm_aigc/telemetry/features.py), and Slurm rejects a job whose "
            f"--prefer names a feature no node has; delete the key")
    path = absolute_path(node, "published_features_file", base.published_features_file)
    refresh = integer(node, "refresh_seconds", base.refresh_seconds, minimum=0, cap=MAX_DURATION_S)
    return ModelPreferRule(flag(node, "enabled", base.enabled), prefix, path, refresh)


def _toggle(node: Node) -> Toggle:
    mapping(node, {"enabled"})
    return Toggle(flag(node, "enabled", Toggle().enabled))


def _hook(node: Node, known: set[str]) -> HookSettings:
    _refuse_removed(node, "hook")
    mapping(node, {"strict_tags", "debug_log", "skip_root", "untouched_classes"})
    base = HookSettings()
    return HookSettings(
        strict_tags=flag(node, "strict_tags", base.strict_tags),
        debug_log=flag(node, "debug_log", base.debug_log),
        skip_root=flag(node, "skip_root", base.skip_root),
        untouched_classes=_class_list(node, "untouched_classes", known, base.untouched_classes),
    )
