"""gpu-load: profiles, environment, the run loop, and the real command under signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_aigc.telemetry.loadgen import (
    PROFILES,
    GpuOutOfMemory,
    LoadPlan,
    LoadRun,
    ProfileError,
    job_gpu_indices,
    load_at,
    make_plan,
    next_change_s,
    node_name,
    parse_profile_spec,
    phase_at,
    progress_rate,
)
from slurm_aigc.telemetry.simgpu import (
    GpuLoad,
    ProcLoad,
    SimGpuBackend,
    memory_shortfall,
    parse_proc_load,
    proc_file,
    sim_gpus,
    sim_topology_text,
    write_inventory,
)

BUSY = PROFILES["busy"]


def test_constant_profiles() -> None:
    assert phase_at(BUSY, 0, util_pct=70, mem_gib=30) == (70, 30, 1.0)
    assert phase_at(BUSY, 10_000, util_pct=70, mem_gib=30) == (70, 30, 1.0)
    assert phase_at(PROFILES["idle"], 5, mem_gib=30) == (0.0, 30, 1.0)
    util, _, power = phase_at(PROFILES["hung"], 5)
    assert util == 100.0 and power < 0.5
    util, mem, power = phase_at(PROFILES["loading"], 5, mem_gib=40)
    assert util < 10 and mem == 40 and power < 1.0


def test_bursty_repeats() -> None:
    bursty = PROFILES["bursty"]
    busy_s = bursty.phases[0].seconds
    period = sum(p.seconds or 0 for p in bursty.phases)
    assert busy_s is not None
    assert phase_at(bursty, 0, util_pct=90)[0] == 90
    assert phase_at(bursty, busy_s + 1, util_pct=90)[0] == 0
    assert phase_at(bursty, period + 1, util_pct=90)[0] == 90
    assert next_change_s(bursty, period + 1) == period + busy_s


def test_idle_tail_ends_idle_forever() -> None:
    tail = PROFILES["idle-tail"]
    assert phase_at(tail, 0, util_pct=80)[0] < 10
    assert phase_at(tail, 30, util_pct=80)[0] == 80
    assert phase_at(tail, 10_000, util_pct=80)[0] == 0.0
    assert next_change_s(tail, 10_000) == float("inf")


def test_profile_spec_phases_and_boundaries() -> None:
    profile = parse_profile_spec("loading:30, busy:120 ,idle:60")
    assert [p.kind for p in profile.phases] == ["loading", "busy", "idle"] and not profile.repeat
    assert phase_at(profile, 29.9, util_pct=85)[0] < 10
    assert phase_at(profile, 30, util_pct=85)[0] == 85
    assert phase_at(profile, 150, util_pct=85)[0] == 0.0
    assert phase_at(profile, 10_000, util_pct=85)[0] == 0.0  # the last phase lasts until the end
    assert next_change_s(profile, 0) == 30 and next_change_s(profile, 30) == 150
    assert next_change_s(profile, 150) == float("inf")


def test_profile_spec_repeat() -> None:
    profile = parse_profile_spec("busy:10,idle:5,repeat")
    assert profile.repeat
    assert [phase_at(profile, t, util_pct=50)[0] for t in (0, 11, 15, 26, 31)] == [50, 0, 50, 0, 50]


@pytest.mark.parametrize("spec", ["", "busy", "busy:x", "nap:10", "busy:0", "repeat"])
def test_bad_profile_specs(spec: str) -> None:
    with pytest.raises(ProfileError):
        parse_profile_spec(spec)


def test_gpu_indices_prefer_slurm_node_indices() -> None:
    env = {"SLURM_JOB_GPUS": "3,5", "CUDA_VISIBLE_DEVICES": "0,1"}  # ConstrainDevices renumbering
    assert job_gpu_indices(env) == [3, 5]
    assert job_gpu_indices({**env, "SLURM_STEP_GPUS": "5"}) == [5]
    assert job_gpu_indices({"CUDA_VISIBLE_DEVICES": "2"}) == [2]  # a shard job
    assert job_gpu_indices({"CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a"}, {"GPU-a": 6, "GPU-b": 1}) == [1, 6]
    assert job_gpu_indices({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []
    with pytest.raises(ProfileError, match="GPU-zz"):
        job_gpu_indices({"CUDA_VISIBLE_DEVICES": "GPU-zz"})


def test_node_name_from_slurmd() -> None:
    assert node_name({"SLURMD_NODENAME": "t4-02"}) == "t4-02"
    assert node_name({}) != ""


def test_make_plan_needs_gpus(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no GPUs"):
        make_plan({"SLURMD_NODENAME": "a"}, tmp_path, BUSY, 85, 10, 1.0, 60)
    plan = make_plan({"SLURMD_NODENAME": "a", "SLURM_JOB_GPUS": "1", "SLURM_JOB_ID": "9"}, tmp_path, BUSY, 85, 10, 1.0, 60)
    assert (plan.node, plan.gpus, plan.job_id) == ("a", (1,), "9")


def test_over_allocated_loads_only_the_first_gpu() -> None:
    plan = LoadPlan("n", (2, 3, 4), PROFILES["over-allocated"], 90, 20, 1.0, 60, "5")
    load = load_at(plan, 77, 1.0, None)
    assert [(g.index, g.sm_util_pct, g.memory_used_mib) for g in load.gpus] == [(2, 90, 20 * 1024)]


def test_power_factor_option_scales_the_phase_factor() -> None:
    plan = LoadPlan("n", (0,), PROFILES["hung"], 90, 20, 2.0, 60, None)
    assert load_at(plan, 1, 0, None).gpus[0].power_factor == pytest.approx(0.3)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now


def test_run_writes_each_phase_and_removes_its_file(tmp_path: Path) -> None:
    profile = parse_profile_spec("loading:30,busy:60,idle:10")
    plan = LoadPlan("a100-01", (0, 1), profile, 85, 4, 1.0, 100, "12")
    fake = FakeTime()
    seen: list[tuple[float, str]] = []
    path = proc_file(tmp_path, "a100-01", 4242)

    def wait(seconds: float) -> None:
        seen.append((fake.now, parse_proc_load(path.read_text()).phase))
        fake.now += seconds

    LoadRun(plan, tmp_path, fake.clock, pid=4242, wait=wait).run()
    assert seen == [(0.0, "loading"), (30.0, "busy"), (90.0, "idle")]
    assert not path.exists()


def test_run_until_killed_stops_on_the_event(tmp_path: Path) -> None:
    plan = LoadPlan("n", (0,), BUSY, 85, 4, 1.0, 0, None)
    fake = FakeTime()
    run = LoadRun(plan, tmp_path, fake.clock, pid=1, wait=lambda s: run.stop.set())
    run.run()
    assert not proc_file(tmp_path, "n", 1).exists()


def proc(pid: int, *utils_by_gpu: tuple[int, float]) -> ProcLoad:
    return ProcLoad(pid, tuple(GpuLoad(index, util, 1024.0) for index, util in utils_by_gpu), "busy")


def test_progress_rate_is_the_share_of_the_most_crowded_gpu() -> None:
    own = proc(1, (0, 90.0), (1, 90.0))
    assert progress_rate(own, [own]) == 1.0
    assert progress_rate(own, [own, proc(2, (0, 10.0)), proc(3, (2, 100.0))]) == 1.0  # 100 % exactly fits
    assert progress_rate(own, [own, proc(2, (0, 90.0))]) == pytest.approx(100.0 / 180.0)
    assert progress_rate(own, [own, proc(2, (0, 30.0)), proc(3, (1, 110.0))]) == pytest.approx(100.0 / 200.0)
    idle = proc(1, (0, 0.0))
    assert progress_rate(idle, [idle, proc(2, (0, 100.0)), proc(3, (0, 100.0))]) == 1.0


def play(tmp_path: Path, work_conserving: bool, crowd: list[ProcLoad]) -> list[tuple[float, str]]:
    """(wall time, phase written) of `loading:30,busy:60,idle:10` beside `crowd`; last item: the end."""
    plan = LoadPlan("a100-01", (0,), parse_profile_spec("loading:30,busy:60,idle:10"), 100, 4, 1.0, 100, "7",
                    work_conserving)
    fake = FakeTime()
    seen: list[tuple[float, str]] = []
    path = proc_file(tmp_path, "a100-01", 4242)

    def wait(seconds: float) -> None:
        phase = parse_proc_load(path.read_text()).phase
        if not seen or seen[-1][1] != phase:
            seen.append((fake.now, phase))
        fake.now += seconds

    def live() -> list[ProcLoad]:
        return [parse_proc_load(path.read_text()), *crowd]

    LoadRun(plan, tmp_path, fake.clock, pid=4242, wait=wait, live_loads=live).run()
    return [*seen, (fake.now, "end")]


def test_work_conserving_busy_phase_lasts_longer_on_a_crowded_gpu(tmp_path: Path) -> None:
    crowd = [proc(99, (0, 100.0))]  # another job asking the whole GPU: each gets half
    assert play(tmp_path, True, crowd) == [(0.0, "loading"), (30.0, "busy"), (150.0, "idle"), (160.0, "end")]
    assert play(tmp_path, False, crowd) == [(0.0, "loading"), (30.0, "busy"), (90.0, "idle"), (100.0, "end")]
    assert play(tmp_path, True, [proc(99, (1, 100.0))]) == [(0.0, "loading"), (30.0, "busy"), (90.0, "idle"), (100.0, "end")]


def mem(pid: int, *mib_by_gpu: tuple[int, float]) -> ProcLoad:
    return ProcLoad(pid, tuple(GpuLoad(index, 50.0, mib) for index, mib in mib_by_gpu), "busy")


def test_memory_shortfall_counts_the_other_processes_on_each_gpu() -> None:
    totals = {0: 16384.0, 1: 16384.0}
    assert memory_shortfall(mem(1, (0, 16384.0)), [], totals) is None  # exactly the card fits
    short = memory_shortfall(mem(1, (0, 20480.0)), [], totals)
    assert short is not None and (short.gpu_index, short.free_mib) == (0, 16384.0)
    neighbours = [mem(2, (1, 10240.0)), mem(3, (1, 2048.0)), mem(1, (1, 99999.0))]  # own old file is not a neighbour
    assert memory_shortfall(mem(1, (0, 8192.0), (1, 4096.0)), neighbours, totals) is None
    short = memory_shortfall(mem(1, (0, 8192.0), (1, 4097.0)), neighbours, totals)
    assert short is not None and (short.gpu_index, short.free_mib) == (1, 4096.0)
    assert memory_shortfall(mem(1, (7, 1e9)), [], totals) is None  # a GPU of unknown size is not checked


def test_a_load_larger_than_its_gpu_fails_and_writes_nothing(tmp_path: Path) -> None:
    plan = LoadPlan("t4-01", (0,), BUSY, 85, 20, 1.0, 60, "5")
    run = LoadRun(plan, tmp_path, FakeTime().clock, pid=4242, wait=lambda s: None, live_loads=list,
                  memory_total_mib={0: 16 * 1024.0})
    with pytest.raises(GpuOutOfMemory, match=r"tried to allocate 20.0 GiB on GPU 0 of t4-01 \(16.0 GiB total, 16.0 GiB free\)"):
        run.run()
    assert not proc_file(tmp_path, "t4-01", 4242).exists()


def test_the_later_job_fails_when_a_neighbour_took_the_memory(tmp_path: Path) -> None:
    plan = LoadPlan("t4-01", (0,), BUSY, 85, 10, 1.0, 60, "5")
    fake = FakeTime()

    def run_beside(neighbours: list[ProcLoad]) -> LoadRun:
        run = LoadRun(plan, tmp_path, fake.clock, pid=4242, live_loads=lambda: neighbours,
                      memory_total_mib={0: 16 * 1024.0})
        run._wait = lambda seconds: run.stop.set()
        return run

    with pytest.raises(GpuOutOfMemory, match="6.0 GiB free"):
        run_beside([mem(7, (0, 10 * 1024.0))]).run()
    run_beside([mem(7, (1, 10 * 1024.0))]).run()  # the neighbour is on another GPU: it fits and runs


def wait_for(predicate: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_command_runs_under_signals_and_cleans_up(tmp_path: Path) -> None:
    write_inventory(tmp_path, "t4-01", sim_gpus("t4-01", "t4", 4, nvlink=False), sim_topology_text(4, nvlink=False))
    env = {**os.environ, "SLURMD_NODENAME": "t4-01", "SLURM_JOB_GPUS": "1,3", "SLURM_AIGC_SIMGPU_DIR": str(tmp_path)}
    env.pop("SLURM_STEP_GPUS", None)
    argv = [sys.executable, "-c", "from slurm_aigc.cli.main import main; main()", "gpu-load", "--util", "40", "--mem", "2G", "--until-killed"]
    child = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    path = proc_file(tmp_path, "t4-01", child.pid)
    try:
        wait_for(path.exists)
        reading = SimGpuBackend("t4-01", tmp_path).read()
        assert [g.index for g in reading.gpus if g.processes] == [1, 3]
        assert reading.gpus[1].processes[0].pid == child.pid and reading.gpus[3].sm_util_pct == 40.0
        assert json.loads(path.read_text())["gpus"][0]["memory_used_mib"] == 2048.0
        child.send_signal(signal.SIGUSR1)
        wait_for(lambda: child.poll() is None and path.exists(), 1.0)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=15) == 0
    finally:
        if child.poll() is None:
            child.kill()
    assert not path.exists()
    assert child.stderr is not None and "checkpoint requested" in child.stderr.read()


def test_command_exits_1_with_a_cuda_oom_message_when_the_gpu_is_too_small(tmp_path: Path) -> None:
    write_inventory(tmp_path, "t4-01", sim_gpus("t4-01", "t4", 4, nvlink=False), sim_topology_text(4, nvlink=False))
    env = {**os.environ, "SLURMD_NODENAME": "t4-01", "SLURM_JOB_GPUS": "2", "SLURM_AIGC_SIMGPU_DIR": str(tmp_path)}
    env.pop("SLURM_STEP_GPUS", None)
    argv = [sys.executable, "-c", "from slurm_aigc.cli.main import main; main()", "gpu-load", "--mem", "28G", "--seconds", "30"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "CUDA out of memory (simulated): tried to allocate 28.0 GiB on GPU 2 of t4-01" in done.stderr
    assert not list((tmp_path / "t4-01" / "procs").glob("*.json"))


def test_two_jobs_starting_together_cannot_both_take_the_last_memory(tmp_path: Path) -> None:
    write_inventory(tmp_path, "t4-01", sim_gpus("t4-01", "t4", 4, nvlink=False), sim_topology_text(4, nvlink=False))
    assert (tmp_path / "t4-01" / "alloc.lock").stat().st_mode & 0o777 == 0o644
    env = {**os.environ, "SLURMD_NODENAME": "t4-01", "CUDA_VISIBLE_DEVICES": "0", "SLURM_AIGC_SIMGPU_DIR": str(tmp_path)}
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        env.pop(name, None)
    argv = [sys.executable, "-c", "from slurm_aigc.cli.main import main; main()", "gpu-load", "--mem", "10G", "--until-killed"]
    children = [subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        wait_for(lambda: any(c.poll() is not None for c in children))
        failed = [c for c in children if c.poll() is not None]
        running = [c for c in children if c.poll() is None]
        assert len(failed) == 1 and failed[0].returncode == 1
        assert failed[0].stderr is not None and "CUDA out of memory" in failed[0].stderr.read()
        wait_for(proc_file(tmp_path, "t4-01", running[0].pid).exists)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
                child.wait(timeout=15)
