"""A fake Slurm for the agent and publisher tests: a Runner that keeps node state.

It answers the commands `SlurmCli` and the publisher run the way Slurm prints them:
on 22.05 (the default) `sinfo --json` and `squeue --json` (openapi v0.0.38 shapes, which
ignore filters), with `version="24.11.5"` `scontrol -d --json show node|job [ID]`
(data_parser v0.0.42 shapes: number objects, state lists, `job_resources/nodes/allocation`);
also `scontrol update NodeName=...` and `scontrol reconfigure`, forgetting `scontrol update`
changes on `reconfigure` as Slurm does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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

    def record(self, new: bool) -> dict[str, Any]:
        """`sinfo --json` (22.05) or, `new`, `scontrol --json show node` (24.11) entry."""
        alloc = f"cpu=1,gres/gpu={self.alloc_gpus}" if self.alloc_gpus else None
        feats: Any = list(self.features) if new else ",".join(self.features)
        state: dict[str, Any] = {"state": ["IDLE"]} if new else {"state": "idle", "state_flags": []}
        return {"name": self.name, "architecture": "x86_64", "cpus": 32, "features": feats,
                "active_features": feats, "gres": self.gres, "gres_used": self.gres_used,
                "weight": self.weight, "partitions": ["gpu"], "tres_used": alloc, **state}


@dataclass
class FakeJob:
    job_id: str
    node_list: str
    comment: str = ""
    state: str = "RUNNING"
    detail: str = ""  # e.g. "Nodes=a100-01 CPU_IDs=0 Mem=0 GRES=gpu:a100:2(IDX:0-1)"
    admin_comment: str = ""  # the hook's stamp, e.g. "aigc_class=train"

    def record(self, new: bool) -> dict[str, Any]:
        """`squeue --json` (22.05) or, `new`, `scontrol --json show job` (24.11) entry."""
        pairs = _DETAIL_RE.findall(self.detail)  # (node, gres) written by the test, not by a user
        nodes = [{"nodename": node, "cpus_used": 0} for node, _ in pairs]
        resources = {"nodes": {"count": len(pairs), "list": self.node_list, "allocation": [
            {"index": i, "name": node["nodename"]} for i, node in enumerate(nodes)]}} if new else {
            "nodes": self.node_list, "allocated_nodes": nodes}
        return {"job_id": int(self.job_id), "name": "j", "user_name": "alice", "account": "aigc", "qos": "normal",
                "job_state": [self.state] if new else self.state, "state_reason": "None", "partition": "gpu",
                "nodes": self.node_list, "batch_flag": True, "comment": self.comment,
                "admin_comment": self.admin_comment, "node_count": _number(1) if new else 1,
                "gres_detail": [gres for _, gres in pairs], "job_resources": resources}


# `Nodes=a100-01 CPU_IDs=0 Mem=0 GRES=gpu:a100:2(IDX:0-1)` as tests write FakeJob.detail
_DETAIL_RE = re.compile(r"Nodes=(\S+) CPU_IDs=\S* Mem=\S* GRES=(\S*)")


def _number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


class FakeSlurm:
    """The Runner: `SlurmCli(runner=fake)`; `calls` records every argv."""

    def __init__(self, nodes: Sequence[FakeNode], jobs: Sequence[FakeJob] = (), version: str = "22.05.8") -> None:
        self.version = version
        self.new = tuple(int(p) for p in version.split(".")[:2]) >= (23, 2)
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
        rest = [a for a in args[1:] if a not in ("-d", "--json")]
        if args[0] == "scontrol" and rest == ["--version"]:
            return self._ok(args, f"slurm-wlm {self.version}")
        if args == ["sinfo", "--json"] and not self.new:
            return self._ok(args, json.dumps({"nodes": [n.record(False) for n in self.nodes.values()], "errors": []}))
        if args == ["squeue", "--json"] and not self.new:
            return self._ok(args, json.dumps({"jobs": [j.record(False) for j in self.jobs], "errors": []}))
        if args[0] == "scontrol" and "--json" in args and rest[:2] == ["show", "node"] and self.new:
            names = rest[2].split(",") if len(rest) > 2 else list(self.nodes)
            if any(n not in self.nodes for n in names):
                return CommandResult(tuple(args), 1, "", f"Node {names[0]} not found")
            return self._ok(args, json.dumps({"nodes": [self.nodes[n].record(True) for n in names], "errors": []}))
        if args[0] == "scontrol" and "--json" in args and rest[:2] == ["show", "job"] and self.new:
            wanted = [job for job in self.jobs if len(rest) < 3 or job.job_id == rest[2]]
            return self._ok(args, json.dumps({"jobs": [j.record(True) for j in wanted], "errors": []}))
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
