"""GPUs in MIG mode through to reclaim: the readings of a MIG GPU never make a job idle,
memory-held, fake-busy or over its memory, and a node with MIG GPUs is still judged on its
whole GPUs. Agent, store and detectors are the production code; NVML is the fake machine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from slurm_aigc.db import open_database
from slurm_aigc.reclaim.config import ClassPolicy
from slurm_aigc.reclaim.controller import windows_from_rows
from slurm_aigc.reclaim.detect import GpuSeries, JobMeta, JobWindow, Sample, detect_job
from slurm_aigc.reclaim.memguard import judge_memory
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.slurm import SlurmCli
from slurm_aigc.telemetry.agent import Agent
from slurm_aigc.telemetry.attribution import job_gpu_usage
from slurm_aigc.telemetry.config import AgentConfig
from slurm_aigc.telemetry.nvml import NvmlBackend
from slurm_aigc.telemetry.store import TelemetryStore
from slurm_aigc.telemetry.topology import parse_topo_matrix
from tests.fakes import nvml as fakes
from tests.fakes.slurm import FakeNode, FakeSlurm

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
STEP_S = 10.0
POLLS = 12
POLICY = ClassPolicy(grace_s=0.0, window_s=60.0, min_samples=5, idle_util_pct=1.0, idle_memory_mib=1024.0,
                     busy_util_pct=90.0, low_power_pct=25.0)
GAP_S = 2 * STEP_S
GIB = 1024.0
# dgx_a100_mig(): pids 6001 (job 301, 9 GiB) and 6002 (job 302, 30 GiB) on MIG instances of GPU 0;
# pid 4242 (job 101) busy on whole GPU 4; pid 7001 (job 401, added below) idle on whole GPU 5, holding 2 GiB.
PID_JOBS = {6001: "301", 6002: "302", 4242: "101", 7001: "401"}
# What the Prolog records say: Slurm numbers the node's GPUs as it hands them out, MIG instances
# included, so job 301's instance is Slurm's GPU 6 and job 302's is 7, while NVML's GPUs 6 and 7
# are whole (and idle).
SLURM_GPUS = {"301": [6], "302": [7], "101": [28], "401": [29]}


def mig_node() -> fakes.FakeMachine:
    machine = fakes.dgx_a100_mig()
    gpus = list(machine.gpus)
    gpus[5] = replace(gpus[5], memory_used_mib=2048, processes=(fakes.FakeProcess(7001, 2048, 0),))
    return replace(machine, gpus=tuple(gpus))


def sampled_windows(tmp_path: Path) -> tuple[dict[str, JobWindow], float]:
    """POLLS polls of the agent into SQLite, read back as reclaim reads them; and the last poll's time."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    times = iter(T0 + timedelta(seconds=STEP_S * i) for i in range(POLLS))
    machine = mig_node()
    backend = NvmlBackend("dgx-01", nvml=fakes.FakeNvml(machine), clock=lambda: next(times), smi=fakes.smi_runner(machine))

    def attribute(pids: Sequence[int]) -> Mapping[int, str | None]:
        return {pid: PID_JOBS.get(pid) for pid in pids}

    agent = Agent("dgx-01", backend, TelemetryStore(open_database(url)), SlurmCli(runner=FakeSlurm([FakeNode("dgx-01")])),
                  AgentConfig(publish_features=False), attribute=attribute, split_uses=job_gpu_usage,
                  parse_islands=lambda text: parse_topo_matrix(text).nvlink_islands(),
                  allocations=lambda _pid_jobs: SLURM_GPUS)
    for _ in range(POLLS):
        agent.tick()
    start = T0.timestamp()
    metas = {job: JobMeta(job, "train", start, 1) for job in SLURM_GPUS}
    rows = ReclaimStore(open_database(url)).samples(metas, start)
    found = {window.meta.job_id: window for window in windows_from_rows(metas, rows)}
    return {job: found.get(job, JobWindow(meta, ())) for job, meta in metas.items()}, start + STEP_S * (POLLS - 1)


def test_jobs_on_a_mig_node_are_judged_only_on_whole_gpus(tmp_path: Path) -> None:
    windows, now = sampled_windows(tmp_path)
    verdicts = {job: detect_job(window, POLICY, now, GAP_S) for job, window in windows.items()}
    # Jobs on MIG instances: no figure of theirs was measured, so nothing is said of them.
    assert (verdicts["301"].kind, verdicts["301"].reason) == (None, "no samples")
    assert (verdicts["302"].kind, verdicts["302"].reason) == (None, "no samples")
    # A shard job over its shards' GiB would be requeued: 302's 30 GiB are never held against it.
    assert judge_memory(windows["302"], 20 * GIB, 3, now, GAP_S, allowance_mib=GIB) is None
    # Whole GPUs of the same node are judged as anywhere else.
    assert verdicts["101"].kind is None and verdicts["101"].reason == "in use"
    assert verdicts["401"].kind == "memory_held"


def test_unknown_utilization_is_never_idle_held_or_fake_busy() -> None:
    # What the detectors make of a GPU whose utilization NVML does not give (a MIG parent's): with
    # any memory and power, over a window long enough to prove anything, no verdict on it.
    start = T0.timestamp()
    for memory, power in ((0.0, 60.0), (60_000.0, 80.0), (None, None)):
        samples = tuple(Sample(start + STEP_S * i, None, memory, power, 400.0) for i in range(POLLS))
        unknown = GpuSeries("dgx-01", 0, samples)
        now = samples[-1].ts
        assert detect_job(JobWindow(JobMeta("9", "train", start, 1), (unknown,)), POLICY, now, GAP_S).kind is None
        # Beside a GPU the job leaves idle, the unknown one counts as used: the job needs 1 of its 2.
        idle = GpuSeries("dgx-01", 1, tuple(Sample(s.ts, 0.0, 0.0, 60.0, 400.0) for s in samples))
        two = detect_job(JobWindow(JobMeta("9", "train", start, 2), (unknown, idle)), POLICY, now, GAP_S)
        assert (two.kind, two.gpus_used) == ("over_allocated", 1)


def test_a_mig_gpus_rows_cannot_be_judged_even_where_allocations_place_a_job_on_it() -> None:
    # Defence in depth: were allocations read on a MIG node, a job placed on a MIG GPU gets a row
    # whose utilization is unknown and whose memory is no figure of the GPU's (the instances' sum).
    machine = mig_node()
    times = iter(T0 + timedelta(seconds=STEP_S * i) for i in range(POLLS))
    backend = NvmlBackend("dgx-01", nvml=fakes.FakeNvml(machine), clock=lambda: next(times))
    samples = []
    for _ in range(POLLS):
        reading = backend.read()
        (row,) = job_gpu_usage(reading, {}, {"301": [0]})
        assert (row.gpu_index, row.sm_util_pct) == (0, None) and not row.memory_used_mib
        samples.append(Sample(reading.ts.timestamp(), row.sm_util_pct, row.memory_used_mib, 180.0, 400.0))
    window = JobWindow(JobMeta("301", "train", T0.timestamp(), 1), (GpuSeries("dgx-01", 0, tuple(samples)),))
    now = samples[-1].ts
    assert detect_job(window, POLICY, now, GAP_S).kind is None
    assert judge_memory(window, 1.0, 3, now, GAP_S, allowance_mib=0.0) is None
