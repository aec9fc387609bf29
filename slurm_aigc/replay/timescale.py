"""The replay's policy: the site policy with every duration compressed like the workload (pure).

A workload compressed 60x turns a 30-minute idle window into 30 s of replay; the reclaim
windows, grace periods and cool-downs, the publisher's cycle and the agent's checks must
shrink by the same factor or nothing would ever be detected within a replay. Thresholds
(utilization, memory, power) and ladders are left exactly as the site wrote them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_aigc.policy.model import AgentConfig, ClassPolicy, ReclaimConfig, ScoringConfig
from slurm_aigc.replay.workload import Workload, WorkloadJob

MIN_SECONDS = 2.0
MIN_SAMPLES_FLOOR = 3
_SCALED_RECLAIM_KEYS = ("grace_s", "window_s")


def replay_policy(policy: dict[str, Any], compression: float, poll_interval_s: float, *, publish_features: bool) -> dict[str, Any]:
    """A copy of `policy` (parsed YAML) with durations divided by `compression`."""
    if compression <= 0 or poll_interval_s <= 0:
        raise ValueError("compression and poll_interval_s must be > 0")
    result = copy.deepcopy(policy)
    reclaim = result.setdefault("reclaim", {}) or {}
    result["reclaim"] = reclaim
    reclaim["poll_interval_s"] = poll_interval_s
    # A key the site left out has the loader's default (policy/model.py), the one default there is.
    reclaim["cooldown_s"] = _scale(reclaim.get("cooldown_s", ReclaimConfig.cooldown_s), compression)
    defaults = reclaim.setdefault("defaults", {}) or {}
    reclaim["defaults"] = defaults
    # A class without its own min_samples inherits the defaults section's, as the loader reads it.
    inherited = defaults.get("min_samples", ClassPolicy.min_samples)
    for section in [defaults, *(reclaim.get("classes") or {}).values()]:
        _scale_reclaim_section(section, compression, poll_interval_s, inherited)
    scoring = result.setdefault("scoring", {}) or {}
    result["scoring"] = scoring
    scoring["interval_s"] = max(poll_interval_s, _scale(scoring.get("interval_s", ScoringConfig.interval_s), compression))
    scoring["window_s"] = max(5 * poll_interval_s, _scale(scoring.get("window_s", ScoringConfig.window_s), compression))
    # model_unlist_grace_s stays: it must outlast the hook's refresh_seconds, which is not scaled.
    scoring["model_linger_s"] = _scale(scoring.get("model_linger_s", ScoringConfig.model_linger_s), compression)
    agent = result.setdefault("agent", {}) or {}
    result["agent"] = agent
    agent["interval_s"] = poll_interval_s
    agent["feature_check_s"] = max(poll_interval_s, _scale(agent.get("feature_check_s", AgentConfig.feature_check_s), compression))
    agent["publish_features"] = publish_features
    return result


def _scale_reclaim_section(section: dict[str, Any], compression: float, poll_interval_s: float,
                           inherited_min_samples: int) -> None:
    for key in _SCALED_RECLAIM_KEYS:
        if key in section:
            section[key] = _scale(section[key], compression)
    if "window_s" in section or "min_samples" in section:
        window = section.get("window_s")
        samples = section.get("min_samples", inherited_min_samples)
        if window is not None:
            # A window holds window/interval samples; ask for half of them, like the site's ratio at worst.
            samples = min(samples, math.floor(window / poll_interval_s / 2))
        section["min_samples"] = max(MIN_SAMPLES_FLOOR, int(samples))


def _scale(seconds: float, compression: float) -> float:
    return max(MIN_SECONDS, round(float(seconds) / compression, 1))


# ---------------------------------------------------------------- can reclaim fire at all?

COMPRESSION_KEY = "compression"


@dataclass(frozen=True)
class Compression:
    """The compression a workload replays at and where that number came from."""

    factor: float
    from_file: bool

    def describe(self) -> str:
        if self.from_file:
            return f"compression {self.factor:g} (the workload's `# compression:` line): policy durations are divided by {self.factor:g}"
        return ("compression 1 (the workload has no `# compression:` line): the site policy's durations apply unscaled; "
                "add `# compression: N` to the file when its times are N-fold shortened")


def workload_compression(meta: Mapping[str, str]) -> Compression:
    """The factor of a workload's `# compression:` line; 1 when there is none (a hand-written file)."""
    text = (meta.get(COMPRESSION_KEY) or "").strip()
    if not text:
        return Compression(1.0, from_file=False)
    try:
        factor = float(text)
    except ValueError:
        raise ValueError(f"the workload's `# compression:` line must be a number > 0, got {text!r}") from None
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"the workload's `# compression:` line must be a number > 0, got {text!r}")
    return Compression(factor, from_file=True)


