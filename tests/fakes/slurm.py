"""One fake Slurm for the unit tests and benchmarks: a Runner that keeps node and job state.

`SlurmCli(runner=FakeSlurm(nodes, jobs))` answers the commands the boundary runs the way Slurm
prints them: on 22.05 (the default) `sinfo --json` and `squeue --json` (openapi v0.0.38 shapes,
which ignore filters); with `version="24.11.5"` `scontrol -d --json show node|job [ID]`
(data_parser v0.0.42 shapes: number objects, state lists, `job_resources/nodes/allocation`).
It also answers `squeue -h -w NODE -t RUNNING -o %A`, `squeue -h -t all -j ID -o %A|%T`,
applies `scontrol update NodeName=...|JobId=...`, `scontrol reconfigure` (which forgets
`update`s of nodes, as Slurm does), requeue/requeuehold/release/notify/scancel (`requeue
Incomplete` only touches a RUNNING job, as slurmctld), fails commands named in `fail`, answers
nothing while `down`, and records every argv in `calls`. A job's JSON record is built in one
place, `FakeJob.record`; tests that need a `JobInfo` pass it through `slurm.job_from_json`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slurm_aigc.slurm import CommandResult, JobInfo, job_from_json

MUTATING = {"requeue", "requeuehold", "update", "release", "hold", "notify"}


def _number(value: int) -> dict[str, Any]:
    """A number as data_parser v0.0.39+ (23.02+) prints it."""
    return {"set": True, "infinite": False, "number": value}


def _plain(value: int) -> int:
    return value


@dataclass
class FakeNode:
    name: str
    gres: str = "gpu:a100:8,shard:a100:640"
    features: list[str] = field(default_factory=list)
    weight: int = 1
    gres_used: str = "gpu:a100:0(IDX:N/A),shard:a100:0(IDX:N/A)"  # Slurm 22.05 `scontrol -d`
    alloc_gpus: int = 0
    state: str = "idle"
    conf_features: list[str] = field(default_factory=list)  # slurm.conf's, restored by `reconfigure`
    conf_weight: int = 1

    def record(self, new: bool) -> dict[str, Any]:
        """`sinfo --json` (22.05) or, `new`, `scontrol --json show node` (24.11) entry."""
        alloc = f"cpu=1,gres/gpu={self.alloc_gpus}" if self.alloc_gpus else None
        feats: Any = list(self.features) if new else ",".join(self.features)
        state: dict[str, Any] = {"state": [self.state.upper()]} if new else {"state": self.state, "state_flags": []}
        return {"name": self.name, "architecture": "x86_64", "cpus": 32, "features": feats,
                "active_features": feats, "gres": self.gres, "gres_used": self.gres_used,
                "weight": self.weight, "partitions": ["gpu"], "tres_used": alloc, **state}


@dataclass
class FakeJob:
    job_id: str
    node: str = "a100-01"  # NodeList while RUNNING
    comment: str = "aigc_class=train"
    state: str = "RUNNING"
    admin_comment: str = "aigc_class=train"  # the hook's stamp (slurm_aigc.tags)
    user: str = "aigc-alice"
    account: str = "aigc"
    qos: str = "normal"
    reason: str = "None"
    description: str = ""  # state_description, as `scontrol requeuehold` sets it
    batch: bool = True
    requeue: bool = True
    restarts: int = 0
    gpus: int = 1
    gpu_type: str = "a100"
    start: str = "2026-01-01T00:00:00"
    priority: int = 100
    shards: int = 0  # > 0: a shard job (`--gres=shard:N`) holding no whole GPU; with gpus=0 too: a CPU job
    gres_detail: str = ""  # the `gres_detail` entry, when not the one `gpus`/`shards` make

    def _tres(self) -> tuple[str, str]:
        """(TresPerNode, AllocTRES) as 22.05 prints them."""
        if self.shards:
            return f"gres:shard:{self.shards}", f"cpu=1,mem=1G,node=1,billing=1,gres/shard={self.shards}"
        if not self.gpus:
            return "", "cpu=1,mem=1G,node=1,billing=1"
        return (f"gres:gpu:{self.gpu_type}:{self.gpus}",
                f"cpu=1,mem=1G,node=1,billing=1,gres/gpu={self.gpus},gres/gpu:{self.gpu_type}={self.gpus}")

    def _detail(self) -> str:
        if self.gres_detail:
            return self.gres_detail
        if self.shards:
            return f"shard:{self.gpu_type}:{self.shards}({self.shards}/{self.shards},0/0,0/0,0/0,0/0,0/0,0/0,0/0)"
        return f"gpu:{self.gpu_type}:{self.gpus}(IDX:0-{self.gpus - 1})"

    def _resources(self, new: bool) -> dict[str, Any]:
        """`job_resources`: per-node lists in v0.0.38's (22.05) or v0.0.41+'s (24.11) shape."""
        if new:
            return {"nodes": {"count": 1, "list": self.node, "allocation": [{"index": 0, "name": self.node}]}}
        return {"nodes": self.node, "allocated_nodes": [{"nodename": self.node, "cpus_used": 0}]}

    def record(self, new: bool = False) -> dict[str, Any]:
        """This job as one entry of `squeue --json` (22.05) or, `new`, `scontrol --json show job` (24.11)."""
        running = self.state == "RUNNING"
        num: Callable[[int], Any] = _number if new else _plain
        tres, alloc = self._tres()
        start = int(datetime.fromisoformat(self.start).timestamp())
        return {
            "job_id": int(self.job_id), "name": "test", "user_name": self.user, "user_id": 1001,
            "priority": num(self.priority), "account": self.account, "qos": self.qos,
            "job_state": [self.state] if new else self.state, "state_reason": self.reason,
            "state_description": self.description, "requeue": self.requeue, "restart_cnt": self.restarts,
            "batch_flag": self.batch, "time_limit": num(120), "submit_time": num(start),
            "start_time": num(start), "end_time": num(start + 7200), "partition": "gpu",
            "nodes": self.node if running else "", "node_count": num(1), "cpus": num(1),
            "tres_alloc_str": alloc if running else "", "comment": self.comment,
            "admin_comment": self.admin_comment, "tres_per_node": tres,
            "gres_detail": [self._detail()] if running and (self.gpus or self.shards or self.gres_detail) else [],
            "job_resources": self._resources(new) if running else {},
        }

    def info(self, **record: Any) -> JobInfo:
        """This job read by the product's JSON converter; `record` overrides `squeue --json` keys."""
        return job_from_json({**self.record(), **record})


