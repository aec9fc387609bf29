"""Times as `sacct -S/-E` accept them: `2024-05-01`, `2024-05-01T10:00[:SS]`, `now`,
`now-3days`, `now-2hours`, `midnight`/`today`. Naive times are local (sacct's convention)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

_RELATIVE_RE = re.compile(r"^now([+-])(\d+)(seconds|minutes|hours|days|weeks|s|m|h|d|w)?$")
_UNITS = {"seconds": 1, "s": 1, "minutes": 60, "m": 60, "hours": 3600, "h": 3600,
          "days": 86400, "d": 86400, "weeks": 604800, "w": 604800}


def parse_when(text: str, now: datetime) -> datetime:
    """One time spec relative to `now` (naive, local); ValueError naming the text otherwise."""
    spec = text.strip().lower()
    if spec == "now":
        return now
    if spec in ("midnight", "today"):
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    match = _RELATIVE_RE.match(spec)
    if match:
        sign, amount, unit = match.groups()
        delta = timedelta(seconds=int(amount) * _UNITS[unit or "seconds"])
        return now - delta if sign == "-" else now + delta
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use 2024-05-01, 2024-05-01T10:00, now, now-7days)") from None
