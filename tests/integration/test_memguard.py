"""The memory guard on the real local cluster: two shard jobs on one simulated GPU, one over its shards.

The hog (`shard:20`, 20 GiB on an 80-shard a100) takes 50 GiB; its neighbour (`shard:20` on
the same GPU) keeps 10 GiB. The agent attributes memory per process, the controller (live,
tiny windows) notifies and then requeues the hog; the neighbour keeps running, untouched.
"""

from __future__ import annotations

import pytest

from tests.conftest import SLURM_AIGC_BIN, ClusterHandle
from tests.integration.helpers import allocated_gpu_indices, submit, wait_job_state
from tests.integration.test_reclaim import POLICY, Reclaim, cancel, finished, reclaim, running

pytestmark = pytest.mark.cluster
__all__ = ["reclaim"]  # the fixture, used by name

MEMGUARD_POLICY = POLICY.replace("  exempt:", "  over_memory_samples: 3\n  exempt:").replace(
    "      over_allocated: [notify, shrink]\n",
    "      over_allocated: [notify, shrink]\n      over_memory: [notify, requeue]\n",
) + "inventory: {gpu_types: {a100: {memory_gib: 80, shards_per_gpu: 80}, t4: {memory_gib: 16, shards_per_gpu: 16}}}\n"
assert "over_memory_samples: 3" in MEMGUARD_POLICY and "over_memory: [notify, requeue]" in MEMGUARD_POLICY


def shard_job(cluster: ClusterHandle, name: str, mem: str, node: str | None = None) -> str:
    script = f"{SLURM_AIGC_BIN} gpu-load --profile busy --util 40 --mem {mem} --seconds 0\n"
    where = [f"--nodelist={node}"] if node else ["--constraint=a100"]
    return submit(cluster, script, f"--job-name=memguard-{name}", "--gres=shard:20", "--requeue", *where, user=None)


def test_the_hog_is_requeued_and_its_neighbour_on_the_same_gpu_keeps_running(reclaim: Reclaim) -> None:
    cluster = reclaim.cluster
    reclaim.policy.write_text(MEMGUARD_POLICY)
    neighbour = shard_job(cluster, "neighbour", "10G")
    jobs = [neighbour]
    try:
        node = running(reclaim, neighbour)
        hog = shard_job(cluster, "hog", "50G", node)
        jobs.append(hog)
        running(reclaim, hog)
        assert allocated_gpu_indices(cluster, hog) == allocated_gpu_indices(cluster, neighbour), "not one GPU"
        reclaim.tick_until((hog, neighbour), lambda: bool(finished(reclaim.actions(hog), "requeue")), 90,
                           f"job {hog} to be requeued")
        rows = reclaim.actions(hog)
        assert [(r.verdict, r.action, r.state) for r in rows] == [
            ("over_memory", "notify", "done"), ("over_memory", "requeue", "done")], [r.detail for r in rows]
        assert reclaim.actions(neighbour) == []
        info = cluster.slurm.job(neighbour)
        assert info is not None and (info.state, info.restarts) == ("RUNNING", 0)
        assert wait_job_state(cluster, hog, ("PENDING", "RUNNING", "COMPLETING"), timeout_s=30).restarts == 1
    finally:
        cancel(cluster, *jobs)
