"""pid -> job: cgroup layouts, scontrol fallback, caching; splitting shared GPUs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_aigc.errors import SlurmCommandError
from slurm_aigc.slurm import CommandResult, SlurmCli
from slurm_aigc.telemetry.attribution import (
    Attributor,
    JobGpuUsage,
    job_from_ancestry,
    job_from_cgroup,
    job_from_stepd_cmdline,
    job_gpu_usage,
)
from slurm_aigc.telemetry.records import GpuProcess, GpuReading, NodeReading

V1 = """12:pids:/slurm/uid_1000/job_123/step_0/task_0
11:memory:/slurm/uid_1000/job_123/step_0/task_0
4:devices:/slurm/uid_1000/job_123/step_0
1:name=systemd:/system.slice/slurmd.service
"""
V1_MULTI_SLURMD = "7:cpuset:/slurm_a100-02/uid_0/job_88/step_batch/task_0\n"
V2 = "0::/system.slice/slurmstepd.scope/job_4567/step_batch/user/task_0\n"
V2_MULTI_SLURMD = "0::/system.slice/a100-01_slurmstepd.scope/job_31/step_0/user/task_0\n"
V2_INTERACTIVE = "0::/system.slice/slurmstepd.scope/job_9/step_interactive/user/task_special\n"
NOT_SLURM = [
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    "0::/system.slice/docker-abc.scope/job_5/x\n",  # a job_ folder outside Slurm's tree
    "0::/system.slice/slurmd.service\n",  # slurmd itself
    "",
]


@pytest.mark.parametrize(
    ("text", "job"),
    [(V1, "123"), (V1_MULTI_SLURMD, "88"), (V2, "4567"), (V2_MULTI_SLURMD, "31"), (V2_INTERACTIVE, "9")],
)
def test_job_from_slurm_cgroups(text: str, job: str) -> None:
    assert job_from_cgroup(text) == job


@pytest.mark.parametrize("text", NOT_SLURM)
def test_non_slurm_cgroups_have_no_job(text: str) -> None:
    assert job_from_cgroup(text) is None


class FakeRunner:
    """Answers `scontrol pidinfo PID` from a table; counts calls."""

    def __init__(self, jobs: dict[int, str]) -> None:
        self.jobs = jobs
        self.calls: list[list[str]] = []

    def __call__(self, argv: object, timeout_s: float, stdin: str | None = None) -> CommandResult:
        args = list(argv)  # type: ignore[call-overload]
        self.calls.append(args)
        pid = int(args[-1])
        if pid in self.jobs:
            out = f"Slurm JobId={self.jobs[pid]} ends at Wed Dec 02 18:00:00 2026\nJob remaining time is 3000 seconds\n"
            return CommandResult(tuple(args), 0, out, "")
        return CommandResult(tuple(args), 1, "", f"slurm_pid2jobid: Process not managed by Slurm: pid {pid}\n")


def proc(root: Path, pid: int, cgroup: str, start_ticks: int = 100) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(cgroup)
    fields = " ".join(["S"] + ["0"] * 18 + [str(start_ticks)])
    (root / str(pid) / "stat").write_text(f"{pid} (python) {fields}\n")


def tree_proc(root: Path, pid: int, ppid: int, comm: str, cmdline: str, uid: int) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} " + " ".join(["0"] * 18) + " 100\n")
    (root / str(pid) / "cmdline").write_text(cmdline.replace(" ", "\0") + "\0" if comm != "slurmstepd" else cmdline + "\0")
    (root / str(pid) / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (root / str(pid) / "cgroup").write_text("0::/\n")


@pytest.mark.parametrize(
    ("cmdline", "job"),
    [("slurmstepd: [10.batch]", "10"), ("slurmstepd: [10.0]", "10"), ("slurmstepd: [7+1.extern]", "7"),
     ("slurmstepd: [123.interactive]", "123"), ("slurmstepd", None), ("python train.py", None)],
)
def test_job_from_stepd_cmdline(cmdline: str, job: str | None) -> None:
    assert job_from_stepd_cmdline(cmdline) == job


def test_ancestry_finds_the_root_owned_slurmstepd(tmp_path: Path) -> None:
    tree_proc(tmp_path, 30, 1, "slurmstepd", "slurmstepd: [77.batch]", 0)
    tree_proc(tmp_path, 40, 30, "slurm_script", "/bin/sh slurm_script", 1000)
    tree_proc(tmp_path, 45, 40, "slurmstepd", "slurmstepd: [99.0]", 1000)  # a user's fake
    tree_proc(tmp_path, 50, 45, "python3", "python3 serve.py", 1000)
    tree_proc(tmp_path, 60, 1, "python3", "python3 stray.py", 1000)
    assert job_from_ancestry(tmp_path, 50) == "77"
    assert job_from_ancestry(tmp_path, 60) is None
    assert job_from_ancestry(tmp_path, 4242) is None
    assert Attributor(SlurmCli(runner=FakeRunner({})), proc_root=tmp_path).job_of(50) == "77"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cgroup_first_then_scontrol_with_cache(tmp_path: Path) -> None:
    proc(tmp_path, 10, V2)
    proc(tmp_path, 11, "0::/init.scope\n")  # not in a Slurm cgroup: ask slurmd
    runner = FakeRunner({11: "555"})
    clock = Clock()
    attributor = Attributor(SlurmCli(runner=runner), proc_root=tmp_path, ttl_s=60, clock=clock)
    assert attributor.jobs_of([10, 11, 12]) == {10: "4567", 11: "555", 12: None}
    assert [c[-1] for c in runner.calls] == ["11", "12"]
    attributor.jobs_of([10, 11, 12])
    assert len(runner.calls) == 2  # cached, including the negative answer
    clock.now = 61
    attributor.jobs_of([11])
    assert len(runner.calls) == 3  # expired


def test_reused_pid_is_looked_up_again(tmp_path: Path) -> None:
    proc(tmp_path, 20, V2, start_ticks=1)
    attributor = Attributor(None, proc_root=tmp_path, clock=Clock())
    assert attributor.job_of(20) == "4567"
    proc(tmp_path, 20, V1, start_ticks=2)
    assert attributor.job_of(20) == "123"


def test_scontrol_failure_is_not_fatal(tmp_path: Path) -> None:
    class Broken:
        def job_of_pid(self, pid: int) -> str | None:
            raise SlurmCommandError(["scontrol", "pidinfo", str(pid)], None, "timed out")

    assert Attributor(Broken(), proc_root=tmp_path).job_of(5) is None


# --------------------------------------------------------------------------- per-job rows

T0 = datetime(2026, 12, 2, tzinfo=UTC)


def node(*gpus: GpuReading) -> NodeReading:
    return NodeReading("a100-01", T0, "550", gpus)


def test_one_job_per_gpu_gets_the_whole_gpu() -> None:
    reading = node(GpuReading(0, sm_util_pct=70.0, processes=(GpuProcess(1, 10240.0, None),)))
    assert job_gpu_usage(reading, {1: "7"}) == [JobGpuUsage("7", 0, 70.0, 10240.0, False, (1,))]


def test_shared_gpu_split_by_process_sm_util_when_known() -> None:
    gpu = GpuReading(0, sm_util_pct=90.0, processes=(GpuProcess(1, 1000.0, 60.0), GpuProcess(2, 9000.0, 30.0)))
    rows = job_gpu_usage(node(gpu), {1: "a", 2: "b"})
    assert [(r.job_id, r.sm_util_pct, r.memory_used_mib, r.shared) for r in rows] == [
        ("a", 60.0, 1000.0, True),
        ("b", 30.0, 9000.0, True),
    ]


def test_shared_gpu_split_by_memory_when_any_process_util_unknown() -> None:
    gpu = GpuReading(0, sm_util_pct=80.0, processes=(GpuProcess(1, 1000.0, 60.0), GpuProcess(2, 3000.0, None)))
    rows = job_gpu_usage(node(gpu), {1: "a", 2: "b"})
    assert [(r.job_id, r.sm_util_pct) for r in rows] == [("a", 20.0), ("b", 60.0)]


def test_unattributed_process_keeps_its_share() -> None:
    gpu = GpuReading(0, sm_util_pct=100.0, processes=(GpuProcess(1, 1000.0, 50.0), GpuProcess(2, 1000.0, 50.0)))
    rows = job_gpu_usage(node(gpu), {1: "a", 2: None})
    assert [(r.job_id, r.sm_util_pct, r.shared) for r in rows] == [("a", 50.0, False)]


def test_two_processes_of_one_job_add_up() -> None:
    gpu = GpuReading(0, sm_util_pct=40.0, processes=(GpuProcess(1, 100.0, 10.0), GpuProcess(2, 200.0, 30.0)))
    assert job_gpu_usage(node(gpu), {1: "a", 2: "a"}) == [JobGpuUsage("a", 0, 40.0, 300.0, False, (1, 2))]


def test_allocations_add_zero_rows_and_lost_gpus_are_skipped() -> None:
    reading = node(
        GpuReading(0, sm_util_pct=90.0, processes=(GpuProcess(1, 100.0, None),)),
        GpuReading(1, sm_util_pct=0.0),
        GpuReading(2, lost=True, error="GPU is lost"),
    )
    rows = job_gpu_usage(reading, {1: "a"}, allocations={"a": [0, 1, 2]})
    assert [(r.gpu_index, r.job_id, r.sm_util_pct, r.pids) for r in rows] == [(0, "a", 90.0, (1,)), (1, "a", 0.0, ())]


def test_util_unknown_stays_unknown() -> None:
    reading = node(GpuReading(0, sm_util_pct=None, processes=(GpuProcess(1, 100.0, None),)))
    assert job_gpu_usage(reading, {1: "a"})[0].sm_util_pct is None
