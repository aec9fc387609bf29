"""Readers of the daemons' sections of the policy file: `reclaim`, `scoring`, `agent`, `storage`.

Pure: a `Node` of already-loaded YAML in, a frozen value of `slurm_aigc.policy.model` out.
An absent or null section gives the defaults of the model (the only defaults there are);
unknown keys, wrong types, NaN/inf and out-of-range values are `ConfigError`s naming the
key path. `slurm_aigc.policy.loader` calls these; nothing else reads the file.
"""

from __future__ import annotations

import ipaddress
import math
import signal
from collections.abc import Mapping
from dataclasses import fields, replace

from slurm_aigc.errors import ConfigError
from slurm_aigc.policy.model import (
    AGENT_BACKENDS,
    LEASE_TICKS,
    VERDICTS,
    AgentConfig,
    ClassPolicy,
    Exemptions,
    LearnedConfig,
    NotifyConfig,
    ReclaimConfig,
    ScoringConfig,
    StorageConfig,
)
from slurm_aigc.tags import SIGNAL_NAMES
from slurm_aigc.telemetry import scoring
from slurm_aigc.validation import (
    MAX_COUNT,
    MAX_DURATION_S,
    MAX_GPU_MEMORY_MIB,
    Node,
    absolute_path,
    choice,
    duration_s,
    flag,
    get,
    integer,
    mapping,
    number,
    optional,
    percent,
    section,
    string_list,
)

# Actions that make sense for each verdict; shrink only fixes over-allocation.
_ALLOWED_ACTIONS = {
    "idle": {"notify", "signal", "requeue", "cancel"},
    "memory_held": {"notify", "signal", "requeue", "cancel"},
    "fake_busy": {"notify", "signal", "requeue", "cancel"},
    "over_allocated": {"notify", "signal", "shrink"},
    "over_memory": {"notify", "signal", "requeue", "cancel"},
    "gpu_conflict": {"notify", "requeue"},
}
# Signals the `signal` rung may send while cancelling is off. USR1/USR2 terminate by default
# too, but they exist to be handled by the program, and the rung signals only jobs that said
# they handle it; CONT/URG/WINCH are ignored by default. Every other signal's default action
# ends (or stops) the job: a disguised `cancel` (issue 12.6).
_NON_TERMINATING_SIGNALS = frozenset(SIGNAL_NAMES)  # also what a job may declare (aigc:signal=)
_WEIGHT_COLUMN_MAX = 2**31 - 1  # the largest value of the database's Integer column
# `gap_intervals`, `stale_intervals`: poll intervals. 1,000 (2.8 h at 10 s) already means
# "never"; a larger one is a typo.
_MAX_INTERVALS = 1000
# A scoring plugin's weight: weights are relative (scores are averaged with them); at 1,000 to 1
# the other plugins are already noise.
_MAX_SCORER_WEIGHT = 1000
# Raw samples kept: ten years. Retention deletes what is older; the cut-off must stay a date.
_MAX_RETENTION_HOURS = 10 * 365 * 24
# `learned.max_age_days`: a year of job history (read one sacct window per controller tick).
_MAX_LEARNED_AGE_DAYS = 365
# `learned.max_vram_spread` (p95 / median peak): at 1,000 no key is ever too wide.
_MAX_VRAM_SPREAD = 1000
_CLASS_KEYS = {f.name for f in fields(ClassPolicy)}
_RECLAIM_KEYS = {f.name for f in fields(ReclaimConfig)} - {"shards_per_gpu", "gib_per_shard"}


