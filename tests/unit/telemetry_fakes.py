"""A fake Slurm for the agent and publisher tests: a Runner that keeps node state.

It answers the commands `SlurmCli` and the publisher run (`scontrol [-d] show node -o`,
`scontrol show job -o`, `scontrol -d show job -o`, `scontrol update NodeName=...`,
`scontrol reconfigure`) the way Slurm 22.05 prints them, and forgets `scontrol update`
changes on `reconfigure` as Slurm does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from slurm_aigc.slurm import CommandResult


@dataclass
class FakeNode:
    name: str
    gres: str = "gpu:a100:8,shard:a100:640"
    features: list[str] = field(default_factory=list)
    weight: int = 1
    gres_used: str = "gpu:a100:0(IDX:N/A),shard:a100:0(IDX:N/A)"  # Slurm 22.05 `scontrol -d`
    alloc_gpus: int = 0
    conf_features: list[str] = field(default_factory=list)
    conf_weight: int = 1

    def line(self, detail: bool) -> str:
        feats = ",".join(self.features) or "(null)"
        used = f" GresUsed={self.gres_used}" if detail else ""
        alloc = f"cpu=1,gres/gpu={self.alloc_gpus}" if self.alloc_gpus else ""
        return (
            f"NodeName={self.name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUTot=32 "
            f"AvailableFeatures={feats} ActiveFeatures={feats} Gres={self.gres}{used} NodeAddr=127.0.0.1 "
            f"State=IDLE Weight={self.weight} Owner=N/A Partitions=gpu AllocTRES={alloc} CapWatts=n/a"
        )


@dataclass
class FakeJob:
    job_id: str
    node_list: str
    comment: str = ""
    state: str = "RUNNING"
    detail: str = ""  # e.g. "Nodes=a100-01 CPU_IDs=0 Mem=0 GRES=gpu:a100:2(IDX:0-1)"
    admin_comment: str = ""  # the hook's stamp, e.g. "aigc_class=train"

    def line(self, detail: bool) -> str:
        comment = self.comment or "(null)"
        extra = f" {self.detail}" if detail and self.detail else ""
        return (
            f"JobId={self.job_id} JobName=j UserId=alice(1000) GroupId=alice(1000) Account=aigc QOS=normal "
            f"JobState={self.state} Reason=None Partition=gpu NodeList={self.node_list} BatchFlag=1 "
            f"AdminComment={self.admin_comment or '(null)'} Comment={comment}{extra} NumNodes=1"
        )


class FakeSlurm:
    """The Runner: `SlurmCli(runner=fake)`; `calls` records every argv."""

    def __init__(self, nodes: Sequence[FakeNode], jobs: Sequence[FakeJob] = ()) -> None:
        self.nodes = {node.name: node for node in nodes}
        for node in nodes:
            node.conf_features = list(node.features)
            node.conf_weight = node.weight
        self.jobs = list(jobs)
        self.calls: list[list[str]] = []
        self.down = False

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = list(argv)
        self.calls.append(args)
        if self.down:
            return CommandResult(tuple(args), 1, "", "slurm_load_node error: Unable to contact slurm controller")
        detail = "-d" in args
        rest = [a for a in args[1:] if a != "-d"]
        if rest[:2] == ["show", "node"]:
            names = rest[3].split(",") if len(rest) > 3 else list(self.nodes)
            if any(n not in self.nodes for n in names):
                return CommandResult(tuple(args), 1, "", f"Node {names[0]} not found")
            return self._ok(args, "\n".join(self.nodes[n].line(detail) for n in names))
        if rest[:2] == ["show", "job"]:
            wanted = [job for job in self.jobs if len(rest) < 4 or job.job_id == rest[3]]
            return self._ok(args, "\n".join(job.line(detail) for job in wanted))
        if args[0] == "squeue":  # squeue -h -w NODE -t RUNNING -o %A
            where = args[args.index("-w") + 1]
            return self._ok(args, "\n".join(j.job_id for j in self.jobs if j.state == "RUNNING" and where in j.node_list))
        if rest[:1] == ["update"]:
            return self._update(args, rest[1:])
        if rest == ["reconfigure"]:
            for node in self.nodes.values():
                node.features = list(node.conf_features)
                node.weight = node.conf_weight
            return self._ok(args, "")
        return CommandResult(tuple(args), 1, "", f"fake slurm: unexpected {args}")

    def updates(self) -> list[list[str]]:
        return [call for call in self.calls if "update" in call]

    def _update(self, args: list[str], pairs: list[str]) -> CommandResult:
        values = dict(pair.split("=", 1) for pair in pairs)
        node = self.nodes[values["NodeName"]]
        if "AvailableFeatures" in values:
            node.features = [f for f in values["AvailableFeatures"].split(",") if f]
        if "Weight" in values:
            node.weight = int(values["Weight"])
        return self._ok(args, "")

    @staticmethod
    def _ok(args: list[str], out: str) -> CommandResult:
        return CommandResult(tuple(args), 0, out + "\n" if out else "", "")
