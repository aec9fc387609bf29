"""The Slurm boundary: every call slurm-aigc makes to Slurm goes through `SlurmCli`.

The command-line tools are the default backend because they work on every Slurm from 22.05
to 25.x, while pyslurm must match the installed Slurm exactly and PyPI ships it only for
25.11. Commands run as argument lists (never a shell) with a timeout; failures raise
`SlurmCommandError` carrying argv, exit code and stderr. The interface is narrow (nodes,
jobs, a handful of updates) so that a pyslurm backend can implement the same methods.

Jobs and nodes are read as JSON (`slurm_aigc.slurmjson`), never from `scontrol show -o`
text: job names, comments and work directories are user text, and in `Key=value` text a
comment such as `x JobId=53 Account=vip` is indistinguishable from Slurm's own fields.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from slurm_aigc import slurmjson
from slurm_aigc.errors import SlurmCommandError, SlurmParseError
from slurm_aigc.slurmjson import JsonObject
from slurm_aigc.slurmrecords import JobInfo as JobInfo  # re-exported: callers import them from here too
from slurm_aigc.slurmrecords import NodeInfo as NodeInfo

LOG = logging.getLogger(__name__)

# `scontrol --json` exists from 23.02 (data_parser); 22.05 has `squeue --json` and
# `sinfo --json` only (openapi/v0.0.38), and its squeue ignores `-j` with `--json`.
SCONTROL_JSON_SINCE = (23, 2, 0)
# `--json` alone answers in the newest data_parser a release ships (v0.0.42 on 24.11, v0.0.43
# on 25.05, ... v0.0.45 on 26.05), so from 25.05 on the boundary asks for v0.0.42, the newest
# shape CI reads (24.11's default). Releases 24.11 to 26.05 ship it; 26.11 drops it. 22.05
# (openapi v0.0.38, no data_parser) and 24.11 keep plain `--json` (docs/slurm-boundary.md).
JSON_PARSER_PINNED = "v0.0.42"
JSON_PIN_SINCE, JSON_PIN_UNTIL = (25, 5, 0), (26, 11, 0)
JSON_TOOLS = frozenset({"scontrol", "squeue", "sinfo", "sacct"})


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs argv with a timeout; `stdin` is only passed by `submit` (the batch script)."""

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult: ...


def run_command(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
    """Run `argv` without a shell; a timeout becomes SlurmCommandError(returncode=None)."""
    try:
        completed = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False,
            errors="replace",
        )
    except subprocess.TimeoutExpired as error:
        raise SlurmCommandError(argv, None, f"no answer within {timeout_s:.0f} s") from error
    except FileNotFoundError as error:
        raise SlurmCommandError(argv, 127, f"{argv[0]} not found: is Slurm's client installed?") from error
    return CommandResult(tuple(argv), completed.returncode, completed.stdout, completed.stderr)


# Slurm's keys are CamelCase (`JobId`, `ReqB:S:C:T`, `CPUs/Task`); user text such as the
# comment's `aigc:type=infer` tags starts lower-case, so only an upper-case word starts a key.
_KV_RE = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")


def parse_key_values(line: str) -> dict[str, str]:
    """Split one `scontrol show ... -o` line into a mapping.

    Never use it on output that holds user text (a job's name, comment, work directory,
    command): a value runs until the next ` Key=` token, so user text can forge fields.
    Kept for admin-only output (`scontrol show partition -o`, written in slurm.conf).
    """
    matches = list(_KV_RE.finditer(line))
    result: dict[str, str] = {}
    for current, following in zip(matches, matches[1:] + [None]):
        end = following.start() if following else len(line)
        result[current.group(1)] = line[current.end():end].strip()
    return result


