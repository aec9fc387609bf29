"""Parsing of Slurm TRES strings as `sacct -o AllocTRES` prints them.

Example: ``billing=4,cpu=4,gres/gpu:a100=2,gres/gpu=2,gres/shard=20,mem=8G,node=1``.
Slurm prints the untyped total (``gres/gpu=2``) next to each typed count
(``gres/gpu:a100=2``); TRES this module does not know are kept raw, never an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from slurm_aigc.errors import AigcError

_MEM_FACTORS_MIB = {"K": 1.0 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}
_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")
_COUNT_RE = re.compile(r"^\d+$")
# Types Slurm reports when a GPU has no type; and what we call a job with several types.
UNTYPED = "untyped"
MIXED = "mixed"
NO_GPU = "none"


class TresParseError(AigcError):
    """A TRES string does not have the `name=value,...` shape; names the bad fragment."""


@dataclass(frozen=True)
class Tres:
    """An allocation: GPUs and shards (total and per type), CPUs, memory, nodes, the rest raw."""

    gpus: int = 0
    gpus_by_type: Mapping[str, int] = field(default_factory=dict)
    shards: int = 0
    shards_by_type: Mapping[str, int] = field(default_factory=dict)
    cpus: int | None = None
    memory_mib: float | None = None
    nodes: int | None = None
    other: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpu_type(self) -> str:
        """The one GPU type of the allocation, `mixed`, `untyped`, or `none`."""
        types = set(self.gpus_by_type) | set(self.shards_by_type)
        if len(types) > 1:
            return MIXED
        if types:
            return next(iter(types))
        return UNTYPED if self.gpus or self.shards else NO_GPU


def parse_tres(text: str) -> Tres:
    """Parse an AllocTRES/ReqTRES string; empty text is an empty allocation (pending job)."""
    pairs = [_split_pair(fragment) for fragment in text.split(",") if fragment.strip()]
    counts: dict[str, dict[str, int]] = {"gpu": {}, "shard": {}}
    totals: dict[str, int] = {}
    other: dict[str, str] = {}
    cpus = nodes = None
    memory_mib = None
    for name, value in pairs:
        gres = _gres_kind(name)
        if gres is not None:
            kind, gres_type = gres
            number = _count(name, value)
            if gres_type is None:
                totals[kind] = number
            else:
                counts[kind][gres_type] = counts[kind].get(gres_type, 0) + number
        elif name == "cpu":
            cpus = _count(name, value)
        elif name == "node":
            nodes = _count(name, value)
        elif name == "mem":
            memory_mib = _memory_mib(value)
        else:
            other[name] = value
    return Tres(
        gpus=_total(totals.get("gpu"), counts["gpu"]), gpus_by_type=counts["gpu"],
        shards=_total(totals.get("shard"), counts["shard"]), shards_by_type=counts["shard"],
        cpus=cpus, memory_mib=memory_mib, nodes=nodes, other=other,
    )


def _split_pair(fragment: str) -> tuple[str, str]:
    name, sep, value = fragment.strip().partition("=")
    if not sep or not name or not value:
        raise TresParseError(f"TRES fragment {fragment!r} is not name=value")
    return name, value


def _gres_kind(name: str) -> tuple[str, str | None] | None:
    """`gres/gpu:a100` -> ('gpu', 'a100'); `gres/shard` -> ('shard', None); else None."""
    if not name.startswith("gres/"):
        return None
    kind, _, gres_type = name.removeprefix("gres/").partition(":")
    if kind not in ("gpu", "shard"):
        return None
    return kind, gres_type or None


def _count(name: str, value: str) -> int:
    if not _COUNT_RE.match(value):
        raise TresParseError(f"TRES {name}={value!r}: expected a whole number")
    return int(value)


def _memory_mib(value: str) -> float:
    match = _MEM_RE.match(value)
    if not match:
        raise TresParseError(f"TRES mem={value!r}: expected a size like 8G or 500M")
    number, unit = match.groups()
    return float(number) * _MEM_FACTORS_MIB[unit or "M"]


def _total(untyped: int | None, typed: Mapping[str, int]) -> int:
    # Slurm prints the untyped total alongside typed counts; without it, typed counts add up.
    return untyped if untyped is not None else sum(typed.values())


def gpu_equivalents(tres: Tres, shards_per_gpu: Mapping[str, int], node_list: str = "") -> tuple[float, float, bool]:
    """(whole GPUs, shards as GPU fractions, shards resolved) for one allocation.

    A shard is 1/shards_per_gpu[type] of a GPU. Untyped shards take their type from the
    typed GPU counts or else from the node names (`a100-01` -> a100, see `_node_type`); when
    neither tells, the third value is False and the shard fraction is 0 (reports say so, never guess).
    """
    whole = float(tres.gpus)
    fraction = 0.0
    resolved = True
    untyped_shards = tres.shards - sum(tres.shards_by_type.values())
    for shard_type, count in tres.shards_by_type.items():
        per_gpu = shards_per_gpu.get(shard_type)
        if per_gpu:
            fraction += count / per_gpu
        else:
            resolved = False
    if untyped_shards > 0:
        guess = _guess_type(tres, shards_per_gpu, node_list)
        if guess is None:
            resolved = False
        else:
            fraction += untyped_shards / shards_per_gpu[guess]
    return whole, fraction, resolved


def shares_a_gpu(tres: Tres, shards_per_gpu: Mapping[str, int], node_list: str = "") -> bool:
    """Holds shards of a GPU that other jobs may hold too: not all of a GPU's shards, which is
    how the hook asks for a whole GPU on Slurm 22.05 (`rewrites.whole_as_shards`)."""
    _whole, fraction, resolved = gpu_equivalents(tres, shards_per_gpu, node_list)
    return holds_shared_fraction(tres, fraction, resolved)


def holds_shared_fraction(tres: Tres, fraction: float, resolved: bool) -> bool:
    """`shares_a_gpu` from the shard fraction `gpu_equivalents` already gave for `tres`."""
    if tres.shards == 0:
        return False
    return not resolved or fraction < 1.0 - 1e-9 or abs(fraction - round(fraction)) > 1e-9


def _guess_type(tres: Tres, shards_per_gpu: Mapping[str, int], node_list: str) -> str | None:
    known = [t for t in tres.gpus_by_type if t in shards_per_gpu]
    if len(known) == 1:
        return known[0]
    return _nodes_type(node_list, tuple(shards_per_gpu))


@lru_cache(maxsize=4096)
def _nodes_type(node_list: str, types: tuple[str, ...]) -> str | None:
    """The one type every node of the list names; None when one names none or two differ."""
    guesses = {_node_type(name, types) for name in _node_names(node_list)}
    return guesses.pop() if len(guesses) == 1 else None


def _node_type(name: str, types: tuple[str, ...]) -> str | None:
    """The longest type the name starts with at a boundary: with a10 and a100, `a100-01` and `a100n3` are a100."""
    name = name.lower()
    found = [t for t in types if t and name.startswith(t.lower()) and _boundary(t, name[len(t):])]
    return max(found, key=len) if found else None


def _boundary(type_name: str, rest: str) -> bool:
    # The type must end where a word of the name ends: `a10` is no prefix of `a100-01`, `t4` none of `t401`.
    return not rest or not rest[0].isalnum() or type_name[-1].isdigit() != rest[0].isdigit()


def _node_names(node_list: str) -> list[str]:
    if not node_list:
        return []
    if "[" not in node_list and "," not in node_list:
        return [node_list]  # NodeSet costs ~40 us; most jobs run on one plain-named node
    try:
        return [str(name) for name in NodeSet(node_list)]
    except NodeSetParseError:
        return []  # unreadable: no type from it, as for a name without one


def gpu_type_of(tres: Tres, known_types: Mapping[str, int], node_list: str = "") -> str:
    """The allocation's GPU type; an untyped one takes the type its node names carry."""
    gpu_type = tres.gpu_type
    if gpu_type != UNTYPED:
        return gpu_type
    return _guess_type(tres, known_types, node_list) or UNTYPED