def reclaim_section(node: Node) -> ReclaimConfig:
    """`reclaim:`; per-class settings are `defaults` overlaid by `classes.<name>`."""
    mapping(node, _RECLAIM_KEYS)
    node = Node(node.source, node.path, node.value or {})
    base = ReclaimConfig()
    defaults = _class_policy(node.child("defaults"), base.defaults) if "defaults" in node.value else base.defaults
    config = ReclaimConfig(
        dry_run=flag(node, "dry_run", base.dry_run),
        poll_interval_s=duration_s(node, "poll_interval_s", base.poll_interval_s, above=0),
        gap_intervals=number(node, "gap_intervals", base.gap_intervals, minimum=1, cap=_MAX_INTERVALS),
        stale_intervals=number(node, "stale_intervals", base.stale_intervals, minimum=1, cap=_MAX_INTERVALS),
        max_actions_per_tick=integer(node, "max_actions_per_tick", base.max_actions_per_tick, minimum=0, cap=MAX_COUNT),
        max_actions_per_job=integer(node, "max_actions_per_job", base.max_actions_per_job, minimum=0, cap=MAX_COUNT),
        cooldown_s=duration_s(node, "cooldown_s", base.cooldown_s, minimum=0),
        cancel_enabled=flag(node, "cancel_enabled", base.cancel_enabled),
        signal=_signal(node, base.signal),
        opt_out=choice(node, "opt_out", ("allow", "deny"), base.opt_out),
        notify=_notify(section(node, "notify")),
        exempt=_exempt(section(node, "exempt")),
        defaults=defaults,
        classes=_reclaim_classes(section(node, "classes"), defaults),
        over_memory_samples=integer(node, "over_memory_samples", base.over_memory_samples, minimum=1, cap=MAX_COUNT),
        over_memory_allowance_mib=number(node, "over_memory_allowance_mib", base.over_memory_allowance_mib, minimum=0,
                                         cap=MAX_GPU_MEMORY_MIB),
        gpu_conflict_memory_pct=percent(node, "gpu_conflict_memory_pct", base.gpu_conflict_memory_pct),
        lease_intervals=number(node, "lease_intervals", base.lease_intervals, minimum=LEASE_TICKS, cap=_MAX_INTERVALS),
    )
    _check_cancel(node, config)
    _check_signal(node, config)
    return config


def _signal(node: Node, default: str) -> str:
    """A signal name as `scancel --signal` takes it (`USR1`); SIG prefix and case are dropped."""
    value = get(node, "signal", str, default)
    name = value.upper().removeprefix("SIG")
    if f"SIG{name}" not in signal.Signals.__members__ or name.startswith("RT"):
        raise node.child("signal").error(f"not a signal name: {value!r} (e.g. USR1, USR2)")
    return name


def _notify(node: Node) -> NotifyConfig:
    mapping(node, {"scontrol_notify", "command"})
    base = NotifyConfig()
    return NotifyConfig(flag(node, "scontrol_notify", base.scontrol_notify), string_list(node, "command"))


def _exempt(node: Node) -> Exemptions:
    mapping(node, {"classes", "accounts", "qos", "users"})
    classes = string_list(node, "classes") if "classes" in node.value else Exemptions().classes
    return Exemptions(
        classes=frozenset(classes),
        accounts=frozenset(string_list(node, "accounts")),
        qos=frozenset(string_list(node, "qos")),
        users=frozenset(string_list(node, "users")),
    )


def _reclaim_classes(node: Node, defaults: ClassPolicy) -> Mapping[str, ClassPolicy]:
    mapping(node, {str(name) for name in node.value} if isinstance(node.value, Mapping) else set())
    return {str(name): _class_policy(node.child(name), defaults) for name in node.value}


def _class_policy(node: Node, base: ClassPolicy) -> ClassPolicy:
    mapping(node, _CLASS_KEYS)
    node = Node(node.source, node.path, node.value or {})
    policy = replace(
        base,
        grace_s=duration_s(node, "grace_s", base.grace_s, minimum=0),
        window_s=duration_s(node, "window_s", base.window_s, above=0),
        min_samples=integer(node, "min_samples", base.min_samples, minimum=1, cap=MAX_COUNT),
        idle_util_pct=percent(node, "idle_util_pct", base.idle_util_pct),
        idle_memory_mib=number(node, "idle_memory_mib", base.idle_memory_mib, minimum=0, cap=MAX_GPU_MEMORY_MIB),
        busy_util_pct=percent(node, "busy_util_pct", base.busy_util_pct),
        low_power_pct=percent(node, "low_power_pct", base.low_power_pct),
        ladder=_ladder(node.child("ladder"), base.ladder) if "ladder" in node.value else base.ladder,
    )
    if policy.busy_util_pct <= policy.idle_util_pct:
        raise node.error("busy_util_pct must be above idle_util_pct")
    return policy


