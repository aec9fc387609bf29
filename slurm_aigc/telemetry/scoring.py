"""Node scoring for the publisher: named plugins, weighted, summed (Kubernetes scheduler style).

A scoring plugin is a pure function `NodeView -> score in [0, 100]` where, as in the
Kubernetes scheduler, a HIGHER score means the node should be PREFERRED. The YAML names the
plugins and their weights; the weighted mean of the scores becomes a Slurm node `Weight` in
the configured range. Slurm prefers LOWER weights, so the mapping is inverted:
score 100 -> `weight_min`, score 0 -> `weight_max`.

Plugins:

* `cool_first` - measured utilization: score = 100 - mean SM utilization over the window,
  so a busier node gets a higher Slurm weight and new jobs go to cooler nodes first. A node
  without samples scores a neutral 50.
* `pack_keep_islands` - best-fit packing that keeps whole free NVLink islands for big jobs:
  score = 100 * (1 - (free + whole_free) / (2 * total)), where `whole_free` counts free GPUs
  in NVLink islands (size > 1) that are entirely free. A fresh 8-GPU NVLink node scores 0
  (kept for big jobs), a node whose island is already broken scores high (fill it first),
  a full node scores 100. Among nodes without NVLink it is plain best fit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

NEUTRAL_SCORE = 50.0


@dataclass(frozen=True)
class IslandUse:
    """One NVLink island of a node: its GPU indices and which of them are free."""

    gpus: tuple[int, ...]
    free: tuple[int, ...]

    @property
    def whole_free(self) -> bool:
        return len(self.gpus) > 1 and len(self.free) == len(self.gpus)


@dataclass(frozen=True)
class NodeView:
    """What the publisher knows about one node in one cycle."""

    name: str
    gpus_total: int
    gpus_alloc: int
    islands: tuple[IslandUse, ...] = ()
    mean_util_pct: float | None = None
    models_serving: frozenset[str] = field(default_factory=frozenset)
    gpu_type: str | None = None

    @property
    def gpus_free(self) -> int:
        return max(self.gpus_total - self.gpus_alloc, 0)

    @property
    def free_nvlink_set(self) -> int:
        """Size of the largest set of free GPUs connected by NVLink (1 for a lone free GPU)."""
        return max((len(island.free) for island in self.islands if island.free), default=0)

    @property
    def whole_free_gpus(self) -> int:
        return sum(len(island.gpus) for island in self.islands if island.whole_free)


Scorer = Callable[[NodeView], float]


def cool_first(view: NodeView) -> float:
    """Prefer cooler nodes: 100 - mean SM utilization (neutral without samples)."""
    if view.mean_util_pct is None:
        return NEUTRAL_SCORE
    return _clamp(100.0 - view.mean_util_pct)


def pack_keep_islands(view: NodeView) -> float:
    """Best fit that keeps whole free NVLink islands for big jobs (see module docstring)."""
    if view.gpus_total <= 0:
        return NEUTRAL_SCORE
    free = view.gpus_free
    return _clamp(100.0 * (1.0 - (free + view.whole_free_gpus) / (2.0 * view.gpus_total)))


SCORERS: dict[str, Scorer] = {
    "cool_first": cool_first,
    "pack_keep_islands": pack_keep_islands,
}


def register(name: str, scorer: Scorer) -> None:
    """Add a site plugin; YAML may then name it under `scoring.policies`."""
    if name in SCORERS:
        raise ValueError(f"a scoring plugin named {name!r} exists already")
    SCORERS[name] = scorer


def combined_score(view: NodeView, policies: Mapping[str, float]) -> float:
    """Weighted mean of the named plugins' scores (0..100); neutral when no weight is set."""
    total_weight = sum(weight for weight in policies.values() if weight > 0)
    if total_weight <= 0:
        return NEUTRAL_SCORE
    weighted = sum(SCORERS[name](view) * weight for name, weight in policies.items() if weight > 0)
    return weighted / total_weight


def slurm_weight(score: float, weight_min: int, weight_max: int) -> int:
    """Map a score (100 = most preferred) to a Slurm Weight (lower = preferred)."""
    fraction = _clamp(score) / 100.0
    return round(weight_max - fraction * (weight_max - weight_min))


def node_weight(view: NodeView, policies: Mapping[str, float], weight_min: int, weight_max: int) -> int:
    """The Slurm Weight the publisher wants for `view`."""
    return slurm_weight(combined_score(view, policies), weight_min, weight_max)


def _clamp(score: float) -> float:
    return min(max(score, 0.0), 100.0)
