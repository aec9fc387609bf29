"""Pure readings of a Slurm job (`JobInfo`) that reclaim needs: GPU counts, shrink updates, facts.

Compatibility: Slurm 22.05 prints `TresPerNode=gres:gpu:a100:4`, 23.02+ `gres/gpu:a100:4`;
both are read. `AllocTRES=...,gres/gpu=4,...` is the count of a running job.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache

from ClusterShell.NodeSet import NodeSet

from slurm_aigc.reclaim.config import UNCLASSIFIED
from slurm_aigc.reclaim.ladder import JobFacts, job_class_of, opted_out
from slurm_aigc.slurmrecords import JobInfo
from slurm_aigc.tags import trusted_tags
from slurm_aigc.units import MIB_PER_GIB

_ALLOC_GPU_RE = re.compile(r"(?:^|,)gres/gpu=(\d+)")
_ALLOC_SHARD_RE = re.compile(r"(?:^|,)gres/shard=(\d+)")
# gres:gpu:4, gres/gpu:a100:4, gpu:a100:4 (with an optional (S:0-1) socket suffix)
_SPEC_GPU_RE = re.compile(r"(?P<head>(?:gres[:/])?gpu(?::(?P<type>[A-Za-z0-9_.-]+))?):(?P<count>\d+)(?P<tail>\([^)]*\))?")


def gpu_count(job: JobInfo) -> int:
    """GPUs allocated to the job (whole GPUs; shards do not count)."""
    allocated = _tres_count(_ALLOC_GPU_RE, job.alloc_tres)
    if allocated is not None:
        return allocated
    spec = _spec_count(job.tres_per_node)
    if spec is not None:
        return spec * max(job.num_nodes, 1)
    return _spec_count(job.fields.get("TresPerJob", "") or "") or 0


def uses_shards(job: JobInfo) -> bool:
    """The job holds GPU shards: its GPUs are shared with other jobs."""
    return _tres_count(_ALLOC_SHARD_RE, job.alloc_tres) is not None or "shard" in job.tres_per_node


# Most jobs share a few TRES strings: a tick reads them 3-4 times per job (filter, shard maps,
# memory guard), ~0.05 s over 10,000 jobs when each was searched every time.
@lru_cache(maxsize=4096)
def _tres_count(pattern: re.Pattern[str], text: str) -> int | None:
    """The count `pattern` (one group) finds in `text`, None when it finds none."""
    match = pattern.search(text)
    return int(match.group(1)) if match else None


@lru_cache(maxsize=4096)
def _spec_count(text: str) -> int | None:
    """The count of the first GPU request in `text` (`gres:gpu:a100:4` -> 4), None when none."""
    match = _SPEC_GPU_RE.search(text)
    return int(match.group("count")) if match else None


def is_gpu_job(job: JobInfo) -> bool:
    return gpu_count(job) > 0 or uses_shards(job)


def gpu_type(job: JobInfo) -> str | None:
    """The GPU type the job asked for (`a100` of `gres:gpu:a100:4`), None when untyped."""
    for text in (job.tres_per_node, job.fields.get("TresPerJob", "") or ""):
        match = _SPEC_GPU_RE.search(text)
        if match:
            return match.group("type")
    return None


def shrink_updates(job: JobInfo, gpus: int) -> list[dict[str, str]]:
    """Candidate `scontrol update JobId=.. FIELD=..` settings that lower the GPU count to `gpus`.

    The GPU type stays as it was (Slurm cannot switch the type of a held job anyway).
    Slurm 22.05 takes `Gres=gpu:TYPE:N` for a per-node request; newer ones also take
    `TresPerNode=gres/gpu:TYPE:N`. The actuator tries them in order. Empty when the job's
    request is not a single-node GPU count we can rewrite.
    """
    if job.num_nodes != 1 or gpus < 1:
        return []
    kind = gpu_type(job)
    name = f"gpu:{kind}:{gpus}" if kind else f"gpu:{gpus}"
    if _SPEC_GPU_RE.search(job.tres_per_node):
        return [{"Gres": name}, {"TresPerNode": f"gres/{name}"}]
    if _SPEC_GPU_RE.search(job.fields.get("TresPerJob", "") or ""):
        return [{"TresPerJob": f"gres/{name}"}, {"TresPerJob": f"gres:{name}"}]
    return []


def requested_gpus(job: JobInfo) -> int | None:
    """The GPU count the job's request asks for now (TresPerNode x nodes, or TresPerJob)."""
    spec = _SPEC_GPU_RE.search(job.tres_per_node)
    if spec:
        return int(spec.group("count")) * max(job.num_nodes, 1)
    per_job = _SPEC_GPU_RE.search(job.fields.get("TresPerJob", "") or "")
    return int(per_job.group("count")) if per_job else None


def is_held(job: JobInfo) -> bool:
    """Pending with a hold: it will not start until released.

    Slurm 22.05 says `Reason=job_requeued_in_held_state` after `scontrol requeuehold`,
    `JobHeldAdmin`/`JobHeldUser` after `scontrol hold`; a held job has `Priority=0`.
    """
    return job.state == "PENDING" and ("held" in job.reason.lower() or job.fields.get("Priority") == "0")


def requeue_held(job: JobInfo) -> bool:
    """Held the way `scontrol requeuehold` holds a job, and by nothing since.

    slurmctld (job_mgr.c, JOB_REQUEUE_HOLD) sets the description `job requeued in held state`
    (`job_requeued_in_held_state` in some listings) with reason JobHeldUser. Measured on
    22.05.8: an administrator's `scontrol hold` afterwards keeps that description and turns the
    reason to JobHeldAdmin, so that is someone else's hold on top of ours, and so is any hold
    without the description (a user's `scontrol hold`, `launch failed requeued held`).
    """
    if not is_held(job):
        return False
    described = job.reason.replace("_", " ").lower() == "job requeued in held state"
    return described and job.fields.get("StateReason") != "JobHeldAdmin"


