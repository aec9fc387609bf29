"""Strict readers for YAML-loaded config: unknown keys and wrong types are errors naming the key path.

Every config section (policy, reclaim, scoring, agent) is read through these helpers so
that an admin's typo gets the same message everywhere:
``etc/slurm-aigc.yaml: classes.infer.vram_gb: expected a number, got 'lots'``.
"""

from __future__ import annotations

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
    return value


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
