"""The `reclaim:` section of etc/slurm-aigc.yaml, read into typed, validated values.

Per-class windows and thresholds come from `defaults` overlaid by `classes.<name>`; a class
the file does not name uses `defaults`. Unknown keys are errors naming file and key path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from slurm_aigc.errors import ConfigError

# One reader of the config file for every section (move to validation.py when the lead can).
from slurm_aigc.telemetry.config import config_path, load_section
from slurm_aigc.validation import Node, get, mapping, optional, string_list

VERDICTS = ("idle", "memory_held", "fake_busy", "over_allocated")
ACTIONS = ("notify", "signal", "requeue", "shrink", "cancel")
# Actions that make sense for each verdict; shrink only fixes over-allocation.
_ALLOWED_ACTIONS = {
    "idle": {"notify", "signal", "requeue", "cancel"},
    "memory_held": {"notify", "signal", "requeue", "cancel"},
    "fake_busy": {"notify", "signal", "requeue", "cancel"},
    "over_allocated": {"notify", "signal", "shrink"},
}
UNCLASSIFIED = "unclassified"


@dataclass(frozen=True)
class ClassPolicy:
    """Windows, thresholds and action ladders for one AIGC class."""

    grace_s: float = 600.0
    window_s: float = 1800.0
    min_samples: int = 10
    idle_util_pct: float = 1.0
    idle_memory_mib: float = 500.0
    busy_util_pct: float = 90.0
    low_power_pct: float = 25.0
    ladder: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {
            "idle": ("notify", "requeue"),
            "memory_held": ("notify", "requeue"),
            "fake_busy": ("notify", "signal"),
            "over_allocated": ("notify", "shrink"),
        }
    )


@dataclass(frozen=True)
class Exemptions:
    """Jobs reclaim never touches (it still reports their verdicts)."""

    classes: frozenset[str] = frozenset({"interactive"})
    accounts: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NotifyConfig:
    """How `notify` reaches the user besides the job's AdminComment (always set)."""

    scontrol_notify: bool = True
    # argv template; {user} {job_id} {message} {verdict} are substituted per argument.
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReclaimConfig:
    """The whole `reclaim:` section."""

    dry_run: bool = True
    poll_interval_s: float = 30.0
    gap_intervals: float = 2.0
    stale_intervals: float = 4.0
    max_actions_per_tick: int = 10
    max_actions_per_job: int = 4
    cooldown_s: float = 900.0
    cancel_enabled: bool = False
    signal: str = "USR1"
    opt_out: str = "allow"
    notify: NotifyConfig = NotifyConfig()
    exempt: Exemptions = Exemptions()
    defaults: ClassPolicy = ClassPolicy()
    classes: Mapping[str, ClassPolicy] = field(default_factory=dict)
    # From the policy's `inventory` (not a reclaim key): turns shards into GPU-hours recovered.
    shards_per_gpu: Mapping[str, int] = field(default_factory=dict)

    @property
    def gap_s(self) -> float:
        """A longer gap between two samples breaks any window."""
        return self.gap_intervals * self.poll_interval_s

    @property
    def stale_s(self) -> float:
        """Samples older than this are stale: the controller waits instead of acting."""
        return self.stale_intervals * self.poll_interval_s

    def policy_for(self, job_class: str) -> ClassPolicy:
        return self.classes.get(job_class, self.defaults)

    def lookback_s(self) -> float:
        """How far back the controller must read samples to judge every class."""
        windows = [self.defaults.window_s] + [p.window_s for p in self.classes.values()]
        return max(windows) + 2 * self.gap_s


_TOP_KEYS = {
    "dry_run", "poll_interval_s", "gap_intervals", "stale_intervals", "max_actions_per_tick",
    "max_actions_per_job", "cooldown_s", "cancel_enabled", "signal", "opt_out", "notify",
    "exempt", "defaults", "classes",
}
_CLASS_KEYS = {
    "grace_s", "window_s", "min_samples", "idle_util_pct", "idle_memory_mib", "busy_util_pct",
    "low_power_pct", "ladder",
}


