"""A job running `slurm-aigc gpu-load` shows up on its own GPUs in the simulated backend,
and its pid is attributed to its job id."""

from __future__ import annotations

import pytest

from slurm_aigc.telemetry.attribution import Attributor, job_gpu_usage
from slurm_aigc.telemetry.procfs import ProcFs
from slurm_aigc.telemetry.records import NodeReading
from slurm_aigc.telemetry.simgpu import SimGpuBackend
from slurm_aigc.telemetry.topology import parse_topo_matrix
from tests.conftest import SLURM_AIGC_BIN, ClusterHandle
from tests.integration.helpers import allocated_gpu_indices, cancel_quietly, submit, wait_for, wait_job_state

pytestmark = pytest.mark.cluster


def loaded_gpus(reading: NodeReading) -> dict[int, list[int]]:
    return {g.index: [p.pid for p in g.processes] for g in reading.gpus if g.processes}


def test_gpu_load_job_is_seen_on_its_gpus_and_attributed(cluster: ClusterHandle) -> None:
    # Job users cannot run the repository's venv interpreter, so the job runs as root.
    script = f"{SLURM_AIGC_BIN} gpu-load --util 70 --mem 10G --seconds 60\n"
    job_id = submit(cluster, script, "--gres=gpu:a100:2", "--job-name=telemetry-sim", user=None)
    try:
        job = wait_job_state(cluster, job_id, "RUNNING", timeout_s=60)
        node = job.node_list
        backend = SimGpuBackend(node, cluster.simgpu_dir)
        expected = allocated_gpu_indices(cluster, job_id)
        assert len(expected) == 2

        def two_loaded_gpus() -> NodeReading | None:
            reading = backend.read()
            mine = {i: pids for i, pids in loaded_gpus(reading).items() if i in expected}
            return reading if len(mine) == 2 else None

        reading = wait_for(two_loaded_gpus, 30, f"gpu-load of job {job_id} on {node} GPUs {expected}")
        gpus = [reading.gpus[i] for i in expected]
        pids = {p.pid for g in gpus for p in g.processes}
        assert len(pids) == 1, pids  # one gpu-load process on both GPUs
        (pid,) = pids
        for gpu in gpus:
            assert gpu.sm_util_pct == pytest.approx(70.0)
            assert gpu.memory_used_mib == pytest.approx(10240.0)
            assert gpu.power_limit_w is not None and gpu.power_draw_w is not None
            assert gpu.power_draw_w > 0.5 * gpu.power_limit_w
        # Other tests' jobs may load the node's other GPUs, but never with our pid.
        assert all(pid not in [p.pid for p in g.processes] for g in reading.gpus if g.index not in expected)

        attributor = Attributor(cluster.slurm, ProcFs())
        assert attributor.job_of(pid) == job_id
        rows = job_gpu_usage(reading, attributor.jobs_of([pid]))
        assert [(r.job_id, r.gpu_index, r.sm_util_pct) for r in rows] == [(job_id, i, 70.0) for i in sorted(expected)]

        topology = backend.topology_text()
        assert topology is not None
        assert parse_topo_matrix(topology).nvlink_islands() == [list(range(len(reading.gpus)))]
    finally:
        cancel_quietly(cluster, job_id)

    # scancel sends SIGTERM: gpu-load removes its file and its load is gone.
    def load_gone() -> bool:
        return all(pid not in [p.pid for p in g.processes] for g in backend.read().gpus)

    wait_for(load_gone, 30, f"gpu-load pid {pid} to leave {node} after scancel")
    assert not (cluster.simgpu_dir / node / "procs" / f"{pid}.json").exists()


def test_two_shard_jobs_on_one_gpu_are_split_by_job(cluster: ClusterHandle) -> None:
    node = cluster.nodes_of_type("t4")[0]
    loads = {"30": "2G", "50": "6G"}
    job_ids = {
        util: submit(cluster, f"{SLURM_AIGC_BIN} gpu-load --util {util} --mem {mem} --seconds 60\n",
                     "--gres=shard:8", f"--nodelist={node}", "--job-name=telemetry-shard", user=None)
        for util, mem in loads.items()
    }
    try:
        for job_id in job_ids.values():
            wait_job_state(cluster, job_id, "RUNNING", timeout_s=60)
        gpu_of = {util: allocated_gpu_indices(cluster, job_id) for util, job_id in job_ids.items()}
        assert all(len(g) == 1 for g in gpu_of.values()), gpu_of
        backend = SimGpuBackend(node, cluster.simgpu_dir)

        def both_running() -> NodeReading | None:
            reading = backend.read()
            found = {p.sm_util_pct for i in {g[0] for g in gpu_of.values()} for p in reading.gpus[i].processes}
            return reading if {30.0, 50.0} <= found else None

        reading = wait_for(both_running, 30, f"both shard jobs' gpu-load on {node}")
        attributor = Attributor(cluster.slurm, ProcFs())
        pids = [p.pid for g in reading.gpus for p in g.processes]
        rows = {r.job_id: r for r in job_gpu_usage(reading, attributor.jobs_of(pids)) if r.job_id in job_ids.values()}
        same_gpu = gpu_of["30"] == gpu_of["50"]
        for util, mem in loads.items():
            row = rows[job_ids[util]]
            assert row.gpu_index == gpu_of[util][0]
            assert row.memory_used_mib == pytest.approx(float(mem[:-1]) * 1024)
            assert row.shared is same_gpu or len(reading.gpus[row.gpu_index].processes) > 1
            gpu = reading.gpus[row.gpu_index]
            if sum(p.sm_util_pct or 0.0 for p in gpu.processes) <= 100.0:  # other tests' jobs may share it
                assert row.sm_util_pct == pytest.approx(float(util), abs=0.01)
        if same_gpu:
            ratio = rows[job_ids["50"]].sm_util_pct / rows[job_ids["30"]].sm_util_pct  # type: ignore[operator]
            assert ratio == pytest.approx(50 / 30, rel=0.01)
    finally:
        cancel_quietly(cluster, *job_ids.values())