def _ladder(node: Node, base: Mapping[str, tuple[str, ...]]) -> Mapping[str, tuple[str, ...]]:
    mapping(node, set(VERDICTS))
    node = Node(node.source, node.path, node.value or {})
    ladder = dict(base)
    for verdict in node.value:
        steps = string_list(node, verdict)
        for index, step in enumerate(steps):
            if step not in _ALLOWED_ACTIONS[verdict]:
                allowed = ", ".join(sorted(_ALLOWED_ACTIONS[verdict]))
                raise node.child(verdict).child(index).error(f"action {step!r} not allowed here; allowed: {allowed}")
        ladder[verdict] = steps
    return ladder


def _ladders(node: Node, config: ReclaimConfig) -> list[tuple[str, str, tuple[str, ...]]]:
    """(key path, verdict, steps) of every ladder, `defaults` first."""
    named = [("defaults", config.defaults), *((f"classes.{n}", p) for n, p in config.classes.items())]
    return [(f"{node.path}.{where}.ladder.{verdict}", verdict, steps)
            for where, policy in named for verdict, steps in policy.ladder.items()]


def _check_cancel(node: Node, config: ReclaimConfig) -> None:
    if config.cancel_enabled:
        return
    for path, _verdict, steps in _ladders(node, config):
        if "cancel" in steps:
            raise ConfigError(node.source, path, "cancel is off; set reclaim.cancel_enabled: true to use it")


def _check_signal(node: Node, config: ReclaimConfig) -> None:
    """A `signal` rung whose signal ends the job is a cancel: only with cancel_enabled."""
    if config.cancel_enabled or config.signal in _NON_TERMINATING_SIGNALS:
        return
    for path, _verdict, steps in _ladders(node, config):
        if "signal" in steps:
            raise ConfigError(
                node.source, f"{node.path}.signal",
                f"SIG{config.signal} ends a job that does not handle it, and {path} uses the signal rung: "
                f"use USR1 or USR2, or set reclaim.cancel_enabled: true",
            )


def agent_section(node: Node, simgpu_dir: str | None = None) -> AgentConfig:
    """`agent:`; `simgpu_dir` is the default for an absent key ($SLURM_AIGC_SIMGPU_DIR, from the loader)."""
    mapping(node, {f.name for f in fields(AgentConfig)})
    node = Node(node.source, node.path, node.value or {})
    base = AgentConfig()
    port = optional(node, "metrics_port", int)
    if port is not None and not 0 < port < 65536:
        raise node.child("metrics_port").error(f"expected a TCP port 1-65535, got {port}")
    return AgentConfig(
        backend=choice(node, "backend", AGENT_BACKENDS, base.backend),
        simgpu_dir=get(node, "simgpu_dir", str, simgpu_dir or base.simgpu_dir),
        interval_s=duration_s(node, "interval_s", base.interval_s, above=0),
        publish_features=flag(node, "publish_features", base.publish_features),
        feature_check_s=duration_s(node, "feature_check_s", base.feature_check_s, above=0),
        metrics_port=port,
        metrics_address=_ip_address(node, "metrics_address", base.metrics_address),
    )


def _ip_address(node: Node, key: str, default: str) -> str:
    """An IP address to bind (`127.0.0.1`, `::1`, `0.0.0.0`), not a host name (resolved at bind time)."""
    value = get(node, key, str, default)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise node.child(key).error(f"expected an IP address (127.0.0.1, ::1, 0.0.0.0), got {value!r}") from None
    return value