def parse_reclaim_section(node: Node) -> ReclaimConfig:
    """Read `reclaim:`; an absent or empty section gives the shipped defaults (dry-run on)."""
    mapping(node, _TOP_KEYS)
    node = _as_mapping(node)
    base = ReclaimConfig()
    defaults = _class_policy(node.child("defaults"), base.defaults) if "defaults" in node.value else base.defaults
    config = ReclaimConfig(
        dry_run=get(node, "dry_run", bool, base.dry_run),
        poll_interval_s=_positive(node, "poll_interval_s", base.poll_interval_s),
        gap_intervals=_at_least(node, "gap_intervals", base.gap_intervals, 1.0),
        stale_intervals=_at_least(node, "stale_intervals", base.stale_intervals, 1.0),
        max_actions_per_tick=_count(node, "max_actions_per_tick", base.max_actions_per_tick),
        max_actions_per_job=_count(node, "max_actions_per_job", base.max_actions_per_job),
        cooldown_s=_non_negative(node, "cooldown_s", base.cooldown_s),
        cancel_enabled=get(node, "cancel_enabled", bool, base.cancel_enabled),
        signal=_signal(node, base.signal),
        opt_out=_choice(node, "opt_out", ("allow", "deny"), base.opt_out),
        notify=_notify(node),
        exempt=_exempt(node),
        defaults=defaults,
        classes=_classes(node, defaults),
    )
    _check_cancel(node, config)
    return config


def load_reclaim_config(path: str | Path | None = None) -> ReclaimConfig:
    """Read the `reclaim:` section of the policy file.

    `path` None means `$SLURM_AIGC_CONFIG` or /etc/slurm-aigc/slurm-aigc.yaml; when that
    default file does not exist the shipped defaults apply (dry-run on). An explicit path
    that does not exist is an error.
    """
    chosen, required = config_path(None if path is None else str(path))
    config = parse_reclaim_section(load_section(chosen, "reclaim", required))
    return replace(config, shards_per_gpu=_inventory_shards(chosen))


def _inventory_shards(path: Path | str) -> dict[str, int]:
    """Shards per GPU per type from the same file's `inventory` (validated by the policy loader)."""
    if not Path(path).is_file() or "inventory" not in (yaml.safe_load(Path(path).read_text()) or {}):
        return {}  # a file holding only reclaim settings: shards then count as no GPU-hours
    from slurm_aigc.policy.loader import load_policy

    return {gpu.name: gpu.shards_per_gpu for gpu in load_policy(path).inventory.gpu_types}


def _as_mapping(node: Node) -> Node:
    return node if node.value is not None else Node(node.source, node.path, {})


def _number(node: Node, key: str, default: float) -> float:
    return get(node, key, float, default) if key in node.value else default


def _positive(node: Node, key: str, default: float) -> float:
    value = _number(node, key, default)
    if value <= 0:
        raise node.child(key).error(f"must be > 0, got {value}")
    return value


def _non_negative(node: Node, key: str, default: float) -> float:
    value = _number(node, key, default)
    if value < 0:
        raise node.child(key).error(f"must be >= 0, got {value}")
    return value


def _at_least(node: Node, key: str, default: float, minimum: float) -> float:
    value = _number(node, key, default)
    if value < minimum:
        raise node.child(key).error(f"must be >= {minimum}, got {value}")
    return value


def _count(node: Node, key: str, default: int) -> int:
    value = get(node, key, int, default) if key in node.value else default
    if value < 0:
        raise node.child(key).error(f"must be >= 0, got {value}")
    return value


def _pct(node: Node, key: str, default: float) -> float:
    value = _number(node, key, default)
    if not 0.0 <= value <= 100.0:
        raise node.child(key).error(f"must be a percentage in 0..100, got {value}")
    return value