def parse_duration_s(value: str | None) -> int | None:
    """`[days-]hh:mm:ss`, `mm:ss`, `UNLIMITED` -> seconds (None for unlimited/unknown)."""
    if not value or value in {"UNLIMITED", "Partition_Limit", "NONE", "INVALID"}:
        return None
    days = 0
    if "-" in value:
        day_text, value = value.split("-", 1)
        days = int(day_text)
    parts = [int(p) for p in value.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _epoch_time(value: object) -> datetime | None:
    """An epoch from JSON (0/unset = unknown) -> local naive datetime, as scontrol prints it."""
    seconds = slurmjson.number(value)
    return datetime.fromtimestamp(seconds) if seconds else None


def _compat_fields(pairs: Mapping[str, object]) -> dict[str, str]:
    return {key: str(value) for key, value in pairs.items() if value not in (None, "")}


def job_from_json(job: JsonObject) -> JobInfo:
    """One entry of `squeue --json` (22.05) or `scontrol --json show job` (23.02+) -> JobInfo."""
    t = slurmjson.text
    limit_min = slurmjson.number(job.get("time_limit"))
    alloc = t(job.get("tres_alloc_str")) or t(job.get("tres_req_str"))  # as scontrol's TRES=
    priority = slurmjson.number(job.get("priority"))
    return JobInfo(
        job_id=str(slurmjson.number(job.get("job_id"))), name=t(job.get("name")),
        user=t(job.get("user_name")), account=t(job.get("account")), partition=t(job.get("partition")),
        qos=t(job.get("qos")), state=slurmjson.job_state(job.get("job_state")),
        reason=t(job.get("state_description")) or t(job.get("state_reason")),  # scontrol's Reason=
        node_list=t(job.get("nodes")), batch_flag=bool(job.get("batch_flag")), requeue=bool(job.get("requeue")),
        restarts=slurmjson.number(job.get("restart_cnt")) or 0,
        submit_time=_epoch_time(job.get("submit_time")), start_time=_epoch_time(job.get("start_time")),
        end_time=_epoch_time(job.get("end_time")),
        time_limit_s=None if limit_min is None else limit_min * 60,
        comment=t(job.get("comment")), admin_comment=t(job.get("admin_comment")),
        tres_per_node=t(job.get("tres_per_node")), alloc_tres=alloc,
        num_nodes=slurmjson.number(job.get("node_count")) or 1, features=t(job.get("features")),
        fields=_compat_fields({"TresPerJob": t(job.get("tres_per_job")), "TresPerNode": t(job.get("tres_per_node")),
                               "Priority": priority, "Prefer": t(job.get("prefer")), "Features": t(job.get("features")),
                               "Comment": t(job.get("comment")), "AdminComment": t(job.get("admin_comment")),
                               "StateReason": t(job.get("state_reason"))}),
        gres_detail=slurmjson.gres_detail(job), work_dir=t(job.get("current_working_directory")),
    )


def node_from_json(node: JsonObject) -> NodeInfo:
    """One node of `sinfo --json` (22.05) or `scontrol --json show node` (23.02+) -> NodeInfo."""
    t = slurmjson.text
    return NodeInfo(
        name=t(node.get("name")), state=slurmjson.node_state(node),
        gres=_null_empty(t(node.get("gres"))), gres_used=_null_empty(t(node.get("gres_used"))),
        available_features=slurmjson.string_list(node.get("features")),
        active_features=slurmjson.string_list(node.get("active_features")),
        weight=slurmjson.number(node.get("weight")) or 1, cpus=slurmjson.number(node.get("cpus")) or 0,
        partitions=slurmjson.string_list(node.get("partitions")),
        fields=_compat_fields({"AllocTRES": t(node.get("tres_used")), "OS": t(node.get("operating_system"))}),
    )


def active_features_after(current: NodeInfo, features: Sequence[str]) -> tuple[str, ...]:
    """The ActiveFeatures to write with `AvailableFeatures=<features>` on `current`.

    Without a node_features plugin slurmctld keeps ActiveFeatures equal to AvailableFeatures,
    and so does this: `features` as given. With one (helpers, knl_*) the active list is the
    mode the node booted in, a subset of the available ones; only what changes in the
    available list changes in it, every other active feature stays (docs/daemons.md has
    slurmctld's rules, 22.05 to 26.05). Never an active feature outside `features`:
    slurmctld refuses the whole update then (ESLURM_ACTIVE_FEATURE_NOT_SUBSET). An empty
    active list reads as "the available ones", as slurmctld's update_node treats a NULL one.
    """
    before, after = set(current.available_features), set(features)
    if not current.active_features or set(current.active_features) == before:
        return tuple(features)
    kept = [f for f in current.active_features if f in after]  # what we withdraw leaves both lists
    added = [f for f in features if f not in before and f not in kept]
    return tuple(kept + added)


def _null_empty(value: str | None) -> str:
    return "" if value in (None, "(null)") else str(value)


def slurm_conf_path() -> Path:
    """The slurm.conf clients use: `$SLURM_CONF`, else Debian's /etc/slurm/slurm.conf."""
    return Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))


