"""A fake Slurm command runner for reclaim's unit tests (no Slurm needed).

It answers the handful of commands `SlurmCli` runs for reclaim with `scontrol show job -o`
lines in Slurm 22.05's format, applies requeue/hold/update/release to its jobs, and
records every argv so tests can assert what was (and was not) run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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

    def line(self) -> str:
        tres = f"gres:gpu:{self.gpu_type}:{self.gpus}"
        alloc = f"cpu=1,mem=1G,node=1,billing=1,gres/gpu={self.gpus},gres/gpu:{self.gpu_type}={self.gpus}"
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


@dataclass
class FakeSlurm:
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)
    down: bool = False
    fail: dict[str, str] = field(default_factory=dict)  # first word(s) of a command -> stderr to fail with
    pending_after_polls: int = 0  # requeuehold: how many `show job` polls the job stays COMPLETING

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
        if tool == "scontrol" and rest[:3] == ["show", "job", "-o"]:
            return self._show(rest[3:])
        if tool == "scontrol" and rest[0] in {"requeue", "requeuehold"}:
            job = self.jobs[rest[1]]
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

    def _show(self, ids: list[str]) -> CommandResult:
        if self.pending_after_polls:
            self.pending_after_polls -= 1
            if not self.pending_after_polls:
                for job in self.jobs.values():
                    if job.state == "COMPLETING":
                        job.state = "PENDING"
        if ids:
            found = self.jobs.get(ids[0])
            if found is None:
                return CommandResult(("scontrol",), 1, "", "slurm_load_jobs error: Invalid job id specified")
            return CommandResult(("scontrol",), 0, found.line() + "\n", "")
        if not self.jobs:
            return CommandResult(("scontrol",), 0, "No jobs in the system\n", "")
        return CommandResult(("scontrol",), 0, "".join(j.line() + "\n" for j in self.jobs.values()), "")

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
