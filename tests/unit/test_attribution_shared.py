"""A GPU shared with work of no job, or between a busy and an idle process: who is charged."""

from __future__ import annotations

from datetime import UTC, datetime

from slurm_aigc.errors import SlurmCommandError
from slurm_aigc.reclaim.detect import JobMeta, JobWindow
from slurm_aigc.reclaim.memguard import judge_memory
from slurm_aigc.series import GpuSeries, Sample
from slurm_aigc.telemetry.attribution import Attributor, _process_weights, job_gpu_usage
from slurm_aigc.telemetry.records import GpuProcess, GpuReading, NodeReading

T0 = datetime(2026, 12, 2, tzinfo=UTC)
GIB = 1024.0


def hogged_gpu() -> NodeReading:
    """GPU 0, allocated to job A alone, holds 60 GiB of pid 999, a process in no job; A runs nothing on it."""
    gpu = GpuReading(0, memory_total_mib=81920.0, memory_used_mib=61440.0, sm_util_pct=80.0,
                     processes=(GpuProcess(999, 61440.0, None),))
    return NodeReading("n1", T0, "550", (gpu,))


def test_a_strangers_memory_is_not_charged_to_the_job_holding_the_gpu() -> None:
    (row,) = job_gpu_usage(hogged_gpu(), {999: None}, {"A": [0]})
    # The GPU's utilization stays A's (its work may be the unexplained one: never a false idle),
    # but its memory is unknown, not the hog's 60 GiB.
    assert (row.job_id, row.sm_util_pct, row.memory_used_mib, row.pids) == ("A", 80.0, None, ())


def test_the_memory_guard_never_requeues_the_job_beside_a_hog() -> None:
    rows = [job_gpu_usage(hogged_gpu(), {999: None}, {"A": [0]})[0] for _ in range(4)]
    samples = tuple(Sample(1000.0 + 10 * i, r.sm_util_pct, r.memory_used_mib) for i, r in enumerate(rows))
    window = JobWindow(JobMeta("A", "infer", 1000.0, None, True), (GpuSeries("n1", 0, samples),))
    assert judge_memory(window, 20 * GIB, 3, 1030.0, 20.0, allowance_mib=0.0) is None


def test_a_failed_pid_lookup_is_asked_again_soon() -> None:
    class FlakySlurm:
        def __init__(self) -> None:
            self.calls = 0

        def job_of_pid(self, pid: int) -> str | None:
            self.calls += 1
            if self.calls == 1:
                raise SlurmCommandError(["scontrol", "pidinfo", str(pid)], None, "timed out")
            return "42"

    class NoProc:
        def stat(self, pid: int) -> str | None:
            return None

        status = cmdline = cgroup = environ = stat

    now = [0.0]
    slurm = FlakySlurm()
    attributor = Attributor(slurm, NoProc(), ttl_s=300.0, clock=lambda: now[0], retry_s=60.0)
    assert attributor.job_of(7) is None
    now[0] = 30.0
    assert attributor.job_of(7) is None and slurm.calls == 1  # a hung slurmd is not asked every poll
    now[0] = 61.0
    assert attributor.job_of(7) == "42"  # long before the 300 s an answer is kept
    now[0] = 200.0
    assert attributor.job_of(7) == "42" and slurm.calls == 2


def test_a_process_without_a_sample_counts_zero_when_another_has_one() -> None:
    busy, idle = GpuProcess(1, 200.0, 90.0), GpuProcess(2, 30720.0, None)
    assert _process_weights([busy, idle]) == [90.0, 0.0]
    assert _process_weights([GpuProcess(1, 200.0, None), idle]) == [200.0, 30720.0]  # no sample at all: memory
    gpu = GpuReading(0, sm_util_pct=90.0, processes=(busy, idle))
    rows = job_gpu_usage(NodeReading("n1", T0, "550", (gpu,)), {1: "busy", 2: "idle"})
    assert [(r.job_id, r.sm_util_pct, r.memory_used_mib) for r in rows] == [
        ("busy", 90.0, 200.0), ("idle", 0.0, 30720.0)]