def slurm_conf_dir() -> Path:
    """Slurm's config directory (where job_submit.lua lives), following symlinks."""
    return slurm_conf_path().resolve().parent


class SlurmCli:
    """Slurm through its command-line tools."""

    def __init__(self, runner: Runner = run_command, timeout_s: float = 30.0,
                 slurm_version: tuple[int, int, int] | None = None) -> None:
        self._runner = runner
        self._timeout_s = timeout_s
        self._version = slurm_version
        self._warned_json = False
        # The last listing's records by job id, each with its JobInfo (see `jobs`).
        self._listed: dict[int | None, tuple[JsonObject, JobInfo]] = {}

    def _slurm_version(self) -> tuple[int, int, int]:
        """`scontrol --version`, asked once per SlurmCli."""
        if self._version is None:
            self._version = self.version()
        return self._version

    def _json_scontrol(self) -> bool:
        """Which JSON source to read, chosen once per SlurmCli from `scontrol --version`."""
        return self._slurm_version() >= SCONTROL_JSON_SINCE

    def json_option(self) -> str:
        """`--json`, or `--json=v0.0.42` on Slurm 25.05 to 26.05 (one tested output shape)."""
        version = self._slurm_version()
        if JSON_PIN_SINCE <= version < JSON_PIN_UNTIL:
            return f"--json={JSON_PARSER_PINNED}"
        if version >= JSON_PIN_UNTIL and not self._warned_json:
            self._warned_json = True
            LOG.warning("Slurm %d.%02d has no data_parser %s: reading its default --json output, a shape "
                        "slurm-aigc was not tested on", version[0], version[1], JSON_PARSER_PINNED)
        return "--json"

    def _pin_json(self, argv: Sequence[str]) -> list[str]:
        """argv with a bare `--json` of scontrol/squeue/sinfo/sacct replaced by `json_option()`."""
        if argv[0] not in JSON_TOOLS or "--json" not in argv[1:]:
            return list(argv)
        option = self.json_option()
        return [argv[0], *(option if arg == "--json" else arg for arg in argv[1:])]

    def run(self, tool: str, args: Sequence[str]) -> CommandResult:
        """Run one Slurm tool; a non-zero exit raises SlurmCommandError. `--json` is pinned (`json_option`)."""
        result = self._runner(self._pin_json([tool, *args]), self._timeout_s)
        if result.returncode != 0:
            raise SlurmCommandError(result.argv, result.returncode, result.stderr or result.stdout)
        return result

    def version(self) -> tuple[int, int, int]:
        """`scontrol --version` -> (22, 5, 8)."""
        text = self.run("scontrol", ["--version"]).stdout
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
        if not match:
            raise SlurmParseError(f"cannot read a version from {text.strip()!r}")
        major, minor, patch = (int(g) for g in match.groups())
        return major, minor, patch

    def nodes(self, names: Sequence[str] | None = None) -> list[NodeInfo]:
        """Every node (or `names`) with GRES in use (`GresUsed`, the GPU indices held).

        22.05: `sinfo --json` (one entry per node there; from 23.11 sinfo groups nodes, so
        23.02+ uses `scontrol -d --json show node`). Names are filtered here either way.
        """
        if self._json_scontrol():
            args = ["-d", "--json", "show", "node"] + ([",".join(names)] if names else [])
            data = slurmjson.load(self.run("scontrol", args).stdout, "scontrol --json show node")
        else:
            data = slurmjson.load(self.run("sinfo", ["--json"]).stdout, "sinfo --json")
        nodes = [node_from_json(entry) for entry in slurmjson.records(data, "nodes", "node list")]
        return [node for node in nodes if not names or node.name in names]

    def node(self, name: str) -> NodeInfo:
        nodes = self.nodes([name])
        if not nodes:
            raise SlurmParseError(f"scontrol show node {name} returned nothing")
        return nodes[0]

    def update_node(self, name: str, *, features: Sequence[str] | None = None, weight: int | None = None,
                    current: NodeInfo | None = None) -> None:
        """`scontrol update NodeName=N AvailableFeatures=.. ActiveFeatures=.. Weight=..`.

        `current`: the node as listed just before (`active_features_after`); None writes
        `features` as ActiveFeatures too, right only where no node_features plugin runs.
        """
        args = ["update", f"NodeName={name}"]
        if features is not None:
            active = features if current is None else active_features_after(current, features)
            args += [f"AvailableFeatures={','.join(features)}", f"ActiveFeatures={','.join(active)}"]
        if weight is not None:
            args.append(f"Weight={weight}")
        self.run("scontrol", args)

    def jobs(self) -> list[JobInfo]:
        """Every job slurmctld still remembers: `squeue --json` (22.05), `scontrol -d --json show job` (23.02+).

        A record equal to the one the previous listing gave for its job id keeps that
        listing's JobInfo (frozen, and `job_from_json` is a function of the record alone):
        converting 10,000 jobs cost 0.25-0.33 s a controller tick, comparing the records
        0.02-0.08 s (0.7-2.7 KB a record); a running job's 22.05 record stays equal while it runs. The kept record is the
        older one, so the new copy is freed at once and only changed records outlive the call
        (fewer objects for the garbage collector to scan). Only the last listing is kept.
        """
        previous, listed = self._listed, {}
        jobs = []
        for entry in self._job_records(None):
            key = slurmjson.number(entry.get("job_id"))
            known = previous.get(key)
            if known is None or known[0] != entry:
                known = (entry, job_from_json(entry))
            listed[key] = known
            jobs.append(known[1])
        self._listed = listed
        return jobs

    def job(self, job_id: str) -> JobInfo | None:
        """One job, or None once slurmctld has forgotten it.

        On 22.05 this reads every job (its `squeue --json` ignores `-j`); to re-check a
        job's state right before acting use the cheaper `job_state`.
        """
        wanted = str(job_id)
        # Pick the entry by its id before converting: on 22.05 the listing holds every job, and
        # converting 10,000 of them for one re-check cost ~0.4 s (a reclaim tick re-checks each action).
        entry = next((e for e in self._job_records(wanted) if str(slurmjson.number(e.get("job_id"))) == wanted), None)
        return job_from_json(entry) if entry is not None else None

    def job_read_lists_all(self) -> bool:
        """True when `job()` reads a listing of every job (22.05: its `squeue --json` ignores `-j`)."""
        return not self._json_scontrol()

    def job_state(self, job_id: str) -> str | None:
        """`squeue -h -t all -j ID -o %A|%T`: the job's state word, None once it is forgotten.

        One single-job RPC on every version. Only the job id and state are printed, no user
        text, so the line cannot be forged; the id must match.
        """
        result = self._runner(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%A|%T"], self._timeout_s)
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:
                return None
            raise SlurmCommandError(result.argv, result.returncode, result.stderr)
        states = [state for jid, _, state in (line.partition("|") for line in _lines(result.stdout)) if jid == str(job_id)]
        return states[0] if states else None

    def _job_records(self, job_id: str | None) -> list[JsonObject]:
        if self._json_scontrol():
            argv = ["scontrol", "-d", "--json", "show", "job"] + ([job_id] if job_id else [])
        else:
            argv = ["squeue", "--json"]
        result = self._runner(self._pin_json(argv), self._timeout_s)
        if result.returncode != 0:
            if "No jobs in the system" in result.stdout + result.stderr or "Invalid job id" in result.stderr:
                return []
            raise SlurmCommandError(result.argv, result.returncode, result.stderr)
        return slurmjson.records(slurmjson.load(result.stdout, " ".join(argv)), "jobs", "job list")

    def submit(self, args: Sequence[str], script: str, *, user: str | None = None) -> str:
        """`sbatch --parsable ARGS` with the script on stdin (as `user` via runuser when given)."""
        argv = ["sbatch", "--parsable", *args]
        if user:
            argv = ["runuser", "-u", user, "--", *argv]
        result = self._runner(argv, self._timeout_s, stdin=script)
        if result.returncode != 0:
            raise SlurmCommandError(result.argv, result.returncode, result.stderr)
        return result.stdout.strip().split(";", 1)[0]

    def requeue(self, job_id: str, *, hold: bool = False, incomplete_only: bool = True) -> None:
        """`scontrol requeue[hold] Incomplete ID`.

        Plain `scontrol requeue` also requeues a COMPLETED job (22.05 and 24.11 alike), so
        a job that ended since it was read would run again. With `Incomplete` (both
        versions, scontrol's parse_requeue_flags) slurmctld requeues only a RUNNING or
        SUSPENDED job and otherwise does nothing and exits 0: re-check the state after.
        """
        flags = ["Incomplete"] if incomplete_only else []
        self.run("scontrol", ["requeuehold" if hold else "requeue", *flags, str(job_id)])

    def hold(self, job_id: str) -> None:
        self.run("scontrol", ["hold", str(job_id)])

    def release(self, job_id: str) -> None:
        self.run("scontrol", ["release", str(job_id)])

    def update_job(self, job_id: str, **fields: str) -> None:
        """`scontrol update JobId=ID Key=Value ...`."""
        self.run("scontrol", ["update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items())])

    def cancel(self, job_id: str, *, signal: str | None = None, batch_only: bool = False) -> None:
        """`scancel [--signal=SIG] [--batch] ID`."""
        args = ([f"--signal={signal}"] if signal else []) + (["--batch"] if batch_only else []) + [str(job_id)]
        self.run("scancel", args)

    def notify(self, job_id: str, message: str) -> None:
        """`scontrol notify ID MESSAGE`: written to the job's stderr by srun/sbatch."""
        self.run("scontrol", ["notify", str(job_id), message])

    def job_of_pid(self, pid: int) -> str | None:
        """`scontrol pidinfo PID` -> job id, or None when the pid is not in a Slurm job.

        scontrol says `Failed to locate job for requested pid` for every failure of its slurmd
        lookup; anything else it says on a non-zero exit (a configuration it cannot read,
        `scontrol: error: ...`) is an error, not "no job" (SlurmCommandError), so the caller
        asks again soon instead of keeping the pid jobless.
        """
        result = self._runner(["scontrol", "pidinfo", str(pid)], self._timeout_s)
        match = re.search(r"Slurm JobId=(\d+)|JobId=(\d+)", result.stdout)
        if result.returncode == 0 and match:
            return match.group(1) or match.group(2)
        said = [line for line in _lines(result.stderr + "\n" + result.stdout)
                if line.strip() and not line.startswith("Failed to locate job for requested pid")]
        if result.returncode != 0 and said:
            raise SlurmCommandError(result.argv, result.returncode, "\n".join(said))
        return None

    def reconfigure(self) -> None:
        """`scontrol reconfigure` (forgets features/weights set by `scontrol update`)."""
        self.run("scontrol", ["reconfigure"])

    def show_config(self) -> dict[str, str]:
        """`scontrol show config` as a mapping."""
        config: dict[str, str] = {}
        for line in _lines(self.run("scontrol", ["show", "config"]).stdout):
            key, sep, value = line.partition("=")
            if sep:
                config[key.strip()] = value.strip()
        return config

    def ping(self) -> bool:
        """`scontrol ping`: True when the primary slurmctld answers UP."""
        result = self._runner(["scontrol", "ping"], self._timeout_s)
        return result.returncode == 0 and "UP" in result.stdout

    def describe(self) -> str:
        return f"SlurmCli(timeout={self._timeout_s}s)"


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def quote_argv(argv: Sequence[str]) -> str:
    """Render argv for logs as an admin would retype it."""
    return " ".join(shlex.quote(a) for a in argv)
