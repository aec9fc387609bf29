"""Slurm's `--json` output read into plain values, for every shape from 22.05 to 24.11.

25.05 to 26.05 are read in 24.11's shape too: the boundary asks them for `--json=v0.0.42`
(`SlurmCli.json_option`), since their default data_parser (v0.0.43+) is untested.

Why JSON: users write job names, comments and work directories, and may change a running
job's comment. Text output (`scontrol show job -o`, `sacct -P`) puts those next to the
fields we trust with nothing a user cannot type in between, so a comment holding
` JobId=7 UserId=bob` or a newline and a delimiter forges fields or whole rows. In JSON a
user's text is one quoted string value and cannot leave it.

Shapes (from Slurm's sources):
- 22.05 (`openapi/v0.0.38`, `dbv0.0.38`): plain numbers (null for unset), `job_state` a
  string, a node's `state` in lower case with `state_flags` beside it, per-node job
  resources in `job_resources/allocated_nodes[]/nodename`.
- 23.02+ (`data_parser` v0.0.39 ... v0.0.42; 24.11 prints v0.0.42 by default): numbers that
  may be unset or unlimited are `{"set": .., "infinite": .., "number": ..}`, states are flag
  lists (`["PENDING", "REQUEUED"]`, `["IDLE", "DRAIN"]`); from v0.0.41 the per-node
  resources are in `job_resources/nodes/allocation[]/name`.
Nothing here runs a command: these are pure functions over decoded JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_aigc.errors import SlurmParseError

JsonObject = Mapping[str, Any]

# slurm_job_state_string(): a job's state flags win over its base state, in this order
# (src/common/slurm_protocol_defs.c), so `["COMPLETED", "COMPLETING"]` reads COMPLETING.
_STATE_FLAG_ORDER = (
    "COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING",
)


# ESLURM_REST_EMPTY_RESULT (slurm/slurm_errno.h): Slurm 22.05's `sacct --json` answers a query
# that matches no job with `"jobs": []` and this error ("Nothing found", from slurmdb_jobs_get).
# An empty answer is an answer: raising made every empty window fail (a quiet night stopped the
# learner, which retries the window it failed on, and failed the controller's tick with it).
EMPTY_RESULT = 9003


def _is_error(entry: object) -> bool:
    return bool(entry) and not (isinstance(entry, Mapping) and entry.get("error_number") == EMPTY_RESULT)


def load(text: str, what: str) -> JsonObject:
    """Decode one `--json` answer; a non-object or a non-empty `errors` list raises ("Nothing
    found", `EMPTY_RESULT`, is no error)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise SlurmParseError(f"{what}: not JSON ({error.msg} at line {error.lineno}); is Slurm's serializer/json plugin installed?") from None
    if not isinstance(data, dict):
        raise SlurmParseError(f"{what}: expected a JSON object, got {type(data).__name__}")
    errors = [e for e in data.get("errors") or [] if _is_error(e)]
    if errors:
        raise SlurmParseError(f"{what}: Slurm reported {errors!r}")
    return data


def records(data: JsonObject, key: str, what: str) -> list[JsonObject]:
    """`data[key]` as a list of objects (`jobs`, `nodes`); anything else raises."""
    value = data.get(key)
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise SlurmParseError(f"{what}: expected a list of objects under {key!r}")
    return value


def number(value: Any) -> int | None:
    """22.05's plain number or null, 23.02+'s `{"set", "infinite", "number"}`; unset/unlimited -> None."""
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value)
    raise SlurmParseError(f"expected a number, got {value!r}")


def text(value: Any) -> str:
    """A string field; null reads as empty (22.05 prints null for an unset string)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise SlurmParseError(f"expected a string, got {value!r}")


def string_list(value: Any) -> tuple[str, ...]:
    """A CSV string (22.05 `features`) or a list of strings (23.02+) -> its items."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(part for part in value.split(",") if part)
    if isinstance(value, list):
        return tuple(text(item) for item in value if item)
    raise SlurmParseError(f"expected a list of strings, got {value!r}")


def job_state(value: Any) -> str:
    """`"RUNNING"` (22.05) or `["PENDING", "REQUEUED"]` (23.02+) -> the word scontrol prints."""
    if isinstance(value, str):
        return value
    states = string_list(value)
    for flag in _STATE_FLAG_ORDER:
        if flag in states:
            return flag
    return states[0] if states else ""


def node_state(node: JsonObject) -> str:
    """`"idle"` + `state_flags: ["DRAIN"]` (22.05) or `["IDLE", "DRAIN"]` -> `IDLE+DRAIN` as scontrol prints it."""
    value = node.get("state")
    words = [value] if isinstance(value, str) else list(string_list(value))
    words += [flag for flag in string_list(node.get("state_flags")) if flag not in words]
    return "+".join(word.upper() for word in words)


def tres_text(value: Any) -> str:
    """sacct's TRES list `[{"type": "gres", "name": "gpu", "count": 2}, ...]` -> `gres/gpu=2,...`.

    Memory counts are MiB, written `mem=NM` as `sacct --noconvert` prints them.
    A string (already `cpu=1,...`) is returned as it is.
    """
    if isinstance(value, str) or value is None:
        return text(value)
    parts = []
    for item in value:
        count = number(item.get("count"))
        if count is None:
            continue  # `energy` with no reading
        kind, name = text(item.get("type")), text(item.get("name"))
        key = f"{kind}/{name}" if name else kind
        parts.append(f"{key}={count}M" if key == "mem" else f"{key}={count}")
    return ",".join(parts)


def job_node_names(job: JsonObject) -> list[str]:
    """The job's nodes in the order of its `gres_detail` (slurmctld's node order)."""
    resources = job.get("job_resources") or {}
    if not isinstance(resources, dict):
        return []
    nodes = resources.get("nodes")
    if isinstance(nodes, dict):  # v0.0.41+
        return [text(n.get("name")) for n in nodes.get("allocation") or []]
    return [text(n.get("nodename") or n.get("name")) for n in resources.get("allocated_nodes") or []]


def gres_detail(job: JsonObject) -> tuple[tuple[str, str], ...]:
    """(node, `gpu:a100:2(IDX:0-1)`) per allocated node from `gres_detail`.

    The list is printed by slurmctld in node order without node names; names come from
    `job_resources`. A one-node job maps directly even if `job_resources` is absent.
    """
    detail: Sequence[Any] = job.get("gres_detail") or []
    names = job_node_names(job)
    if len(names) != len(detail) and len(detail) == 1 and "," not in text(job.get("nodes")):
        names = [text(job.get("nodes"))]
    if len(names) != len(detail):
        return ()
    return tuple((name, text(entry)) for name, entry in zip(names, detail))
