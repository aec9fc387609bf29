"""The local cluster is a real multi-node GPU Slurm: jobs land on the right GPUs and are accounted."""

from __future__ import annotations

import pytest

from slurm_aigc.slurm import SlurmCli
from tests.conftest import ClusterHandle
from tests.integration.helpers import cancel_quietly, job_output, submit, wait_for, wait_job_state

pytestmark = pytest.mark.cluster


def test_t4_job_runs_on_a_t4_node_with_cuda_visible_devices(cluster: ClusterHandle) -> None:
    job_id = submit(cluster, 'echo "CVD=${CUDA_VISIBLE_DEVICES:-unset} NODE=$SLURMD_NODENAME"', "--gres=gpu:t4:1")
    job = wait_job_state(cluster, job_id, "COMPLETED")
    assert job.node_list.startswith("t4-")
    output = job_output(job_id)
    assert f"NODE={job.node_list}" in output
    cvd = output.split("CVD=")[1].split()[0]
    assert cvd != "unset" and 0 <= int(cvd) < 4


def test_eight_gpu_job_lands_on_an_a100_node(cluster: ClusterHandle) -> None:
    job_id = submit(cluster, 'echo "GPUS=$SLURM_JOB_GPUS"', "--gres=gpu:8")
    job = wait_job_state(cluster, job_id, "COMPLETED")
    assert job.node_list.startswith("a100-")
    assert job_output(job_id).strip() == "GPUS=0,1,2,3,4,5,6,7"


def test_shard_job_gets_its_shards(cluster: ClusterHandle) -> None:
    job_id = submit(cluster, 'echo "SHARDS=$SLURM_SHARDS_ON_NODE CVD=$CUDA_VISIBLE_DEVICES"', "--gres=shard:20")
    wait_job_state(cluster, job_id, "COMPLETED")
    assert "SHARDS=20" in job_output(job_id)


def test_finished_job_is_in_sacct_with_gpu_tres_and_comment(cluster: ClusterHandle) -> None:
    job_id = submit(cluster, "true", "--gres=gpu:t4:2", "--comment=exp7 aigc:type=infer,vram=8G")
    wait_job_state(cluster, job_id, "COMPLETED")

    def accounted() -> list[str] | None:
        out = cluster.slurm.run("sacct", ["-j", job_id, "-X", "-n", "-P", "--format=JobID,State,AllocTRES,Comment"]).stdout
        fields = out.strip().split("|")
        return fields if len(fields) == 4 and fields[1] == "COMPLETED" else None

    _, _, alloc_tres, comment = wait_for(accounted, 30, f"job {job_id} in sacct")
    assert "gres/gpu=2" in alloc_tres.split(",")
    assert "gres/gpu:t4=2" in alloc_tres.split(",")
    assert comment.startswith("exp7 aigc:type=infer,vram=8G")


def test_boundary_reads_nodes_and_updates_features_and_weight(cluster: ClusterHandle) -> None:
    slurm: SlurmCli = cluster.slurm
    name = cluster.nodes_of_type("t4")[-1]
    node = slurm.node(name)
    assert node.gres.startswith("gpu:t4:4")
    assert "t4" in node.available_features
    assert node.state.split("+")[0] in {"IDLE", "MIXED", "ALLOCATED"}
    original_features, original_weight = node.available_features, node.weight
    try:
        slurm.update_node(name, features=[*original_features, "boundary_test"], weight=original_weight + 41)
        updated = slurm.node(name)
        assert "boundary_test" in updated.available_features
        assert "boundary_test" in updated.active_features
        assert updated.weight == original_weight + 41
    finally:
        slurm.update_node(name, features=list(original_features), weight=original_weight)
    assert slurm.node(name).available_features == original_features


def test_boundary_requeues_a_running_batch_job(cluster: ClusterHandle) -> None:
    job_id = submit(cluster, 'echo "run restart=${SLURM_RESTART_COUNT:-0}"; exec sleep 300', "--gres=gpu:t4:1", "--requeue")
    try:
        wait_job_state(cluster, job_id, "RUNNING")
        cluster.slurm.requeue(job_id)
        again = wait_for(lambda: (j := cluster.slurm.job(job_id)) and j.restarts == 1 and j.state == "RUNNING" and j,
                         90, f"job {job_id} to run again after requeue")
        assert again.restarts == 1
        wait_for(lambda: "restart=1" in job_output(job_id), 30, "the restarted job's output")
    finally:
        cancel_quietly(cluster, job_id)
