"""Pure: shard jobs on a GPU that Slurm has also given whole to another job.

Slurm 22.05 (Debian 12's 22.05.8) loses track of a GPU's shard jobs once one of two shard jobs
on it ends: the GPU then looks free to whole-GPU jobs while the other shard job still runs
on it, and the next `gpu:1` job gets it (docs/hook.md; 24.11 keeps the GPU until its last
shard job ends). The two jobs then share memory and compute unknowingly, and the whole-GPU
job, promised the entire GPU, runs out of memory when they do not fit.

Nothing we can do at submit time prevents it, and `scontrol reconfigure` (which rebuilds the
GPU's accounting) also drops every feature and weight the publisher wrote. So the controller
ends the conflict where it shows: in its own job listing (each job's `gres_detail`, read every
tick, no extra RPC), a GPU held whole by one running job and through shards by another. The
shard jobs on it get the `gpu_conflict` verdict (default ladder: requeue), not the whole-GPU
job: requeuing the newcomer would only free the GPU for the next whole-GPU job to land on,
each one requeued in turn until the shard job ended, while requeuing the shard job ends the
conflict at once and leaves Slurm's accounting right again (checked on 22.05.8). The shard
job restarts on another GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurm_aigc.reclaim.detect import JobMeta, Verdict
from slurm_aigc.slurmrecords import JobInfo
from slurm_aigc.telemetry.gres import job_whole_and_shard_gpus

GPU_CONFLICT = "gpu_conflict"


def judge_conflicts(jobs: Sequence[JobInfo], metas: Mapping[str, JobMeta], now_ts: float) -> dict[str, Verdict]:
    """`gpu_conflict` for each running job in `metas` holding shards of a GPU another running job holds whole."""
    running = [job for job in jobs if job.state == "RUNNING"]
    held = {job.job_id: job_whole_and_shard_gpus(job) for job in running}
    whole_by: dict[tuple[str, int], str] = {}
    for job_id, nodes in held.items():
        for node, (whole, _shards) in nodes.items():
            for index in whole:
                whole_by.setdefault((node, index), job_id)
    if not whole_by:
        return {}
    found: dict[str, Verdict] = {}
    for job in running:
        meta = metas.get(job.job_id)
        if meta is None:
            continue
        clashes = sorted((node, index, other) for node, (_whole, shards) in held[job.job_id].items() for index in shards
                         if (other := whole_by.get((node, index))) is not None and other != job.job_id)
        if clashes:
            node, index, other = clashes[0]
            reason = (f"Slurm gave GPU {index} of {node}, which this job holds through shards, whole to job {other} "
                      f"as well (a Slurm 22.05 defect, docs/hook.md): while both run, neither has the GPU memory "
                      f"it was promised")
            gpus = sum(len(shards) for _whole, shards in held[job.job_id].values())
            found[job.job_id] = Verdict(job.job_id, meta.job_class, GPU_CONFLICT, reason, now_ts, 0.0, now_ts,
                                        gpus, None, ())
    return found
