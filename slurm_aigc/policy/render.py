"""Render a `Policy` into the Lua table the hook reads, and the one self-contained job_submit.lua.

Mirrors `slurm-aigc policy render`. The rendered file is
    header, `local AIGC_POLICY = {...}`, `local AIGC_HOOK = (function(...) <aigc_hook.lua> end)(AIGC_POLICY)`,
    then job_submit.lua (the pcall-wrapped entry points)
so slurmctld needs no package.path and `slurm-aigc classify` runs exactly the installed text.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_aigc.policy.model import DetectionRule, GpuType, Policy
from slurm_aigc.shipped import HOOK, shipped_file
from slurm_aigc.tags import SIGNAL_NAMES

MARKER = "-- slurm-aigc job_submit.lua (rendered)"
_LUA_MAGIC = set("^$()%.[]*+-?")

LuaValue = None | bool | int | float | str | Sequence["LuaValue"] | Mapping[str, "LuaValue"]


def lua_dir() -> Path:
    """job_submit_lua/ of the source checkout, else of the wheel's slurm_aigc/data/."""
    return shipped_file(HOOK).parent


def lua_string(text: str) -> str:
    """A Lua 5.1 double-quoted literal that survives any byte."""
    out = ['"']
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 32 <= byte < 127:
            out.append(char)
        else:
            out.append(f"\\{byte:03d}")
    out.append('"')
    return "".join(out)


def lua_value(value: LuaValue, indent: str = "") -> str:
    """Python data -> Lua constructor text (mappings keyed by identifiers or strings)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot render {value} into Lua")
        return repr(value)
    if isinstance(value, str):
        return lua_string(value)
    inner = indent + "  "
    if isinstance(value, Mapping):
        items = [f"{inner}[{lua_string(str(k))}] = {lua_value(v, inner)}," for k, v in value.items() if v is not None]
    else:
        items = [f"{inner}{lua_value(v, inner)}," for v in value]
    if not items:
        return "{}"
    return "{\n" + "\n".join(items) + "\n" + indent + "}"


def _segment(text: str) -> dict[str, LuaValue]:
    """One piece of a glob between `*`s: plain text, or with `?` a quantifier-free Lua pattern."""
    if "?" not in text:
        return {"plain": True, "text": text, "len": len(text.encode("utf-8"))}
    body = "".join("." if c == "?" else ("%" + c if c in _LUA_MAGIC else c) for c in text)
    if any(ord(c) > 127 for c in text):
        raise ValueError(f"glob piece {text!r}: `?` with non-ASCII text cannot be matched byte-wise")
    return {"plain": False, "pattern": body, "anchored": "^" + body, "len": len(text)}


def glob_matcher(glob: str) -> dict[str, LuaValue]:
    """'*llama*70b*' -> {head: None, middle: [llama, 70b], tail: None}, over the lower-cased name.

    The hook finds each piece at its leftmost place after the previous one (`glob_matches` in
    aigc_hook.lua): exact for `*` globs, linear in the name per piece, never backtracking the
    way a `.*` Lua pattern does (16,000 characters took 114 s inside slurmctld).
    """
    pieces = glob.lower().split("*")
    if len(pieces) == 1:
        return {"exact": _segment(pieces[0])}
    head, *middle, tail = pieces
    return {
        "head": _segment(head) if head else None,
        "middle": [_segment(m) for m in middle if m],
        "tail": _segment(tail) if tail else None,
    }


def _gpu_type(t: GpuType) -> dict[str, LuaValue]:
    return {
        "name": t.name, "memory_gib": t.memory_gib, "shards_per_gpu": t.shards_per_gpu,
        "gib_per_shard": t.gib_per_shard, "nvlink": t.nvlink, "feature": t.feature,
    }


def _rule(rule: DetectionRule) -> dict[str, LuaValue]:
    named = bool(rule.name_globs)
    return {
        "class": rule.class_name,
        "globs": [glob_matcher(g) for g in rule.name_globs] if named else None,
        "min_gpus": rule.min_gpus, "max_gpus": rule.max_gpus, "interactive": rule.interactive,
    }


# Publisher cycles a published-features listing may miss before the hook stops trusting it.
LISTING_CYCLES = 3


def listing_max_age_s(policy: Policy) -> int:
    """Seconds after its header's time (`# written <epoch>`) that the hook still trusts the listing.

    A live publisher rewrites it every cycle: every `scoring.interval_s`, on a controller loop
    that ticks every `reclaim.poll_interval_s` (so the interval rounded up to whole ticks). Three
    cycles, plus the hook's own cache (`refresh_seconds`), so one late or failed cycle does not
    turn preferences off; a stopped publisher, a database outage, dry-run or `--no-publisher`
    does, before Slurm (restarted or reconfigured meanwhile) refuses a --prefer it forgot.
    """
    tick = policy.reclaim.poll_interval_s
    cycle = math.ceil(policy.scoring.interval_s / tick) * tick
    return math.ceil(LISTING_CYCLES * cycle + policy.rewrites.model_prefer.refresh_seconds)


def listing_interval_warning(policy: Policy, tick_s: float) -> str | None:
    """Why a controller ticking every `tick_s` (its `--interval`) would leave the hook distrusting
    the listing it writes, or None. The hook's limit is rendered from `reclaim.poll_interval_s`,
    which the controller's command line does not change."""
    cycle = math.ceil(policy.scoring.interval_s / tick_s) * tick_s
    limit = listing_max_age_s(policy)
    # Warned when one late cycle would already turn preferences off (two cycles do not fit); the
    # rendered limit leaves three (a replay's compressed loop, at 1.5 ticks a cycle, leaves two).
    if 2 * cycle + policy.rewrites.model_prefer.refresh_seconds <= limit:
        return None
    return (f"--interval {tick_s:g}: the publisher rewrites the published-features listing every {cycle:g} s, "
            f"but the hook trusts it for {limit} s ({LISTING_CYCLES} cycles of reclaim.poll_interval_s "
            f"{policy.reclaim.poll_interval_s:g} + refresh): one late cycle turns model preferences off; "
            f"set reclaim.poll_interval_s in the policy instead")