def declared_signal(job: JobInfo) -> str:
    """The signal the job declared it handles, `B:USR1` (batch shell) or `USR1` (steps); "" when none.

    Slurm 22.05 shows a job's `--signal` neither in `scontrol show job` nor in `squeue --json`
    (checked on 22.05.8), nor to job_submit/lua (docs/slurm-boundary.md), so the user declares
    it with the tag `aigc:signal=USR1` (steps) or `aigc:signal=B.USR1` (batch shell) and the hook
    stamps it into the AdminComment, which job owners cannot write: `aigc_signal=B.USR1`. Only
    that leading stamp is read (`trusted_tags`); an admin's stamp may also give a number (`10`).
    """
    return _declared_signal(job.admin_comment)


@lru_cache(maxsize=4096)  # most jobs share a few stamps; 3 stamp reads a job were 0.1 s a tick
def _declared_signal(admin_comment: str) -> str:
    value = trusted_tags(admin_comment).get("signal", "")
    batch, _, sig = value.rpartition(".")
    name = _signal_name(sig)
    if not name or batch not in ("", "B"):
        return ""
    return f"B:{name}" if batch else name


def _signal_name(text: str) -> str:
    """`USR1`, `SIGUSR1`, `10` -> `USR1`; "" for an unknown number."""
    if text.isdigit():
        try:
            return signal.Signals(int(text)).name.removeprefix("SIG")
        except ValueError:
            return ""
    return text.upper().removeprefix("SIG")


def start_ts(job: JobInfo) -> float | None:
    return _epoch(job.start_time)


def limit_end_ts(job: JobInfo) -> float | None:
    """When the job's time limit runs out (epoch s), None when unlimited or unknown."""
    started = start_ts(job)
    if started is None or job.time_limit_s is None:
        return None
    return started + job.time_limit_s


def shard_gpus(job: JobInfo, shards_per_gpu_by_node: Mapping[str, int]) -> float:
    """The job's shards as GPU fractions (`gres/shard=20` on an 80-shard a100 node -> 0.25)."""
    match = _ALLOC_SHARD_RE.search(job.alloc_tres)
    if not match or not job.node_list:
        return 0.0
    per_gpu = shards_per_gpu_by_node.get(first_node(job.node_list))
    return int(match.group(1)) / per_gpu if per_gpu else 0.0


def shard_count(job: JobInfo) -> int:
    """Shards allocated to the job over all its nodes (`AllocTRES=...,gres/shard=20`); 0 when none."""
    return _tres_count(_ALLOC_SHARD_RE, job.alloc_tres) or 0


def shard_memory_limit_mib(job: JobInfo, gib_per_shard_by_node: Mapping[str, float]) -> float:
    """The GPU memory a shard job may use per node: its shards there x GiB per shard (0: no limit known).

    Shards are GiB of one GPU (docs/policy.md: `shards_per_gpu` = GiB per GPU in the shipped
    inventory); a multi-node request (`--gres=shard:N` per node) holds N on each node.
    """
    shards = shard_count(job)
    if not shards or not job.node_list:
        return 0.0
    per_shard = gib_per_shard_by_node.get(first_node(job.node_list), 0.0)
    return shards / max(job.num_nodes, 1) * per_shard * MIB_PER_GIB


def node_names(node_list: str) -> list[str]:
    """`a100-[01-02],t4-01` -> every name; a plain name is taken as is (NodeSet costs ~40 us a job,
    0.3 s a tick over 10,000 jobs)."""
    if not node_list:
        return []
    if _is_plain_name(node_list):
        return [node_list]
    return [str(name) for name in NodeSet(node_list)]


def first_node(node_list: str) -> str:
    """The first name of a Slurm node list (`a100-[01-02]` -> `a100-01`); "" when empty."""
    if _is_plain_name(node_list):
        return node_list
    return str(next(iter(NodeSet(node_list))))


def _is_plain_name(node_list: str) -> bool:
    # Slurm node lists fold ranges in [..] and join names with commas; nothing else needs NodeSet.
    return "[" not in node_list and "," not in node_list


def job_facts(job: JobInfo, shards_per_gpu_by_node: Mapping[str, int] | None = None) -> JobFacts:
    """Planning's view of a running job: a function of the job and its node's shards per GPU alone."""
    gpus = gpu_count(job)
    return JobFacts(
        job_id=job.job_id,
        user=job.user,
        account=job.account,
        qos=job.qos,
        job_class=_job_class(job.admin_comment),  # the hook's stamp, not user text
        batch=job.batch_flag,
        requeue_allowed=job.requeue,
        restarts=job.restarts,
        num_nodes=job.num_nodes,
        gpus=gpus,
        opt_out=_opted_out(job.admin_comment),
        limit_end_ts=limit_end_ts(job),
        shrinkable=bool(shrink_updates(job, 1)),
        shard_gpus=shard_gpus(job, shards_per_gpu_by_node or {}),
        declared_signal=declared_signal(job),
    )


@lru_cache(maxsize=4096)
def _job_class(admin_comment: str) -> str:
    return job_class_of(admin_comment, UNCLASSIFIED)


@lru_cache(maxsize=4096)
def _opted_out(admin_comment: str) -> bool:
    return opted_out(admin_comment)


def _epoch(value: datetime | None) -> float | None:
    # Slurm prints local time without a zone; naive datetimes are local, as .timestamp() assumes.
    return None if value is None else value.timestamp()
