"""Pure: shard jobs on a GPU that Slurm has also given whole to another job.

Slurm 22.05 (Debian 12's 22.05.8) loses track of a GPU's shard jobs once one of the shard jobs
on it ends: the GPU then looks free to whole-GPU jobs while the other shard jobs still run on
it (one or two left, both measured), and the next `gpu:1` job gets it (docs/hook.md; 24.11
keeps the GPU until its last shard job ends). The jobs then share memory and compute
unknowingly, and the whole-GPU job, promised the entire GPU, runs out of memory when they do
not fit.

Nothing we can do at submit time prevents it, and `scontrol reconfigure` (which rebuilds the
GPU's accounting) also drops every feature and weight the publisher wrote. So the controller
finds the conflict where it shows: in its own job listing (each job's `gres_detail`, read every
tick, no extra RPC), a GPU held whole by one running job and through shards by another.

It acts once the memory of every job on that GPU (their newest samples, summed: the whole-GPU
job and each shard job left) reaches `memory_pct` of the GPU's memory, where the next
allocation on it can fail, and at once when the whole-GPU job asked `share=no` (the hook's
`aigc_share=no` stamp, which its owner cannot rewrite later): that job was promised a GPU of
its own. Acting on every conflict was measured to cost more than it saves: in a backlogged
16-node replay on 22.05 it requeued 17 shard jobs in 300 s (some three times), because in a
busy cluster nearly every shard job whose partner on a GPU ends gets a whole-GPU job beside
it, and most of those pairs fit in memory. The shard job is the one requeued, not the
whole-GPU job: requeuing the newcomer would only free the GPU for the next whole-GPU job to
land on, while requeuing the shard job ends the conflict and leaves Slurm's accounting right
again (checked on 22.05.8).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from slurm_aigc.reclaim.detect import Verdict
from slurm_aigc.slurmrecords import JobInfo
from slurm_aigc.telemetry.gres import job_whole_and_shard_gpus
from slurm_aigc.units import MIB_PER_GIB

GPU_CONFLICT = "gpu_conflict"


@dataclass(frozen=True)
class Conflict:
    """Shard job `job_id` holds GPU `index` of `node`, which job `other` holds whole."""

    job_id: str
    node: str
    index: int
    other: str


def find_conflicts(jobs: Sequence[JobInfo], judged: Collection[str]) -> list[Conflict]:
    """One conflict per running job of `judged` holding shards of a GPU another running job holds whole."""
    running = [job for job in jobs if job.state == "RUNNING"]
    held = {job.job_id: job_whole_and_shard_gpus(job) for job in running}
    whole_by = {(node, index): job_id for job_id, nodes in held.items() for node, whole, _shards in nodes
                for index in whole}
    found = []
    for job_id in sorted(held.keys() & set(judged)) if whole_by else ():
        clashes = sorted((node, index, other) for node, _whole, shards in held[job_id] for index in shards
                         if (other := whole_by.get((node, index))) is not None and other != job_id)
        if clashes:
            found.append(Conflict(job_id, *clashes[0]))
    return found


def gpu_holders(jobs: Sequence[JobInfo], gpus: Collection[tuple[str, int]]) -> dict[tuple[str, int], frozenset[str]]:
    """Every running job holding each (node, index) of `gpus`, whole or through shards."""
    found: dict[tuple[str, int], set[str]] = {gpu: set() for gpu in gpus}
    for job in jobs:
        if job.state != "RUNNING":
            continue
        for node, whole, shards in job_whole_and_shard_gpus(job):
            for index in whole | shards:
                if (node, index) in found:
                    found[(node, index)].add(job.job_id)
    return {gpu: frozenset(ids) for gpu, ids in found.items()}


def gpu_memory_mib(conflict: Conflict, holders: Collection[str],
                   newest: Mapping[tuple[str, str, int], float | None]) -> float | None:
    """The memory all `holders` of the conflict's GPU use there (their newest samples, keyed by
    (job, node, index)); None when one of them has none."""
    total = 0.0
    for job_id in holders:
        reading = newest.get((job_id, conflict.node, conflict.index))
        if reading is None:
            return None
        total += reading
    return total if holders else None


def judge_conflict(conflict: Conflict, job_class: str, memory_mib: float | None, gpu_mib: float, memory_pct: float,
                   now_ts: float, other_share_no: bool = False) -> Verdict | None:
    """`gpu_conflict` once the memory of the jobs on the GPU (`gpu_memory_mib`) reaches
    `memory_pct` % of `gpu_mib`, or at once when the whole-GPU job asked `share=no`
    (`other_share_no`, from its stamp).

    `memory_mib` is None when a job on it has no fresh sample on that GPU: unknown never acts,
    unless `memory_pct` is 0 (act on every conflict) or the other job asked `share=no`.
    """
    limit_mib = memory_pct / 100.0 * gpu_mib
    full = memory_pct <= 0 or (memory_mib is not None and gpu_mib > 0 and memory_mib >= limit_mib)
    if not (full or other_share_no):
        return None
    used = "" if memory_mib is None or gpu_mib <= 0 else (
        f", and the jobs on it use {memory_mib / MIB_PER_GIB:.1f} of its {gpu_mib / MIB_PER_GIB:.0f} GiB")
    why = "the next allocation on it can fail" if full else f"job {conflict.other} asked share=no"
    reason = (f"Slurm gave GPU {conflict.index} of {conflict.node}, which this job holds through shards, whole to "
              f"job {conflict.other} as well (a Slurm 22.05 defect, docs/hook.md){used}: {why}")
    return Verdict(conflict.job_id, job_class, GPU_CONFLICT, reason, now_ts, 0.0, now_ts, 1, None, ())
