"""pid -> job: cgroup layouts, scontrol fallback, caching; splitting shared GPUs."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_aigc.errors import AigcError, SlurmCommandError
from slurm_aigc.slurm import CommandResult, SlurmCli
from slurm_aigc.telemetry.attribution import (
    Attributor,
    JobAllocations,
    JobGpuUsage,
    JobRecord,
    job_from_ancestry,
    job_from_cgroup,
    job_from_stepd_cmdline,
    job_gpu_usage,
    parse_index_env,
    parse_job_record,
    uid_of,
)
from slurm_aigc.telemetry.procfs import JobRecordDir, ProcFs
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
    # Under a cgroup a user was delegated (systemd-run --user -p Delegate=yes, then mkdir):
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurm-x.service/job_777\n",
    "0::/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_777/step_0\n",
    "4:memory:/user.slice/user-1000.slice/slurm/uid_1000/job_777/step_0\n",
    "0::/system.slice/slurmstepd.scope/job_12x/step_0\n",
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
        return CommandResult(tuple(args), 1, "", "Failed to locate job for requested pid\n")  # as 22.05.8 says


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
    assert job_from_ancestry(ProcFs(tmp_path), 50) == "77"
    assert job_from_ancestry(ProcFs(tmp_path), 60) is None
    assert job_from_ancestry(ProcFs(tmp_path), 4242) is None
    assert Attributor(SlurmCli(runner=FakeRunner({})), ProcFs(tmp_path)).job_of(50) == "77"


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
    attributor = Attributor(SlurmCli(runner=runner), ProcFs(tmp_path), ttl_s=60, clock=clock)
    assert attributor.jobs_of([10, 11, 12]) == {10: "4567", 11: "555", 12: None}
    assert [c[-1] for c in runner.calls] == ["11", "12"]
    attributor.jobs_of([10, 11, 12])
    assert len(runner.calls) == 2  # cached, including the negative answer
    clock.now = 61
    attributor.jobs_of([11])
    assert len(runner.calls) == 3  # expired


def test_reused_pid_is_looked_up_again(tmp_path: Path) -> None:
    proc(tmp_path, 20, V2, start_ticks=1)
    attributor = Attributor(None, ProcFs(tmp_path), clock=Clock())
    assert attributor.job_of(20) == "4567"
    proc(tmp_path, 20, V1, start_ticks=2)
    assert attributor.job_of(20) == "123"


def test_scontrol_failure_is_not_fatal(tmp_path: Path) -> None:
    class Broken:
        def job_of_pid(self, pid: int) -> str | None:
            raise SlurmCommandError(["scontrol", "pidinfo", str(pid)], None, "timed out")

    assert Attributor(Broken(), ProcFs(tmp_path)).job_of(5) is None


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


def test_shared_gpu_split_by_memory_when_no_process_util_known() -> None:
    gpu = GpuReading(0, sm_util_pct=80.0, processes=(GpuProcess(1, 1000.0, None), GpuProcess(2, 3000.0, None)))
    rows = job_gpu_usage(node(gpu), {1: "a", 2: "b"})
    assert [(r.job_id, r.sm_util_pct) for r in rows] == [("a", 20.0), ("b", 60.0)]


def test_shared_gpu_process_without_a_sample_gets_none_of_the_sampled_work() -> None:
    # NVML keeps no sample for a process idle since the last read (test_attribution_shared.py).
    gpu = GpuReading(0, sm_util_pct=80.0, processes=(GpuProcess(1, 1000.0, 60.0), GpuProcess(2, 3000.0, None)))
    rows = job_gpu_usage(node(gpu), {1: "a", 2: "b"})
    assert [(r.job_id, r.sm_util_pct) for r in rows] == [("a", 80.0), ("b", 0.0)]


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


def test_work_nvml_shows_under_no_job_never_reads_as_an_allocated_jobs_idleness() -> None:
    # Seen on a real H100 in a k8s pod: 74 GB used, "No running processes found". MPS clients
    # and pids whose job lookup failed look the same. A 0 % row here gets a busy job requeued.
    # The memory of such rows is unknown (None), not the GPU's: the same picture is a user's
    # process outside any job beside an idle job, and charging that job would get the memory
    # guard to requeue it instead of the hog (test_attribution_shared.py).
    reading = node(
        GpuReading(0, sm_util_pct=97.0, memory_used_mib=74000.0),  # no process list
        GpuReading(1, sm_util_pct=60.0, processes=(GpuProcess(7, 5000.0, None),)),  # pid 7: job unknown
        GpuReading(2, sm_util_pct=50.0, memory_used_mib=9000.0),  # two shard jobs, nothing attributed
        GpuReading(3, sm_util_pct=0.0),  # over-allocated and truly idle: still a 0 % row
    )
    rows = job_gpu_usage(reading, {7: None}, allocations={"a": [0, 1, 3], "s1": [2], "s2": [2]})
    assert [(r.gpu_index, r.job_id, r.sm_util_pct, r.memory_used_mib) for r in rows] == [
        (0, "a", 97.0, None), (1, "a", 60.0, None), (2, "s1", None, None), (2, "s2", None, None), (3, "a", 0.0, 0.0)]


def test_util_unknown_stays_unknown() -> None:
    reading = node(GpuReading(0, sm_util_pct=None, processes=(GpuProcess(1, 100.0, None),)))
    assert job_gpu_usage(reading, {1: "a"})[0].sm_util_pct is None


# --------------------------------------------------------------------------- job -> GPUs


def record(job: str, node: str = "a100-01", gpus: object = (0, 1), **extra: object) -> str:
    return json.dumps({"job_id": job, "node": node, "gpus": list(gpus) if isinstance(gpus, tuple) else gpus, **extra})


class FakeProc:
    """A ProcView with only environments (NUL-separated, as /proc/<pid>/environ)."""

    def __init__(self, environ: dict[int, dict[str, str]]) -> None:
        self.env = environ

    def stat(self, pid: int) -> str | None:
        return None

    status = cmdline = cgroup = stat

    def environ(self, pid: int) -> str | None:
        return "\0".join(f"{k}={v}" for k, v in self.env.get(pid, {}).items()) + "\0" if pid in self.env else None


class Lookups:
    """An AllocationLookup answering from a table; counts calls and can fail."""

    def __init__(self, table: dict[str, set[int]], fail: bool = False) -> None:
        self.table, self.fail = table, fail
        self.calls: list[str] = []

    def __call__(self, job: str) -> frozenset[int]:
        self.calls.append(job)
        if self.fail:
            raise SlurmCommandError(["scontrol", "-d", "show", "job", "-o", job], 1, "Socket timed out")
        return frozenset(self.table.get(job, set()))


def test_parse_job_record_reads_gpus_user_account_and_stamp() -> None:
    parsed = parse_job_record(record("12", gpus=[3], user="alice", account="nlp", admin_comment="aigc_class=train"), "12", "a100-01")
    assert parsed == JobRecord("12", "a100-01", frozenset({3}), "alice", "nlp", "aigc_class=train")


@pytest.mark.parametrize(
    ("text", "needle"),
    [("{", "not JSON"), ("[1]", "not a JSON object"), (record("13"), "expected 12 on a100-01"),
     (record("12", node="t4-01"), "expected 12 on a100-01"), (record("12", gpus=["0"]), "list of GPU indices"),
     (record("12", gpus=[-1]), "list of GPU indices"), (record("12", gpus=[True]), "list of GPU indices")],
)
def test_bad_job_records_are_refused_with_the_reason(text: str, needle: str) -> None:
    with pytest.raises(AigcError, match=needle):
        parse_job_record(text, "12", "a100-01")


@pytest.mark.parametrize(("value", "gpus"), [("0,2-3", {0, 2, 3}), ("5", {5}), ("", None), (None, None),
                                             ("0,x", None), ("1-", None), ("GPU-uuid", None)])
def test_index_lists_from_the_environment(value: str | None, gpus: set[int] | None) -> None:
    assert parse_index_env(value) == (None if gpus is None else frozenset(gpus))


def test_a_recorded_job_costs_no_lookup_and_an_ending_job_keeps_its_record() -> None:
    records = {"7": record("7", gpus=[0, 1])}
    lookups = Lookups({"7": {5}})
    allocations = JobAllocations("a100-01", lambda: dict(records), lookups, FakeProc({}))
    assert allocations({100: "7"}) == {"7": [0, 1]}
    records.clear()  # the Epilog ran while pid 100 is still exiting
    assert allocations({100: "7"}) == {"7": [0, 1]}
    assert allocations({}) == {}
    assert lookups.calls == [] and allocations.lookups == 0


def test_a_job_without_record_is_looked_up_once_while_it_runs() -> None:
    lookups = Lookups({"8": {2}, "9": set()})
    allocations = JobAllocations("a100-01", dict, lookups, FakeProc({}))
    for _ in range(5):
        assert allocations({100: "8", 101: "9", 102: None}) == {"8": [2]}
    assert lookups.calls == ["8", "9"]
    allocations({})  # both ended
    allocations({100: "8"})
    assert lookups.calls == ["8", "9", "8"]


def test_a_failed_lookup_falls_back_to_the_environment_and_retries_later() -> None:
    clock = Clock()
    lookups = Lookups({"8": {2}}, fail=True)
    proc = FakeProc({100: {"SLURM_JOB_GPUS": "4,5"}})
    allocations = JobAllocations("a100-01", None, lookups, proc, retry_s=60, clock=clock)
    assert allocations({100: "8"}) == {"8": [4, 5]}
    assert allocations({100: "8"}) == {"8": [4, 5]}
    assert lookups.calls == ["8"]
    lookups.fail = False
    clock.now = 61
    assert allocations({100: "8"}) == {"8": [2]}  # Slurm's answer replaces the hint
    clock.now = 1000
    allocations({100: "8"})
    assert lookups.calls == ["8", "8"]


def test_a_bad_record_is_ignored_and_the_job_looked_up() -> None:
    lookups = Lookups({"7": {1}})
    allocations = JobAllocations("a100-01", lambda: {"7": record("7", node="other")}, lookups, None)
    assert allocations({1: "7"}) == {"7": [1]}
    assert lookups.calls == ["7"]


def test_record_dir_reads_root_owned_records_only(tmp_path: Path) -> None:
    node_dir = tmp_path / "a100-01"
    node_dir.mkdir(mode=0o755)
    node_dir.chmod(0o755)
    (node_dir / "7.json").write_text(record("7"))
    (node_dir / "8.json").write_text(record("8"))
    (node_dir / "8.json").chmod(0o666)  # anyone could have written it
    (node_dir / ".9.json.tmp").write_text(record("9"))  # the Prolog's half-written file
    (node_dir / "notes.txt").write_text("x")
    reader = JobRecordDir("a100-01", tmp_path, require_root=False)
    assert reader.read() == {"7": record("7")}
    node_dir.chmod(0o777)
    assert reader.read() == {}
    assert JobRecordDir("t4-01", tmp_path).read() == {}  # no Prolog installed
    if os.geteuid() != 0:
        node_dir.chmod(0o755)
        assert JobRecordDir("a100-01", tmp_path).read() == {}  # owned by a user, not root


def test_uid_parsing() -> None:
    assert uid_of("Name:\tx\nUid:\t1000\t1000\t1000\t1000\n") == 1000
    assert uid_of("Name:\tx\n") is None
