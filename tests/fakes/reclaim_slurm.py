"""A fake Slurm command runner for reclaim's unit tests (no Slurm needed).

It answers the handful of commands `SlurmCli` runs for reclaim as Slurm 22.05 does
(`scontrol --version`, `squeue --json` in openapi v0.0.38's shape, `squeue -h -t all -j ID
-o %A|%T`), applies requeue/hold/update/release to its jobs (`requeue Incomplete` only
touches a RUNNING job, as slurmctld), and records every argv so tests can assert what
was (and was not) run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slurm_aigc.slurm import CommandResult

MUTATING = {"requeue", "requeuehold", "update", "release", "hold", "notify"}


@dataclass
class FakeJob:
    job_id: str
    user: str = "aigc-alice"
    account: str = "aigc"
    qos: str = "normal"
    state: str = "RUNNING"
    reason: str = "None"
    batch: bool = True
    requeue: bool = True
    restarts: int = 0
    comment: str = "aigc_class=train"
    admin_comment: str = "aigc_class=train"  # the hook's stamp (slurm_aigc.tags)
    gpus: int = 1
    gpu_type: str = "a100"
    node: str = "a100-01"
    start: str = "2026-01-01T00:00:00"
    priority: int = 100
    shards: int = 0  # > 0: a shard job (`--gres=shard:N`) holding no whole GPU

    def _tres(self) -> tuple[str, str]:
        """(TresPerNode, AllocTRES) as 22.05 prints them."""
        if self.shards:
            return f"gres:shard:{self.shards}", f"cpu=1,mem=1G,node=1,billing=1,gres/shard={self.shards}"
        return (f"gres:gpu:{self.gpu_type}:{self.gpus}",
                f"cpu=1,mem=1G,node=1,billing=1,gres/gpu={self.gpus},gres/gpu:{self.gpu_type}={self.gpus}")

    def _gres_detail(self) -> str:
        if self.shards:
            return f"shard:{self.gpu_type}:{self.shards}({self.shards}/{self.shards},0/0,0/0,0/0,0/0,0/0,0/0,0/0)"
        return f"gpu:{self.gpu_type}:{self.gpus}(IDX:0-{self.gpus - 1})"

    def line(self) -> str:
        """`scontrol show job -o` text, for pure tests that build a JobInfo with `job_from_fields`."""
        tres, alloc = self._tres()
        parts = [
            f"JobId={self.job_id}", "JobName=test", f"UserId={self.user}(1001)", "GroupId=aigc(1001)",
            f"Priority={self.priority}", f"Account={self.account}", f"QOS={self.qos}", f"JobState={self.state}",
            f"Reason={self.reason}", f"Requeue={int(self.requeue)}", f"Restarts={self.restarts}",
            f"BatchFlag={int(self.batch)}", "RunTime=00:10:00", "TimeLimit=02:00:00", "SubmitTime=2026-01-01T00:00:00",
            f"StartTime={self.start}", "EndTime=2026-01-01T02:00:00", "Partition=gpu",
            f"NodeList={self.node if self.state == 'RUNNING' else '(null)'}", "NumNodes=1", "NumCPUs=1",
            f"AllocTRES={alloc if self.state == 'RUNNING' else '(null)'}", f"Comment={self.comment or '(null)'}",
            f"AdminComment={self.admin_comment or '(null)'}", f"TresPerNode={tres}",
        ]
        return " ".join(parts)

    def record(self) -> dict[str, Any]:
        """This job as one entry of Slurm 22.05's `squeue --json`."""
        running = self.state == "RUNNING"
        tres, alloc = self._tres()
        start = int(datetime.fromisoformat(self.start).timestamp())
        return {
            "job_id": int(self.job_id), "name": "test", "user_name": self.user, "user_id": 1001,
            "priority": self.priority, "account": self.account, "qos": self.qos, "job_state": self.state,
            "state_reason": self.reason, "state_description": "", "requeue": self.requeue,
            "restart_cnt": self.restarts, "batch_flag": self.batch, "time_limit": 120,
            "submit_time": start, "start_time": start, "end_time": start + 7200, "partition": "gpu",
            "nodes": self.node if running else "", "node_count": 1, "cpus": 1,
            "tres_alloc_str": alloc if running else "", "comment": self.comment,
            "admin_comment": self.admin_comment, "tres_per_node": tres,
            "gres_detail": [self._gres_detail()] if running else [],
            "job_resources": {"allocated_nodes": [{"nodename": self.node}]} if running else {},
        }


