"""Strict readers for YAML-loaded config: unknown keys and wrong types are errors naming the key path.

Every config section (policy, reclaim, scoring, agent, storage) is read through these helpers
(by `slurm_aigc.policy.loader`) so that an admin's typo gets the same message everywhere:
``etc/slurm-aigc.yaml: classes.infer.vram_gb: expected a number, got 'lots'``.
Numbers must be finite: YAML's `.nan` and `.inf` are refused wherever a number is read.
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
        return float(value)  # type: ignore[return-value]
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
           maximum: float | None = None, what: str = "number") -> float:
    """A finite number, optionally > `above`, >= `minimum`, <= `maximum`; the error states the bounds."""
    value = get(node, key, float, default)
    low_ok = (above is None or value > above) and (minimum is None or value >= minimum)
    if not low_ok or (maximum is not None and value > maximum):
        raise node.child(key).error(f"expected {_bounds(what, above, minimum, maximum)}, got {value:g}")
    return value


def _bounds(what: str, above: float | None, minimum: float | None, maximum: float | None) -> str:
    if maximum is not None:
        low = f"({above:g}" if above is not None else (f"[{minimum:g}" if minimum is not None else "(-inf")
        return f"a {what} in {low}, {maximum:g}]"
    if above is not None:
        return f"a positive {what} (> 0)" if above == 0 else f"a {what} > {above:g}"
    return f"a non-negative {what}" if minimum == 0 else f"a {what} >= {minimum:g}"


def percent(node: Node, key: str, default: float) -> float:
    """A percentage in 0..100."""
    value = get(node, key, float, default)
    if not 0.0 <= value <= 100.0:
        raise node.child(key).error(f"expected a percentage in 0..100, got {value:g}")
    return value


def integer(node: Node, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer within [minimum, maximum] (each bound optional)."""
    value = get(node, key, int, default)
    low = -math.inf if minimum is None else minimum
    high = math.inf if maximum is None else maximum
    if not low <= value <= high:
        if maximum is not None:
            bound = f"an integer in {minimum if minimum is not None else ''}..{maximum}"
        else:
            bound = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
        raise node.child(key).error(f"expected {bound}, got {value}")
    return value


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