class FakeSlurm:
    """The Runner: `SlurmCli(runner=fake)`; `calls` records every argv.

    `jobs` may be a list or, as reclaim's tests write them, a mapping of id to job; either way
    `fake.jobs` maps id to job. `fail` maps the first words of a command to the stderr it fails with.
    """

    def __init__(self, nodes: Iterable[FakeNode] = (), jobs: Iterable[FakeJob] | Mapping[str, FakeJob] = (),
                 version: str = "22.05.8", *, down: bool = False, fail: Mapping[str, str] | None = None,
                 pending_after_polls: int = 0) -> None:
        self.version = version
        self.new = tuple(int(p) for p in version.split(".")[:2]) >= (23, 2)
        self.nodes = {node.name: node for node in nodes}
        for node in self.nodes.values():
            node.conf_features, node.conf_weight = list(node.features), node.weight
        listed = jobs.values() if isinstance(jobs, Mapping) else jobs
        self.jobs: dict[str, FakeJob] = {job.job_id: job for job in listed}
        self.calls: list[list[str]] = []
        self.down = down
        self.fail: dict[str, str] = dict(fail or {})
        self.pending_after_polls = pending_after_polls  # requeue: job reads it stays COMPLETING

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = list(argv)
        self.calls.append(args)
        if self.down:
            return _failed(args, f"{args[0]}: error: Unable to contact slurm controller (connect failure)")
        for prefix, stderr in self.fail.items():
            if " ".join(args).startswith(prefix):
                return _failed(args, stderr)
        rest = [a for a in args[1:] if a not in ("-d", "--json")]
        answer = self._read(args, rest) if args[0] in {"sinfo", "squeue"} or rest[:1] in (["show"], ["--version"]) \
            else self._act(args, rest)
        return answer if answer is not None else _failed(args, f"fake slurm does not know {args}")

    def updates(self) -> list[list[str]]:
        return [call for call in self.calls if "update" in call]

    def mutations(self) -> list[list[str]]:
        return [c for c in self.calls if (c[0] == "scontrol" and c[1] in MUTATING) or c[0] == "scancel"]

    def _read(self, args: list[str], rest: list[str]) -> CommandResult | None:
        if args[0] == "scontrol" and rest == ["--version"]:
            return _ok(args, f"slurm-wlm {self.version}")
        if args == ["sinfo", "--json"] and not self.new:
            return _ok(args, _document("nodes", [n.record(False) for n in self.nodes.values()]))
        if args == ["squeue", "--json"] and not self.new:  # 22.05 ignores `-j` with `--json`
            self._poll_completing()
            return _ok(args, _document("jobs", [j.record(False) for j in self.jobs.values()]))
        if args[0] == "scontrol" and "--json" in args and self.new and rest[:2] == ["show", "node"]:
            names = rest[2].split(",") if len(rest) > 2 else list(self.nodes)
            if any(n not in self.nodes for n in names):
                return _failed(args, f"Node {names[0]} not found")
            return _ok(args, _document("nodes", [self.nodes[n].record(True) for n in names]))
        if args[0] == "scontrol" and "--json" in args and self.new and rest[:2] == ["show", "job"]:
            self._poll_completing()
            wanted = [job for job in self.jobs.values() if len(rest) < 3 or job.job_id == rest[2]]
            return _ok(args, _document("jobs", [j.record(True) for j in wanted]))
        if args[0] == "squeue" and "-j" in rest:  # squeue -h -t all -j ID -o %A|%T
            return self._job_state(args, rest[rest.index("-j") + 1])
        if args[0] == "squeue" and "-w" in rest:  # squeue -h -w NODE -t RUNNING -o %A
            where = rest[rest.index("-w") + 1]
            return _ok(args, "\n".join(j.job_id for j in self.jobs.values() if j.state == "RUNNING" and where in j.node))
        return None

    def _act(self, args: list[str], rest: list[str]) -> CommandResult | None:
        if args[0] == "scancel":
            if not any(a.startswith("--signal") for a in rest):
                self.jobs[rest[-1]].state = "CANCELLED"
            return _ok(args, "")
        if rest[:1] == ["update"]:
            values = dict(pair.split("=", 1) for pair in rest[1:])
            return self._update_node(args, values) if "NodeName" in values else self._update_job(args, values)
        if rest == ["reconfigure"]:
            for node in self.nodes.values():
                node.features, node.weight = list(node.conf_features), node.conf_weight
            return _ok(args, "")
        if rest[:1] in (["requeue"], ["requeuehold"]):
            return self._requeue(args, rest)
        if rest[:1] == ["release"]:
            job = self.jobs[rest[1]]
            job.reason, job.description, job.priority = "None", "", 100
            return _ok(args, "")
        return _ok(args, "") if rest[:1] == ["notify"] else None

    def _job_state(self, args: list[str], job_id: str) -> CommandResult:
        self._poll_completing()
        found = self.jobs.get(job_id)
        if found is None:
            return _failed(args, "slurm_load_jobs error: Invalid job id specified")
        return _ok(args, f"{found.job_id}|{found.state}")

    def _requeue(self, args: list[str], rest: list[str]) -> CommandResult:
        job = self.jobs[rest[-1]]
        if rest[1].lower() == "incomplete" and job.state not in {"RUNNING", "SUSPENDED"}:
            return _ok(args, "")  # slurmctld: nothing to do, and exit 0
        held = rest[0] == "requeuehold"
        job.restarts += 1
        job.state = "COMPLETING" if self.pending_after_polls else "PENDING"
        job.reason = "JobHeldUser" if held else "BeginTime"  # as 22.05.8 and 24.11.5 show a requeuehold
        job.description = "job requeued in held state" if held else ""
        job.priority = 0 if held else job.priority
        return _ok(args, "")

    def _poll_completing(self) -> None:
        """One more look at the jobs: a requeued job leaves COMPLETING after `pending_after_polls`."""
        if self.pending_after_polls:
            self.pending_after_polls -= 1
            if not self.pending_after_polls:
                for job in self.jobs.values():
                    if job.state == "COMPLETING":
                        job.state = "PENDING"

    def _update_node(self, args: list[str], values: dict[str, str]) -> CommandResult:
        node = self.nodes[values["NodeName"]]
        if "AvailableFeatures" in values:
            node.features = [f for f in values["AvailableFeatures"].split(",") if f]
        if "Weight" in values:
            node.weight = int(values["Weight"])
        return _ok(args, "")

    def _update_job(self, args: list[str], values: dict[str, str]) -> CommandResult:
        job = self.jobs[values.pop("JobId")]
        for key, value in values.items():
            if key == "AdminComment":
                job.admin_comment = value
            elif key == "Gres":
                if job.state != "PENDING":
                    return _failed(args, "Job is no longer pending execution")
                job.gpus = int(value.rsplit(":", 1)[1])
            else:
                return _failed(args, f"Update of {key} is not supported")
        return _ok(args, "")


def _document(key: str, entries: list[dict[str, Any]]) -> str:
    return json.dumps({key: entries, "errors": []})


def _ok(args: list[str], out: str) -> CommandResult:
    return CommandResult(tuple(args), 0, out + "\n" if out else "", "")


def _failed(args: list[str], stderr: str) -> CommandResult:
    return CommandResult(tuple(args), 1, "", stderr)