@dataclass
class FakeSlurm:
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)
    down: bool = False
    fail: dict[str, str] = field(default_factory=dict)  # first word(s) of a command -> stderr to fail with
    pending_after_polls: int = 0  # requeuehold: how many `show job` polls the job stays COMPLETING
    node_gres: dict[str, str] = field(default_factory=dict)  # `sinfo --json` nodes: name -> Gres

    def nodes_record(self) -> dict[str, Any]:
        """Slurm 22.05's `sinfo --json`, as much of it as the controller reads."""
        nodes = [{"name": name, "state": "mixed", "gres": gres, "gres_used": "", "features": "",
                  "active_features": "", "weight": 1, "cpus": 8, "partitions": ["gpu"]}
                 for name, gres in self.node_gres.items()]
        return {"nodes": nodes, "errors": []}

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = list(argv)
        self.calls.append(args)
        if self.down:
            return CommandResult(tuple(args), 1, "", "slurm_load_jobs error: Unable to contact slurm controller")
        for prefix, stderr in self.fail.items():
            if " ".join(args).startswith(prefix):
                return CommandResult(tuple(args), 1, "", stderr)
        return self._answer(args)

    def mutations(self) -> list[list[str]]:
        return [c for c in self.calls if (c[0] == "scontrol" and c[1] in MUTATING) or c[0] == "scancel"]

    def _answer(self, args: list[str]) -> CommandResult:
        tool, rest = args[0], args[1:]
        if tool == "scontrol" and rest == ["--version"]:
            return CommandResult(tuple(args), 0, "slurm-wlm 22.05.8\n", "")
        if args == ["squeue", "--json"]:
            return self._show()
        if args == ["sinfo", "--json"]:
            return CommandResult(tuple(args), 0, json.dumps(self.nodes_record()) + "\n", "")
        if tool == "squeue" and "-j" in rest:  # squeue -h -t all -j ID -o %A|%T
            self._poll_completing()
            found = self.jobs.get(rest[rest.index("-j") + 1])
            if found is None:
                return CommandResult(tuple(args), 1, "", "slurm_load_jobs error: Invalid job id specified")
            return CommandResult(tuple(args), 0, f"{found.job_id}|{found.state}\n", "")
        if tool == "scontrol" and rest[0] in {"requeue", "requeuehold"}:
            job = self.jobs[rest[-1]]
            if rest[1].lower() == "incomplete" and job.state not in {"RUNNING", "SUSPENDED"}:
                return self._ok(args)  # slurmctld: nothing to do, and exit 0
            job.restarts += 1
            job.state = "COMPLETING" if self.pending_after_polls else "PENDING"
            job.reason = "JobHeldAdmin" if rest[0] == "requeuehold" else "BeginTime"
            job.priority = 0 if rest[0] == "requeuehold" else job.priority
            return self._ok(args)
        if tool == "scontrol" and rest[0] == "release":
            job = self.jobs[rest[1]]
            job.reason, job.priority = "None", 100
            return self._ok(args)
        if tool == "scontrol" and rest[0] == "update":
            return self._update(args, rest[1:])
        if tool == "scancel":
            job_id = rest[-1]
            if not any(a.startswith("--signal") for a in rest):
                self.jobs[job_id].state = "CANCELLED"
            return self._ok(args)
        if tool == "scontrol" and rest[0] == "notify":
            return self._ok(args)
        return CommandResult(tuple(args), 1, "", f"fake slurm does not know {args}")

    def _show(self) -> CommandResult:
        """`squeue --json`: every job (22.05 ignores `-j` with `--json`)."""
        self._poll_completing()
        text = json.dumps({"jobs": [job.record() for job in self.jobs.values()], "errors": []})
        return CommandResult(("squeue", "--json"), 0, text + "\n", "")

    def _poll_completing(self) -> None:
        """One more look at the jobs: a requeued job leaves COMPLETING after `pending_after_polls`."""
        if self.pending_after_polls:
            self.pending_after_polls -= 1
            if not self.pending_after_polls:
                for job in self.jobs.values():
                    if job.state == "COMPLETING":
                        job.state = "PENDING"

    def _update(self, args: list[str], fields: list[str]) -> CommandResult:
        values = dict(f.split("=", 1) for f in fields)
        job = self.jobs[values.pop("JobId")]
        for key, value in values.items():
            if key == "AdminComment":
                job.admin_comment = value
            elif key == "Gres":
                if job.state != "PENDING":
                    return CommandResult(tuple(args), 1, "", "Job is no longer pending execution")
                job.gpus = int(value.rsplit(":", 1)[1])
            else:
                return CommandResult(tuple(args), 1, "", f"Update of {key} is not supported")
        return self._ok(args)

    @staticmethod
    def _ok(args: list[str]) -> CommandResult:
        return CommandResult(tuple(args), 0, "", "")