SlurmVersion = tuple[int, ...]


def policy_table(policy: Policy, slurm_version: SlurmVersion | None = None) -> dict[str, LuaValue]:
    """The data the hook reads as `P` (everything precomputed that can be), for the Slurm
    release `slurm_version` (None: unknown), which `rewrites.whole_as_shards: auto` depends on."""
    r, h = policy.rewrites, policy.hook
    return {
        "classes": {
            name: {"partition": d.partition, "qos": d.qos, "time_minutes": d.time_minutes}
            for name, d in policy.classes.items()
        },
        "class_list_text": ", ".join(policy.classes),
        "signal_names": list(SIGNAL_NAMES),  # what `aigc:signal=` may declare (tags.py)
        "inventory": {"shard_gres": policy.inventory.shard_gres, "gpu_types": [_gpu_type(t) for t in policy.inventory.gpu_types]},
        "detection": [_rule(rule) for rule in policy.detection],
        "rewrites": {
            "shard": {"enabled": r.shard.enabled, "classes": list(r.shard.classes), "max_fraction": r.shard.max_fraction,
                      "expected_sm": dict(r.shard.expected_sm), "max_sm": r.shard.max_sm, "nice": r.shard.nice},
            "vram_fit": {"enabled": r.vram_fit.enabled, "reject_misfit": r.vram_fit.reject_misfit},
            "nvlink": {"enabled": r.nvlink.enabled, "classes": list(r.nvlink.classes), "method": r.nvlink.method,
                       "feature": r.nvlink.feature},
            "whole_as_shards": {"enabled": r.whole_as_shards.applies(slurm_version)},
            "model_prefer": {
                "enabled": r.model_prefer.enabled, "feature_prefix": r.model_prefer.feature_prefix,
                "published_features_file": r.model_prefer.published_features_file,
                "refresh_seconds": r.model_prefer.refresh_seconds,
                "max_age_seconds": listing_max_age_s(policy),
            },
            "class_defaults": {"enabled": r.class_defaults.enabled},
        },
        "hook": {
            "strict_tags": h.strict_tags, "debug_log": h.debug_log, "skip_root": h.skip_root,
            "untouched_classes": list(h.untouched_classes),
        },
        # What the hook needs of `learned:`: the file the controller writes and how often to re-read it.
        "learned": {"enabled": policy.learned.enabled, "file": policy.learned.file,
                    "refresh_seconds": policy.learned.refresh_seconds, "max_entries": policy.learned.max_entries},
    }


def render_policy_table(policy: Policy, slurm_version: SlurmVersion | None = None) -> str:
    """`local AIGC_POLICY = {...}` (what `slurm-aigc policy render --table-only` prints)."""
    return "local AIGC_POLICY = " + lua_value(policy_table(policy, slurm_version)) + "\n"


def version_text(slurm_version: SlurmVersion | None) -> str:
    return ".".join(f"{part:02d}" if i == 1 else str(part) for i, part in enumerate(slurm_version)) if slurm_version else "unknown"


def render_hook(policy: Policy, lua_source_dir: Path | None = None, slurm_version: SlurmVersion | None = None) -> str:
    """The complete job_submit.lua slurmctld loads (`slurm-aigc policy render`), for the Slurm
    release `slurm_version` (None: unknown)."""
    directory = lua_source_dir or lua_dir()
    hook = (directory / "aigc_hook.lua").read_text(encoding="utf-8")
    entry = (directory / "job_submit.lua").read_text(encoding="utf-8")
    table = render_policy_table(policy, slurm_version)
    digest = hashlib.sha256((table + hook + entry).encode("utf-8")).hexdigest()[:16]
    # A quoted Lua literal: no byte of the path (`\r`, `\n`, ...) can end the `--` comment.
    source = lua_string(policy.source)
    return (
        f"{MARKER}\n"
        f"-- policy: {source}\n-- digest: {digest}\n-- for Slurm: {version_text(slurm_version)}\n"
        "-- Generated by `slurm-aigc policy install`; edit the YAML policy, not this file.\n\n"
        f"{table}\n"
        "local AIGC_HOOK = (function(...)\n"
        f"{hook.rstrip()}\n"
        "end)(AIGC_POLICY)\n\n"
        f"{entry}"
    )
