"""The replay's policy: the site policy with every duration compressed like the workload (pure).

A workload compressed 60x turns a 30-minute idle window into 30 s of replay; the reclaim
windows, grace periods and cool-downs, the publisher's cycle and the agent's checks must
shrink by the same factor or nothing would ever be detected within a replay. Thresholds
(utilization, memory, power) and ladders are left exactly as the site wrote them.
"""

from __future__ import annotations

import copy
import math
from typing import Any

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
    reclaim["cooldown_s"] = _scale(reclaim.get("cooldown_s", 900), compression)
    defaults = reclaim.setdefault("defaults", {}) or {}
    reclaim["defaults"] = defaults
    for section in [defaults, *(reclaim.get("classes") or {}).values()]:
        _scale_reclaim_section(section, compression, poll_interval_s)
    scoring = result.setdefault("scoring", {}) or {}
    result["scoring"] = scoring
    scoring["interval_s"] = max(poll_interval_s, _scale(scoring.get("interval_s", 30), compression))
    scoring["window_s"] = max(5 * poll_interval_s, _scale(scoring.get("window_s", 300), compression))
    # model_unlist_grace_s stays: it must outlast the hook's refresh_seconds, which is not scaled.
    scoring["model_linger_s"] = _scale(scoring.get("model_linger_s", 300), compression)
    agent = result.setdefault("agent", {}) or {}
    result["agent"] = agent
    agent["interval_s"] = poll_interval_s
    agent["feature_check_s"] = max(poll_interval_s, _scale(agent.get("feature_check_s", 60), compression))
    agent["publish_features"] = publish_features
    return result


def _scale_reclaim_section(section: dict[str, Any], compression: float, poll_interval_s: float) -> None:
    for key in _SCALED_RECLAIM_KEYS:
        if key in section:
            section[key] = _scale(section[key], compression)
    if "window_s" in section or "min_samples" in section:
        window = section.get("window_s")
        samples = section.get("min_samples", 10)
        if window is not None:
            # A window holds window/interval samples; ask for half of them, like the site's ratio at worst.
            samples = min(samples, math.floor(window / poll_interval_s / 2))
        section["min_samples"] = max(MIN_SAMPLES_FLOOR, int(samples))


def _scale(seconds: float, compression: float) -> float:
    return max(MIN_SECONDS, round(float(seconds) / compression, 1))
