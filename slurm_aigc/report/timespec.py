"""Times as `sacct -S/-E` accept them: `2024-05-01`, `2024-05-01T10:00[:SS]`, `now`,
`now-3days`, `now-2hours`, `midnight`/`today`. Naive times are local (sacct's convention)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

_RELATIVE_RE = re.compile(r"^now([+-])(\d+)(seconds|minutes|hours|days|weeks|s|m|h|d|w)?$")
_UNITS = {"seconds": 1, "s": 1, "minutes": 60, "m": 60, "hours": 3600, "h": 3600,
          "days": 86400, "d": 86400, "weeks": 604800, "w": 604800}


def parse_when(text: str, now: datetime) -> datetime:
    """One time spec relative to `now` (naive, local); ValueError naming the text otherwise,
    also for a time out of range (`now-99999999days`: no OverflowError gets out)."""
    moment = _parse(text, now)
    try:
        moment.timestamp()  # the year 1 (and 9999 east of UTC) has none
    except (OverflowError, OSError, ValueError):
        raise ValueError(_out_of_range(text)) from None
    return moment


def _parse(text: str, now: datetime) -> datetime:
    spec = text.strip().lower()
    if spec == "now":
        return now
    if spec in ("midnight", "today"):
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    match = _RELATIVE_RE.match(spec)
    if match:
        sign, amount, unit = match.groups()
        try:
            delta = timedelta(seconds=int(amount) * _UNITS[unit or "seconds"])  # int(): ValueError past 4300 digits
            return now - delta if sign == "-" else now + delta
        except (OverflowError, ValueError):
            raise ValueError(_out_of_range(text)) from None
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use 2024-05-01, 2024-05-01T10:00, now, now-7days)") from None


def _out_of_range(text: str) -> str:
    shown = text.strip() if len(text.strip()) <= 40 else f"{text.strip()[:40]}..."
    return f"out of range: {shown!r} (use a time between the years 1 and 9999)"
