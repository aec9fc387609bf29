"""The one GPU-usage profile grammar: `loading:30,busy:120,idle:60[,repeat]`.

`slurm-aigc gpu-load --profile-spec` plays it inside a job (telemetry/loadgen.py); the
workload file's `profile` and `requeue_profile` columns hold it (replay/workload.py), and
the replay runner hands those columns to gpu-load unchanged. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_aigc.errors import AigcError
from slurm_aigc.textfmt import short_number

PHASE_KINDS = ("loading", "busy", "idle", "hung")
REPEAT = "repeat"


class ProfileError(AigcError, ValueError):
    """A profile spec is not understood; the message names the part and the spec."""

    exit_code = 2


@dataclass(frozen=True)
class Phase:
    """One stretch of a profile: a kind and how long it lasts.

    `math.inf` (only in gpu-load's built-in profiles, never parsed) lasts until the run ends.
    """

    kind: str
    seconds: float


def parse_phases(spec: str, *, allow_repeat: bool = True) -> tuple[tuple[Phase, ...], bool]:
    """`"loading:30, busy:120,idle:60"` -> (phases, repeat); `""` -> ((), False).

    A final `repeat` item cycles the phases (refused when `allow_repeat` is False: a
    workload job must end). Every phase needs finite seconds > 0.
    """
    if not spec.strip():
        return (), False
    items = [item.strip() for item in spec.split(",")]
    repeat = items[-1] == REPEAT
    if repeat and not allow_repeat:
        raise ProfileError(f"{REPEAT!r} is not allowed in {spec!r}: a workload job's profile must have an end")
    if repeat:
        items = items[:-1]
    if not items:
        raise ProfileError(f"profile {spec!r} has no phases before {REPEAT!r}")
    return tuple(_phase(item, spec) for item in items), repeat


def _phase(item: str, spec: str) -> Phase:
    kind, sep, seconds_text = item.partition(":")
    if kind not in PHASE_KINDS:
        raise ProfileError(f"unknown phase {kind!r} in {spec!r} (use {', '.join(PHASE_KINDS)}, e.g. busy:60)")
    if not sep:
        raise ProfileError(f"phase {item!r} in {spec!r} needs seconds, e.g. {kind}:60")
    try:
        seconds = float(seconds_text)
    except ValueError:
        seconds = float("nan")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ProfileError(f"phase {item!r} in {spec!r}: seconds must be a finite number > 0")
    return Phase(kind, seconds)


def format_phases(phases: Sequence[Phase], repeat: bool = False) -> str:
    """Phases -> `"loading:30,busy:300"` (no trailing .0), which `parse_phases` reads back."""
    endless = [p.kind for p in phases if not math.isfinite(p.seconds)]
    if endless:
        raise ProfileError(f"phase {endless[0]!r} has no end and cannot be written as kind:seconds")
    parts = [f"{p.kind}:{short_number(p.seconds)}" for p in phases]
    return ",".join([*parts, REPEAT] if repeat else parts)


def total_seconds(phases: Sequence[Phase]) -> float:
    """The profile's length in seconds."""
    return sum(p.seconds for p in phases)