@dataclass(frozen=True)
class ClassReach:
    """One class of a workload: when (scaled) reclaim could first act on it vs its longest job."""

    job_class: str
    grace_s: float
    window_s: float
    longest_job_s: float

    @property
    def first_verdict_s(self) -> float:
        """A job can be judged no earlier than its start-up grace plus one full window."""
        return self.grace_s + self.window_s

    @property
    def can_fire(self) -> bool:
        return self.longest_job_s > self.first_verdict_s


def reclaim_reach(reclaim: ReclaimConfig, compression: float, longest_by_class: Mapping[str, float],
                  replay_s: float | None = None) -> list[ClassReach]:
    """Per class of the workload: the site's grace + window, scaled as `replay_policy` scales
    them, against the longest job of that class.

    `reclaim` is the site policy's section as `load_policy` read it; `longest_by_class` the
    longest time a job of each class holds its GPUs (its run, or its time limit when it hangs);
    `replay_s` (a backlogged replay's duration) cuts every job there.
    """
    cap = math.inf if replay_s is None else replay_s
    return [ClassReach(name, _scale(reclaim.policy_for(name).grace_s, compression),
                       _scale(reclaim.policy_for(name).window_s, compression), min(longest, cap))
            for name, longest in sorted(longest_by_class.items())]


def reach_warnings(reach: Sequence[ClassReach], compression: Compression) -> list[str]:
    """One warning per class whose scaled reclaim windows outlast every job of it; a summary when none can fire."""
    blocked = [r for r in reach if not r.can_fire]
    lines = [f"warning: class {r.job_class}: reclaim needs grace {r.grace_s:g} s + window {r.window_s:g} s = "
             f"{r.first_verdict_s:g} s of replay, but its longest job holds its GPUs {r.longest_job_s:g} s: "
             f"no {r.job_class} job can be reclaimed" for r in blocked]
    if reach and len(blocked) == len(reach):
        hint = "" if compression.from_file else " (no `# compression:` line: set one to the factor the file's times were divided by)"
        lines.append(f"warning: at compression {compression.factor:g} the reclaim windows cannot fire within this replay: "
                     f"nothing will be reclaimed{hint}")
    return lines


def longest_hold_by_class(jobs: Iterable[WorkloadJob]) -> dict[str, float]:
    """The longest a job of each class holds its GPUs: its run, cut at its time limit (a hung job)."""
    longest: dict[str, float] = {}
    for job in jobs:
        longest[job.job_class] = max(longest.get(job.job_class, 0.0), min(job.duration_s, job.time_limit_s))
    return longest


def compression_report(workload: Workload, reclaim: ReclaimConfig, replay_s: float | None = None) -> list[str]:
    """What `replay show`/`compare` print: the compression that applies, then any reach warnings.

    Raises ValueError for an unreadable `# compression:` line.
    """
    compression = workload_compression(workload.meta)
    reach = reclaim_reach(reclaim, compression.factor, longest_hold_by_class(workload.jobs), replay_s)
    return [compression.describe(), *reach_warnings(reach, compression)]
