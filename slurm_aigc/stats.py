"""Summary statistics shared by replay metrics and reports (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean; None for no values."""
    return sum(values) / len(values) if values else None


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile: the value at rank ceil(pct/100 x n), so p95 of 20 values is the
    19th smallest; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]
