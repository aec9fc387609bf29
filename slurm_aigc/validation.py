"""Strict readers for YAML-loaded config: unknown keys and wrong types are errors naming the key path.

Every config section (policy, reclaim, scoring, agent, storage) is read through these helpers
(by `slurm_aigc.policy.loader`) so that an admin's typo gets the same message everywhere:
``etc/slurm-aigc.yaml: classes.infer.vram_gb: expected a number, got 'lots'``.
Numbers must be finite: YAML's `.nan` and `.inf` are refused wherever a number is read, and
every setting has an upper bound (the `MAX_*` below, or its own next to its reader).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from slurm_aigc.errors import ConfigError

T = TypeVar("T")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|[KMGT])?\s*$", re.IGNORECASE)
_SIZE_FACTORS_GIB = {"": 1.0 / 1024**3, "K": 1.0 / 1024**2, "M": 1.0 / 1024, "G": 1.0, "T": 1024.0}

# Upper bounds shared by several settings. Without one, a typo (20 zeros, 1e23) was accepted
# and reached Slurm: `shards_per_gpu: 99999999999999999999` rendered into the Lua hook as
# `gres/shard:5e+19`, a number Lua 5.1's doubles no longer hold exactly. Each bound is far
# above any real value, so it refuses only mistakes.
# A duration (`*_s`, `*_seconds`): an interval, grace, window, cool-down or cache lifetime
# the daemons or the hook wait through; none means anything beyond a month.
MAX_DURATION_S = 30 * 86400
# One GPU's memory: the largest GPUs have under 300 GiB; 4 TiB leaves room for the next ones.
MAX_GPU_MEMORY_GIB = 4096
MAX_GPU_MEMORY_MIB = MAX_GPU_MEMORY_GIB * 1024
# Any other count (samples, actions, jobs, writes): a million is past every real setting,
# and far inside the 32-bit integers of Slurm and of the database.
MAX_COUNT = 1_000_000


@dataclass(frozen=True)
class Node:
    """A position in a config document: the file it came from and the key path inside it."""

    source: str
    path: str
    value: Any

    def child(self, key: str | int) -> Node:
        sub = f"{self.path}[{key}]" if isinstance(key, int) else (f"{self.path}.{key}" if self.path else key)
        container = self.value
        return Node(self.source, sub, container[key])

    def error(self, problem: str) -> ConfigError:
        return ConfigError(self.source, self.path, problem)


def mapping(node: Node, allowed: set[str], required: set[str] = frozenset()) -> Mapping[str, Any]:  # type: ignore[assignment]
    """Check that `node` is a mapping with only `allowed` keys and all `required` ones."""
    if node.value is None:
        node = Node(node.source, node.path, {})
    if not isinstance(node.value, Mapping):
        raise node.error(f"expected a mapping, got {type(node.value).__name__}")
    unknown = sorted(str(k) for k in node.value if k not in allowed)
    if unknown:
        raise node.error(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    missing = sorted(required - set(node.value))
    if missing:
        raise node.error(f"missing required key(s) {', '.join(missing)}")
    return node.value


def get(node: Node, key: str, kind: type[T], default: T | None = None) -> T:
    """Read `node[key]` as `kind` (int accepted for float), or `default` when absent."""
    assert isinstance(node.value, Mapping)
    if key not in node.value:
        if default is None:
            raise node.error(f"missing required key {key}")
        return default
    child = node.child(key)
    value = child.value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)  # type: ignore[return-value]
        except OverflowError:  # over ~1.8e308: YAML reads it as an int no float holds
            raise child.error(f"expected a finite number, got {_shown(value)}") from None
    if kind is int and isinstance(value, bool):
        raise child.error(f"expected an integer, got {value!r}")
    if not isinstance(value, kind):
        raise child.error(f"expected {_kind_name(kind)}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise child.error(f"expected a finite number, got {value!r}")
    return value


def section(node: Node, key: str) -> Node:
    """`node[key]` as a sub-node; an absent or null section reads as an empty mapping."""
    assert isinstance(node.value, Mapping)
    if node.value.get(key) is None:
        return Node(node.source, f"{node.path}.{key}" if node.path else key, {})
    return node.child(key)


def flag(node: Node, key: str, default: bool) -> bool:
    """A true/false setting."""
    return get(node, key, bool, default)


def number(node: Node, key: str, default: float, *, above: float | None = None, minimum: float | None = None,
           maximum: float | None = None, cap: float | None = None, what: str = "number") -> float:
    """A finite number, optionally > `above`, >= `minimum`, <= `maximum`; the error states the bounds.

    `cap` is an upper bound that only refuses mistakes (a `MAX_*`): unlike `maximum`, which is
    part of what the setting means (a fraction's 1), it is named only to a value above it.
    """
    value = get(node, key, float, default)
    low_ok = (above is None or value > above) and (minimum is None or value >= minimum)
    high = maximum if maximum is not None else cap
    if not low_ok or (high is not None and value > high):
        top = maximum if maximum is not None else (cap if low_ok else None)
        raise node.child(key).error(f"expected {_bounds(what, above, minimum, top)}, got {value:g}")
    return value


def duration_s(node: Node, key: str, default: float, *, above: float | None = None, minimum: float | None = None) -> float:
    """A number of seconds, at most `MAX_DURATION_S`."""
    return number(node, key, default, above=above, minimum=minimum, cap=MAX_DURATION_S, what="number of seconds")


def _bounds(what: str, above: float | None, minimum: float | None, maximum: float | None) -> str:
    if maximum is not None:
        low = f"({_plain(above)}" if above is not None else (f"[{_plain(minimum)}" if minimum is not None else "(-inf")
        return f"a {what} in {low}, {_plain(maximum)}]"
    if above is not None:
        return f"a positive {what} (> 0)" if above == 0 else f"a {what} > {_plain(above)}"
    return f"a non-negative {what}" if minimum == 0 else f"a {what} >= {_plain(minimum)}"


def _plain(bound: float | None) -> str:
    """A bound as an admin would write it: 2592000, not 2.592e+06."""
    if bound is None:
        return "-inf"
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def percent(node: Node, key: str, default: float) -> float:
    """A percentage in 0..100."""
    value = get(node, key, float, default)
    if not 0.0 <= value <= 100.0:
        raise node.child(key).error(f"expected a percentage in 0..100, got {value:g}")
    return value


def integer(node: Node, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None,
            cap: int | None = None) -> int:
    """An integer within [minimum, maximum] (each bound optional); `cap` as for `number`."""
    value = get(node, key, int, default)
    low_ok = minimum is None or value >= minimum
    high = maximum if maximum is not None else cap
    if not low_ok or (high is not None and value > high):
        top = maximum if maximum is not None else (cap if low_ok else None)
        if top is not None:
            bound = f"an integer in {minimum if minimum is not None else ''}..{top}"
        else:
            bound = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
        raise node.child(key).error(f"expected {bound}, got {_shown(value)}")
    return value


def _shown(value: int) -> str:
    """An integer for an error message: a 300-digit typo as its length, not 300 digits."""
    digits = len(str(abs(value)))
    return str(value) if digits <= 30 else f"an integer of {digits} digits"


def choice(node: Node, key: str, choices: tuple[str, ...], default: str) -> str:
    """One of a fixed set of words."""
    value = get(node, key, str, default)
    if value not in choices:
        raise node.child(key).error(f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def absolute_path(node: Node, key: str, default: str | None) -> str | None:
    """An absolute file path, or None when the key is null."""
    assert isinstance(node.value, Mapping)
    if key not in node.value:
        return default
    path = optional(node, key, str)
    if path is not None and not path.startswith("/"):
        raise node.child(key).error(f"expected an absolute path, got {path!r}")
    return path


def word(node: Node, pattern: re.Pattern[str], what: str) -> str:
    """A name matching `pattern` (letters, digits, _ . -): a partition, feature, QOS..."""
    if not isinstance(node.value, str) or not pattern.match(node.value):
        raise node.error(f"expected a {what} (letters, digits, _ . -), got {node.value!r}")
    return node.value


def optional(node: Node, key: str, kind: type[T]) -> T | None:
    """Read `node[key]` as `kind` or None when absent or null."""
    assert isinstance(node.value, Mapping)
    if node.value.get(key) is None:
        return None
    return get(node, key, kind)


def string_list(node: Node, key: str) -> tuple[str, ...]:
    """Read a list of strings (absent reads as empty)."""
    assert isinstance(node.value, Mapping)
    if node.value.get(key) is None:
        return ()
    child = node.child(key)
    if not isinstance(child.value, list) or not all(isinstance(v, str) for v in child.value):
        raise child.error(f"expected a list of strings, got {child.value!r}")
    return tuple(child.value)


def parse_size_gib(text: str) -> float:
    """'40G', '40GB', '40GiB', '512M', '1.5T' -> GiB. Raises ValueError naming the text."""
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 40G, 512M)")
    number, unit = match.groups()
    factor = _SIZE_FACTORS_GIB[(unit or "G")[0].upper()]
    return float(number) * factor


def _kind_name(kind: type[Any]) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false", list: "a list", dict: "a mapping"}.get(kind, kind.__name__)
