"""Build `sacct --json` answers for tests from rows written the old way (sacct -P field names).

Many tests describe jobs as sacct's text fields (`JobID`, `AllocTRES=gres/gpu=2`, `Submit` as
`YYYY-MM-DDTHH:MM:SS` in UTC). `sacct_json(rows)` turns them into what 22.05's `sacct --json`
prints, so those tests feed the product's JSON reader. This splitting is for test data only;
the product never reads sacct text (user text could forge rows there).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

# The field names the tests write (sacct -P's spelling) and the unit separator they join with.
FIELDS: tuple[str, ...] = (
    "JobID", "JobIDRaw", "JobName", "User", "Account", "Partition", "QOS", "State",
    "Submit", "Eligible", "Start", "End", "AllocTRES", "NodeList",
    "AdminComment", "Comment", "ElapsedRaw",
)
DELIMITER = "\x1f"


# What 22.05's sacct --json says beside `"jobs": []` when nothing matches (checked on 22.05.8).
NOTHING_FOUND = {"description": "Nothing found", "error_number": 9003, "error": "Nothing found with query",
                 "source": "slurmdb_jobs_get"}


def sacct_json(rows: Iterable[Mapping[str, str]]) -> str:
    """Rows of sacct field values -> 22.05's `sacct --json` text (an error beside no job, as 22.05)."""
    jobs = [job(r) for r in rows]
    errors = [] if jobs else [NOTHING_FOUND]
    return json.dumps({"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": errors, "jobs": jobs})


def text_to_json(text: str) -> str:
    """`header\\nrow\\n...` joined with DELIMITER (as tests used to write sacct output) -> sacct JSON.

    A row with the wrong number of fields becomes a record without a submit time, which
    the reader skips with a reason, as it skipped the malformed line.
    """
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return sacct_json([])
    names = lines[0].split(DELIMITER)
    rows = []
    for line in lines[1:]:
        values = line.split(DELIMITER)
        rows.append(dict(zip(names, values)) if len(values) == len(names) else {"JobIDRaw": "0", "Submit": ""})
    return sacct_json(rows)


def job(row: Mapping[str, str]) -> dict[str, Any]:
    get = row.get
    raw = int(get("JobIDRaw") or get("JobID") or 0) if (get("JobIDRaw") or get("JobID") or "0").isdigit() else 0
    array, het = _ids(get("JobID") or str(raw))
    return {
        "job_id": raw, "name": get("JobName", ""), "user": get("User", ""), "account": get("Account", ""),
        "partition": get("Partition", ""), "qos": get("QOS", ""), "nodes": get("NodeList", ""),
        "state": {"current": (get("State") or "COMPLETED").split(" ")[0], "reason": "None"},
        "comment": {"administrator": get("AdminComment") or None, "job": get("Comment", ""), "system": None},
        "array": array, "het": het,
        "time": {"submission": _epoch(get("Submit")), "eligible": _epoch(get("Eligible")), "start": _epoch(get("Start")),
                 "end": _epoch(get("End")), "elapsed": int(get("ElapsedRaw") or 0) if (get("ElapsedRaw") or "0").isdigit() else 0},
        "tres": {"allocated": _tres(get("AllocTRES", ""))}, "steps": [],
    }


def _ids(job_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    array: dict[str, Any] = {"job_id": 0, "task_id": None}
    het: dict[str, Any] = {"job_id": 0, "job_offset": None}
    if match := re.fullmatch(r"(\d+)_(\d+)", job_id):
        array = {"job_id": int(match.group(1)), "task_id": int(match.group(2))}
    elif match := re.fullmatch(r"(\d+)\+(\d+)", job_id):
        het = {"job_id": int(match.group(1)), "job_offset": int(match.group(2))}
    return array, het


def _epoch(value: str | None) -> int:
    if not value or value.strip() in ("Unknown", "None", "N/A"):
        return 0
    return int(datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp())


def _tres(text: str) -> list[dict[str, Any]]:
    items = []
    for fragment in (f for f in text.split(",") if f):
        key, _, value = fragment.partition("=")
        kind, _, name = key.partition("/")
        count: Any = _mib(value) if key == "mem" else (int(value) if value.isdigit() else value)
        items.append({"type": kind, "name": name or None, "id": 0, "count": count})
    return items


def _mib(value: str) -> int:
    match = re.fullmatch(r"([\d.]+)([KMGT]?)", value)
    if not match:
        return 0
    scale = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}[match.group(2)]
    return int(float(match.group(1)) * scale)
