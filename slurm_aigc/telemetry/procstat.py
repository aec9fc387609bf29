"""`/proc/<pid>/stat` text: the one parser (pure; `procfs.ProcFs` reads the text).

The second field is the command name in parentheses, and a process names itself: it may
hold spaces, parentheses and anything but NUL (`prctl(PR_SET_NAME)`, `/proc/self/comm`),
so the fields are split after the last ')' and the name is what lies between the first '('
and that ')'. Field numbers are proc(5)'s (1-based).
"""

from __future__ import annotations

_START_TIME_FIELD = 22  # starttime: clock ticks after boot
_FIRST_AFTER_COMM = 3  # state


def stat_fields(stat: str) -> tuple[str, list[str]]:
    """`/proc/<pid>/stat` -> (comm, fields from state (field 3) on)."""
    close = stat.rfind(")")
    return stat[stat.find("(") + 1 : close], stat[close + 2 :].split()


def parent_pid_of(stat: str) -> int | None:
    """Field 4 (ppid), None when the text does not have it."""
    return _int_field(stat, 4)


def start_ticks_of(stat: str | None) -> int | None:
    """Field 22: start time in clock ticks since boot, which tells a reused pid apart; None if unknown."""
    return None if stat is None else _int_field(stat, _START_TIME_FIELD)


def _int_field(stat: str, number: int) -> int | None:
    fields = stat_fields(stat)[1]
    try:
        return int(fields[number - _FIRST_AFTER_COMM])
    except (IndexError, ValueError):
        return None
