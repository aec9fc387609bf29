"""What Slurm says about a job or a node, as typed records (shared, no I/O).

`slurm_aigc.slurm` (the boundary) fills them from Slurm's JSON; pure policy (reclaim's job
facts, GRES indices, the publisher's planner) reads them without importing the boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class NodeInfo:
    """One node as `scontrol show node` reports it (read from `sinfo`/`scontrol --json`).

    `fields` holds a few values under scontrol's key names (`AllocTRES`) for callers
    written against `scontrol show node -o`.
    """

    name: str
    state: str
    gres: str
    gres_used: str
    available_features: tuple[str, ...]
    active_features: tuple[str, ...]
    weight: int
    cpus: int
    partitions: tuple[str, ...]
    fields: Mapping[str, str]


@dataclass(frozen=True)
class JobInfo:
    """One job as `scontrol show job` reports it (read from `squeue`/`scontrol --json`).

    `fields` holds a few more values under scontrol's key names (`TresPerJob`, `Priority`,
    `Prefer`; empty ones left out) for callers written against `scontrol show job -o`.
    `gres_detail` is (node, `gpu:a100:2(IDX:0-1)`) per allocated node, as `scontrol -d`
    prints `GRES=` (24.11 prints a shard job's as used/total per GPU, `shard:8(8/16,0/16)`).
    """

    job_id: str
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    reason: str
    node_list: str
    batch_flag: bool
    requeue: bool
    restarts: int
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    time_limit_s: int | None
    comment: str
    admin_comment: str
    tres_per_node: str
    alloc_tres: str
    num_nodes: int
    features: str
    fields: Mapping[str, str]
    gres_detail: tuple[tuple[str, str], ...] = ()
    work_dir: str = ""