def scoring_section(node: Node, hook_listing: str | None = None) -> ScoringConfig:
    """`scoring:`; plugin names must be registered in `scoring.SCORERS`.

    `hook_listing` is the file the hook reads (rewrites.model_prefer.published_features_file):
    an absent `published_features_file` means that one, so the two agree unless a file says otherwise.
    """
    mapping(node, {f.name for f in fields(ScoringConfig)})
    node = Node(node.source, node.path, node.value or {})
    base = ScoringConfig()
    weight_min = integer(node, "weight_min", base.weight_min)
    # Published weights are stored in Integer columns (node_publications.weight_*): 32-bit signed
    # on MariaDB and PostgreSQL, which refused a larger weight at every publication.
    weight_max = integer(node, "weight_max", base.weight_max)
    if weight_max > _WEIGHT_COLUMN_MAX:
        raise node.child("weight_max").error(
            f"at most {_WEIGHT_COLUMN_MAX} (published weights are stored as 32-bit integers), got {weight_max}")
    if not 0 <= weight_min < weight_max:
        raise node.error(f"need 0 <= weight_min < weight_max, got {weight_min} and {weight_max}")
    return ScoringConfig(
        interval_s=duration_s(node, "interval_s", base.interval_s, above=0),
        window_s=duration_s(node, "window_s", base.window_s, above=0),
        weight_min=weight_min,
        weight_max=weight_max,
        hysteresis=integer(node, "hysteresis", base.hysteresis, minimum=0, cap=_WEIGHT_COLUMN_MAX),
        max_writes_per_cycle=integer(node, "max_writes_per_cycle", base.max_writes_per_cycle, minimum=1, cap=MAX_COUNT),
        publish_nvfree=flag(node, "publish_nvfree", base.publish_nvfree),
        publish_models=flag(node, "publish_models", base.publish_models),
        serving_classes=string_list(node, "serving_classes") if "serving_classes" in node.value else base.serving_classes,
        published_features_file=absolute_path(node, "published_features_file", hook_listing),
        model_linger_s=duration_s(node, "model_linger_s", base.model_linger_s, minimum=0),
        model_unlist_grace_s=duration_s(node, "model_unlist_grace_s", base.model_unlist_grace_s, minimum=0),
        max_models_per_node=integer(node, "max_models_per_node", base.max_models_per_node, minimum=1, cap=MAX_COUNT),
        policies=_scorers(node.child("policies")) if node.value.get("policies") is not None else base.policies,
    )


def _scorers(node: Node) -> Mapping[str, float]:
    if not isinstance(node.value, Mapping) or not node.value:
        raise node.error("expected a mapping of plugin name to weight, e.g. {cool_first: 1}")
    for name in node.value:
        if name not in scoring.SCORERS:
            raise node.error(f"unknown scoring plugin {name!r}; known: {', '.join(sorted(scoring.SCORERS))}")
    return {str(name): number(node, name, 0.0, minimum=0, cap=_MAX_SCORER_WEIGHT, what="weight") for name in node.value}


def storage_section(node: Node) -> StorageConfig:
    """`storage:` (the state database)."""
    mapping(node, {f.name for f in fields(StorageConfig)})
    node = Node(node.source, node.path, node.value or {})
    base = StorageConfig()
    return StorageConfig(number(node, "raw_retention_hours", base.raw_retention_hours, above=0,
                                cap=_MAX_RETENTION_HOURS, what="number of hours"))


# The hook reads the whole learned table inside slurmctld, under the lock every job_submit
# call takes: ~42 ms for 10,000 entries in Lua 5.1 (docs/hook.md, "Performance"), so 4.2 us a
# line. Re-reading every `refresh_seconds` may take at most 1 % of slurmctld's time, and a
# table may hold at most 100,000 entries (~0.4 s a read).
LEARNED_READ_S_PER_ENTRY = 0.042 / 10_000
LEARNED_READ_SHARE = 0.01
LEARNED_MAX_ENTRIES = 100_000
# `refresh_seconds: 0` re-reads the table at every submit: allowed only for tables this small
# (~0.4 ms a read, about twice what slurmctld spends on a submit RPC), where test setups need
# a new table read at once. A 10,000-entry table read per submit would cap submits near 24 a second.
LEARNED_PER_SUBMIT_MAX_ENTRIES = 100