def _choice(node: Node, key: str, choices: tuple[str, ...], default: str) -> str:
    value = get(node, key, str, default) if key in node.value else default
    if value not in choices:
        raise node.child(key).error(f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def _signal(node: Node, default: str) -> str:
    value = get(node, "signal", str, default) if "signal" in node.value else default
    name = value.upper().removeprefix("SIG")
    if not name.isalnum():
        raise node.child("signal").error(f"not a signal name: {value!r}")
    return name


def _notify(node: Node) -> NotifyConfig:
    if "notify" not in node.value:
        return NotifyConfig()
    child = node.child("notify")
    mapping(child, {"scontrol_notify", "command"})
    child = _as_mapping(child)
    base = NotifyConfig()
    return NotifyConfig(
        scontrol_notify=get(child, "scontrol_notify", bool, base.scontrol_notify)
        if "scontrol_notify" in child.value else base.scontrol_notify,
        command=string_list(child, "command"),
    )


def _exempt(node: Node) -> Exemptions:
    if "exempt" not in node.value:
        return Exemptions()
    child = node.child("exempt")
    mapping(child, {"classes", "accounts", "qos", "users"})
    child = _as_mapping(child)
    classes = string_list(child, "classes") if "classes" in child.value else tuple(Exemptions().classes)
    return Exemptions(
        classes=frozenset(classes),
        accounts=frozenset(string_list(child, "accounts")),
        qos=frozenset(string_list(child, "qos")),
        users=frozenset(string_list(child, "users")),
    )


def _classes(node: Node, defaults: ClassPolicy) -> Mapping[str, ClassPolicy]:
    if optional(node, "classes", dict) is None:
        return {}
    child = node.child("classes")
    return {str(name): _class_policy(child.child(name), defaults) for name in child.value}


def _class_policy(node: Node, base: ClassPolicy) -> ClassPolicy:
    mapping(node, _CLASS_KEYS)
    node = _as_mapping(node)
    policy = replace(
        base,
        grace_s=_non_negative(node, "grace_s", base.grace_s),
        window_s=_positive(node, "window_s", base.window_s),
        min_samples=max(1, _count(node, "min_samples", base.min_samples)),
        idle_util_pct=_pct(node, "idle_util_pct", base.idle_util_pct),
        idle_memory_mib=_non_negative(node, "idle_memory_mib", base.idle_memory_mib),
        busy_util_pct=_pct(node, "busy_util_pct", base.busy_util_pct),
        low_power_pct=_pct(node, "low_power_pct", base.low_power_pct),
        ladder=_ladder(node.child("ladder"), base.ladder) if "ladder" in node.value else base.ladder,
    )
    if policy.busy_util_pct <= policy.idle_util_pct:
        raise node.error("busy_util_pct must be above idle_util_pct")
    return policy


def _ladder(node: Node, base: Mapping[str, tuple[str, ...]]) -> Mapping[str, tuple[str, ...]]:
    mapping(node, set(VERDICTS))
    node = _as_mapping(node)
    ladder = dict(base)
    for verdict in node.value:
        steps = string_list(node, verdict)
        for index, step in enumerate(steps):
            if step not in _ALLOWED_ACTIONS[verdict]:
                allowed = ", ".join(sorted(_ALLOWED_ACTIONS[verdict]))
                raise node.child(verdict).child(index).error(f"action {step!r} not allowed here; allowed: {allowed}")
        ladder[verdict] = steps
    return ladder


def _check_cancel(node: Node, config: ReclaimConfig) -> None:
    if config.cancel_enabled:
        return
    for name, policy in [("defaults", config.defaults), *config.classes.items()]:
        for verdict, steps in policy.ladder.items():
            if "cancel" in steps:
                where = f"defaults.ladder.{verdict}" if name == "defaults" else f"classes.{name}.ladder.{verdict}"
                raise ConfigError(node.source, f"{node.path}.{where}", "cancel is off; set reclaim.cancel_enabled: true to use it")

