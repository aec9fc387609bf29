"""A job running `slurm-aigc gpu-load` shows up on its own GPUs in the simulated backend,
and its pid is attributed to its job id."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_aigc.db import open_database
from slurm_aigc.telemetry.agent import Agent, slurm_allocation_lookup
from slurm_aigc.telemetry.attribution import Attributor, JobAllocations, job_gpu_usage, parse_job_record
from slurm_aigc.telemetry.config import AgentConfig
from slurm_aigc.telemetry.procfs import JobRecordDir, ProcFs
from slurm_aigc.telemetry.records import NodeReading
from slurm_aigc.telemetry.simgpu import SimGpuBackend
from slurm_aigc.telemetry.store import TelemetryStore
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


# --------------------------------------------------------------------------- the RPC budget

_SDIAG_RE = re.compile(r"^\s+([A-Z_]+)\s+\(\s*\d+\)\s+count:(\d+)")
READS = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE",
         "REQUEST_PARTITION_INFO")


def sdiag_reads() -> dict[str, int]:
    """slurmctld's count of the job/node/partition reads (`sdiag`, by message type)."""
    text = subprocess.run(["sdiag"], capture_output=True, text=True, check=True, timeout=30).stdout
    section = text.split("by message type", 1)[1].split("by user", 1)[0]
    counts = {m.group(1): int(m.group(2)) for line in section.splitlines() if (m := _SDIAG_RE.match(line))}
    return {kind: counts.get(kind, 0) for kind in READS}


def node_agent(cluster: ClusterHandle, node: str, tmp_path: Path) -> tuple[Agent, JobAllocations, TelemetryStore]:
    """The production agent's parts for `node` (as `build_agent` wires them), storing in SQLite."""
    proc = ProcFs()
    allocations = JobAllocations(node, JobRecordDir(node).read, slurm_allocation_lookup(cluster.slurm, node), proc)
    store = TelemetryStore(open_database(f"sqlite:///{tmp_path / f'{node}.db'}"))
    agent = Agent(node, SimGpuBackend(node, cluster.simgpu_dir), store, cluster.slurm,
                  AgentConfig(publish_features=False), attribute=Attributor(cluster.slurm, proc).jobs_of,
                  split_uses=job_gpu_usage, parse_islands=lambda text: [], allocations=allocations)
    return agent, allocations, store


def has_record(node: str, job_id: str) -> Callable[[], bool]:
    return lambda: job_id in JobRecordDir(node).read()


def test_agent_polls_ask_slurmctld_nothing_and_attribute_gpu_and_shard_jobs(cluster: ClusterHandle, tmp_path: Path) -> None:
    a100, t4 = cluster.nodes_of_type("a100")[0], cluster.nodes_of_type("t4")[0]
    load = f"{SLURM_AIGC_BIN} gpu-load --util {{util}} --mem {{mem}} --seconds 90\n"
    jobs = {
        "gpu": submit(cluster, load.format(util=60, mem="4G"), "--gres=gpu:a100:2", f"--nodelist={a100}", user=None),
        "shard30": submit(cluster, load.format(util=30, mem="2G"), "--gres=shard:8", f"--nodelist={t4}", user=None),
        "shard50": submit(cluster, load.format(util=50, mem="6G"), "--gres=shard:8", f"--nodelist={t4}", user=None),
    }
    try:
        for job_id in jobs.values():
            wait_job_state(cluster, job_id, "RUNNING", timeout_s=60)
        expected = {name: allocated_gpu_indices(cluster, job_id) for name, job_id in jobs.items()}
        for name, node in (("gpu", a100), ("shard30", t4), ("shard50", t4)):
            wait_for(has_record(node, jobs[name]), 30, f"the Prolog's record of {name} on {node}")
        agents = {node: node_agent(cluster, node, tmp_path) for node in (a100, t4)}

        def attributed() -> dict[str, list[tuple[int, float | None, float]]] | None:
            rows: dict[str, list[tuple[int, float | None, float]]] = {}
            for agent, allocations, _store in agents.values():
                reading = agent._backend.read()
                pid_jobs = agent._attribute(sorted({p.pid for g in reading.gpus for p in g.processes}))
                for row in job_gpu_usage(reading, pid_jobs, allocations(pid_jobs)):
                    rows.setdefault(row.job_id, []).append((row.gpu_index, row.sm_util_pct, row.memory_used_mib))
            mine = {name: rows.get(job_id, []) for name, job_id in jobs.items()}
            return mine if all(any(util for _, util, _ in r) for r in mine.values()) else None

        wait_for(attributed, 30, "gpu-load of all three jobs on their GPUs")
        before = sdiag_reads()
        for _ in range(3):
            for agent, _allocations, _store in agents.values():
                assert agent.tick().rows_written > 0
        after = sdiag_reads()
        assert after == before, f"agent polls made slurmctld reads: {before} -> {after}"
        # A job whose record lists its GPUs costs no lookup; one whose record has no GPU list (24.11's
        # Prolog after `scontrol reconfigure`, issue 13) is looked up once, while it runs.
        unlisted = sum(parse_job_record(JobRecordDir(node).read()[jobs[name]], jobs[name], node).gpus is None
                       for name, node in (("gpu", a100), ("shard30", t4), ("shard50", t4)))
        assert sum(allocations.lookups for _agent, allocations, _store in agents.values()) == unlisted

        rows = attributed()
        assert rows is not None
        assert sorted(gpu for gpu, _, _ in rows["gpu"]) == sorted(expected["gpu"])
        assert all(util == pytest.approx(60.0) for _, util, _ in rows["gpu"])
        for name, util, mem in (("shard30", 30.0, 2048.0), ("shard50", 50.0, 6144.0)):
            ((gpu, got_util, got_mem),) = rows[name]  # one row per shard job: split by job
            assert gpu == expected[name][0]
            assert got_mem == pytest.approx(mem)
            if expected["shard30"] == expected["shard50"]:  # one GPU split between the two jobs by their own use
                assert got_util == pytest.approx(util, abs=0.01)
    finally:
        cancel_quietly(cluster, *jobs.values())