def learned_section(node: Node) -> LearnedConfig:
    """`learned:` (defaults for untagged jobs, slurm_aigc/telemetry/learned.py); off unless enabled."""
    mapping(node, {f.name for f in fields(LearnedConfig)})
    node = Node(node.source, node.path, node.value or {})
    base = LearnedConfig()
    path = absolute_path(node, "file", base.file)
    if path is None:  # the hook and the controller must agree on one file; `enabled: false` turns it off
        raise node.child("file").error("expected an absolute path (turn learning off with enabled: false)")
    enabled = flag(node, "enabled", base.enabled)
    # The bounds on what the hook re-reads apply only when it reads the table: a file that was
    # valid before these bounds, with learning off, must not keep every daemon from starting
    # (only the bound every count has, MAX_COUNT: the value is still rendered into the hook).
    max_entries = integer(node, "max_entries", base.max_entries, minimum=1,
                          maximum=LEARNED_MAX_ENTRIES if enabled else None, cap=MAX_COUNT)
    return LearnedConfig(
        enabled=enabled,
        file=path,
        min_jobs=integer(node, "min_jobs", base.min_jobs, minimum=1, cap=MAX_COUNT),
        max_age_days=number(node, "max_age_days", base.max_age_days, above=0, cap=_MAX_LEARNED_AGE_DAYS,
                            what="number of days"),
        max_entries=max_entries,
        refresh_seconds=(_learned_refresh(node, base.refresh_seconds, max_entries) if enabled
                         else integer(node, "refresh_seconds", base.refresh_seconds, minimum=0, cap=MAX_DURATION_S)),
        interval_s=duration_s(node, "interval_s", base.interval_s, above=0),
        vram_margin_pct=number(node, "vram_margin_pct", base.vram_margin_pct, minimum=0, maximum=1000, what="percentage"),
        max_vram_spread=number(node, "max_vram_spread", base.max_vram_spread, minimum=1, cap=_MAX_VRAM_SPREAD,
                               what="ratio (p95 / median)"),
        min_class_share=number(node, "min_class_share", base.min_class_share, above=0.5, maximum=1, what="fraction"),
    )


def _learned_refresh(node: Node, default: int, max_entries: int) -> int:
    """`learned.refresh_seconds`: 0 (re-read at every submit: test setups, small tables only), else
    long enough that re-reading a full table costs slurmctld at most `LEARNED_READ_SHARE` of its time."""
    seconds = integer(node, "refresh_seconds", default, minimum=0, cap=MAX_DURATION_S)
    if seconds == 0 and max_entries > LEARNED_PER_SUBMIT_MAX_ENTRIES:
        raise node.child("refresh_seconds").error(
            f"0 (re-read at every submit) needs max_entries <= {LEARNED_PER_SUBMIT_MAX_ENTRIES}, got max_entries "
            f"{max_entries}: every submit would re-read up to {max_entries} lines inside slurmctld "
            f"(~{max_entries * LEARNED_READ_S_PER_ENTRY * 1000:.1f} ms, docs/hook.md); set refresh_seconds to at least "
            f"{_least_refresh(max_entries)} or lower max_entries")
    least = _least_refresh(max_entries)
    if 0 < seconds < least:
        raise node.child("refresh_seconds").error(
            f"expected at least {least} s with max_entries {max_entries}, got {seconds}: the hook re-reads up to "
            f"{max_entries} lines inside slurmctld (~{max_entries * LEARNED_READ_S_PER_ENTRY * 1000:.0f} ms, "
            f"docs/hook.md), and more often than that would cost over 1 % of its time; lower max_entries or "
            f"raise refresh_seconds")
    return seconds


def _least_refresh(max_entries: int) -> int:
    return math.ceil(round(max_entries * LEARNED_READ_S_PER_ENTRY / LEARNED_READ_SHARE, 6))  # 42.000000001 is 42
