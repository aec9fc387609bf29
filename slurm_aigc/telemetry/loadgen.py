"""`slurm-aigc gpu-load`: declare a simulated GPU load from inside a job.

The process writes `<simgpu>/<node>/procs/<pid>.json` (see `simgpu`) with the load it
puts on the GPUs Slurm gave its job, rewrites it when its profile changes phase, and
removes it at exit. `SimGpuBackend` then reports that load, with this process's real pid,
exactly where NVML would.

A profile is a list of phases, each `(kind, seconds)` in the one grammar of
`slurm_aigc.profiles`; the last phase lasts until the run ends, unless the profile repeats.
`phase_at` is the pure core and is unit-tested.

With `work_conserving`, busy phases measure work, not wall time: when the processes on a
GPU ask for more than 100 % SM in all, each gets its share and its busy phase lasts longer
(`progress_rate`), as kernels sharing a real GPU slow each other down. Without it a packed
job would finish its work on time at any contention, and the excess would simply vanish.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from slurm_aigc.errors import AigcError
from slurm_aigc.profiles import Phase, ProfileError, parse_phases
from slurm_aigc.telemetry.procfs import ProcFs
from slurm_aigc.telemetry.simgpu import (
    GpuLoad,
    OutOfMemory,
    ProcLoad,
    alloc_lock,
    memory_shortfall,
    proc_file,
    read_inventory,
    write_proc_load,
)
from slurm_aigc.units import MIB_PER_GIB

LOG = logging.getLogger(__name__)



@dataclass(frozen=True)
class PhaseLevel:
    """What a phase kind does: SM util (None: the `--util` value), memory share, power factor."""

    util_pct: float | None
    mem_share: float  # of `--mem`
    power_factor: float


# Why these numbers: "loading" reads weights (memory full, little compute, cool);
# "hung" is a spinning kernel or NCCL wait: 100 % util at near-idle power.
PHASE_LEVELS: Mapping[str, PhaseLevel] = {
    "loading": PhaseLevel(3.0, 1.0, 0.3),
    "busy": PhaseLevel(None, 1.0, 1.0),
    "idle": PhaseLevel(0.0, 1.0, 1.0),
    "hung": PhaseLevel(100.0, 1.0, 0.15),
}
FOREVER = math.inf  # a built-in phase that lasts until the run ends


@dataclass(frozen=True)
class Profile:
    """A named sequence of phases; `first_gpu_only` models a job using one of its GPUs."""

    name: str
    phases: tuple[Phase, ...]
    repeat: bool = False
    first_gpu_only: bool = False


PROFILES: Mapping[str, Profile] = {
    "loading": Profile("loading", (Phase("loading", FOREVER),)),
    "busy": Profile("busy", (Phase("busy", FOREVER),)),
    "idle": Profile("idle", (Phase("idle", FOREVER),)),
    "bursty": Profile("bursty", (Phase("busy", 20.0), Phase("idle", 40.0)), repeat=True),
    "hung": Profile("hung", (Phase("hung", FOREVER),)),
    "idle-tail": Profile("idle-tail", (Phase("loading", 20.0), Phase("busy", 60.0), Phase("idle", FOREVER))),
    "over-allocated": Profile("over-allocated", (Phase("busy", FOREVER),), first_gpu_only=True),
}


def parse_profile_spec(spec: str) -> Profile:
    """`"loading:30,busy:120,idle:60"` -> Profile; a final `repeat` item cycles the phases."""
    phases, repeat = parse_phases(spec)
    if not phases:
        raise ProfileError(f"empty profile spec {spec!r}")
    return Profile(spec, phases, repeat=repeat)


def _phase_index(profile: Profile, t_seconds: float) -> tuple[int, float]:
    """(index of the phase running at t, t at which it ends or inf)."""
    total = sum(p.seconds for p in profile.phases)
    if profile.repeat and total > 0:
        cycle_start = (t_seconds // total) * total
        local = t_seconds - cycle_start
    else:
        cycle_start, local = 0.0, t_seconds
    start = 0.0
    for index, phase in enumerate(profile.phases):
        is_last = index == len(profile.phases) - 1
        if math.isinf(phase.seconds) or (is_last and not profile.repeat):
            return index, float("inf")
        if local < start + phase.seconds:
            return index, cycle_start + start + phase.seconds
        start += phase.seconds
    return len(profile.phases) - 1, float("inf")


def phase_at(profile: Profile, t_seconds: float, util_pct: float = 85.0, mem_gib: float = 10.0) -> tuple[float, float, float]:
    """(SM util %, memory GiB per GPU, power factor) of `profile` at `t_seconds` after start."""
    index, _ = _phase_index(profile, max(0.0, t_seconds))
    level = PHASE_LEVELS[profile.phases[index].kind]
    util = util_pct if level.util_pct is None else level.util_pct
    return util, mem_gib * level.mem_share, level.power_factor


def next_change_s(profile: Profile, t_seconds: float) -> float:
    """Time (since start) of the next phase boundary after `t_seconds`; inf when none."""
    return _phase_index(profile, max(0.0, t_seconds))[1]


def progress_rate(own: ProcLoad, live: Iterable[ProcLoad]) -> float:
    """Profile seconds per wall second of `own` in a busy phase, given every live process load.

    Each GPU grants the SM it has (100 %) in proportion to what its processes ask; a process
    spanning several GPUs runs at the pace of its most crowded one (data-parallel steps wait
    for the slowest rank). 1.0 when nothing is oversubscribed.
    """
    asked: dict[int, float] = {}
    for load in live:
        if load.pid == own.pid:
            continue
        for gpu in load.gpus:
            asked[gpu.index] = asked.get(gpu.index, 0.0) + max(0.0, gpu.sm_util_pct)
    rate = 1.0
    for gpu in own.gpus:
        total = asked.get(gpu.index, 0.0) + max(0.0, gpu.sm_util_pct)
        if gpu.sm_util_pct > 0 and total > 100.0:
            rate = min(rate, 100.0 / total)
    return rate


# --------------------------------------------------------------------------- environment


def job_gpu_indices(env: Mapping[str, str], uuid_to_index: Mapping[str, int] | None = None) -> list[int]:
    """The GPUs Slurm gave this process, as NVML indices on the node.

    `SLURM_STEP_GPUS` (srun steps) then `SLURM_JOB_GPUS` (batch step) hold the node's
    indices even when cgroup `ConstrainDevices=yes` renumbers `CUDA_VISIBLE_DEVICES` from
    0, so they win; `CUDA_VISIBLE_DEVICES` is the fallback (shard jobs get only that one).
    UUID entries (`GPU-...`) are mapped through `uuid_to_index`.
    """
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name, "").strip()
        if value and value not in ("NoDevFiles", "-1"):
            return _indices(value, name, uuid_to_index or {})
    return []


def _indices(value: str, name: str, uuid_to_index: Mapping[str, int]) -> list[int]:
    indices = []
    for token in (t.strip() for t in value.split(",") if t.strip()):
        if token.isdigit():
            indices.append(int(token))
        elif token in uuid_to_index:
            indices.append(uuid_to_index[token])
        else:
            raise ProfileError(f"{name}={value!r}: cannot map {token!r} to a GPU index")
    return indices


def node_name(env: Mapping[str, str]) -> str:
    """`SLURMD_NODENAME` (set by slurmd in every job), else the short host name."""
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


# --------------------------------------------------------------------------- the run loop


@dataclass(frozen=True)
class LoadPlan:
    """Everything `run_load` needs, resolved from options and environment."""

    node: str
    gpus: tuple[int, ...]
    profile: Profile
    util_pct: float
    mem_gib: float
    power_factor: float  # multiplies each phase's own factor
    seconds: float  # 0: until killed; profile seconds (busy ones stretch when work_conserving)
    job_id: str | None
    work_conserving: bool = False


def make_plan(
    env: Mapping[str, str],
    simgpu_dir: Path,
    profile: Profile,
    util_pct: float,
    mem_gib: float,
    power_factor: float,
    seconds: float,
    gpus: tuple[int, ...] | None = None,
    work_conserving: bool = False,
) -> LoadPlan:
    """Resolve node and GPUs from the job's environment (or the explicit `gpus`)."""
    node = node_name(env)
    if gpus is None:
        gpus = tuple(job_gpu_indices(env, _uuid_map(simgpu_dir, node)))
    if not gpus:
        raise ProfileError("no GPUs: none of SLURM_STEP_GPUS, SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES is set (use --gpus)")
    return LoadPlan(node, gpus, profile, util_pct, mem_gib, power_factor, seconds, env.get("SLURM_JOB_ID"),
                    work_conserving)


def _uuid_map(simgpu_dir: Path, node: str) -> dict[str, int]:
    try:
        _, gpus, _ = read_inventory(simgpu_dir, node)
    except Exception:  # noqa: BLE001 - no inventory just means no UUID mapping
        return {}
    return {gpu.uuid: gpu.index for gpu in gpus}


def load_at(plan: LoadPlan, pid: int, t_seconds: float, start_ticks: int | None) -> ProcLoad:
    """The process file contents for `plan` at `t_seconds`."""
    util, mem_gib, factor = phase_at(plan.profile, t_seconds, plan.util_pct, plan.mem_gib)
    index, _ = _phase_index(plan.profile, t_seconds)
    used = plan.gpus[:1] if plan.profile.first_gpu_only else plan.gpus
    loads = tuple(GpuLoad(g, util, mem_gib * MIB_PER_GIB, factor * plan.power_factor) for g in used)
    return ProcLoad(pid, loads, plan.profile.phases[index].kind, plan.job_id, start_ticks)


class GpuOutOfMemory(AigcError):
    """The load asked more GPU memory than its GPU had free: the job fails, as with a real CUDA OOM."""

    def __init__(self, node: str, short: OutOfMemory) -> None:
        super().__init__(
            f"CUDA out of memory (simulated): tried to allocate {short.asked_mib / MIB_PER_GIB:.1f} GiB on GPU "
            f"{short.gpu_index} of {node} ({short.total_mib / MIB_PER_GIB:.1f} GiB total, "
            f"{short.free_mib / MIB_PER_GIB:.1f} GiB free)")
        self.short = short


def memory_grows(load: ProcLoad, last: ProcLoad | None) -> bool:
    """Whether `load` holds more memory than `last` on any GPU (the moment an allocation can fail)."""
    before = {g.index: g.memory_used_mib for g in last.gpus} if last is not None else {}
    return any(g.memory_used_mib > before.get(g.index, 0.0) for g in load.gpus)


# How often a work-conserving busy phase re-reads its GPUs' crowd (others start and stop).
CONTENTION_POLL_S = 2.0


class LoadRun:
    """Runs a plan: writes the process file at each phase change, removes it at exit.

    Signal handlers only set flags; the loop waits on an Event with the time to the next
    phase change as timeout (SIGTERM/SIGINT end the run, SIGUSR1 logs and continues).
    The profile clock runs with the wall clock, except in work-conserving busy phases,
    where it runs at `progress_rate` of the loads `live_loads` returns.

    With `memory_total_mib` (GPU index -> MiB), a load that takes more memory than its GPUs
    have free beside the other live loads raises GpuOutOfMemory instead of being written:
    the check and the write happen under the node's `alloc.lock`.
    """

    def __init__(
        self,
        plan: LoadPlan,
        simgpu_dir: Path,
        clock: Callable[[], float],
        pid: int | None = None,
        proc_root: Path = Path("/proc"),
        wait: Callable[[float], object] | None = None,
        live_loads: Callable[[], Sequence[ProcLoad]] | None = None,
        memory_total_mib: Mapping[int, float] | None = None,
    ) -> None:
        self.plan = plan
        self.live_loads = live_loads
        self.memory_total_mib = memory_total_mib
        self.simgpu_dir = simgpu_dir
        self.clock = clock
        self.pid = os.getpid() if pid is None else pid
        self.start_ticks = ProcFs(proc_root).start_ticks(self.pid)
        self.stop = threading.Event()
        self.checkpoints = 0
        # Tests pass a wait that advances a fake clock; in production it is the stop Event.
        self._wait = wait or self.stop.wait

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the run; SIGUSR1 is a checkpoint request (logged, run goes on)."""
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_checkpoint)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        LOG.info("gpu-load: signal %d, stopping", signum)
        self.stop.set()

    def _on_checkpoint(self, signum: int, frame: FrameType | None) -> None:
        self.checkpoints += 1
        LOG.warning("gpu-load: checkpoint requested (SIGUSR1); continuing")

    def run(self) -> None:
        """Until `seconds` of profile pass (0: forever) or a stop signal; always removes the file."""
        wall = self.clock()
        t, rate = 0.0, 1.0
        last: ProcLoad | None = None
        try:
            while not self.stop.is_set():
                now = self.clock()
                t += (now - wall) * rate
                wall = now
                if self.plan.seconds > 0 and t >= self.plan.seconds:
                    break
                load = load_at(self.plan, self.pid, t, self.start_ticks)
                if load != last:
                    self._write(load, last)
                    LOG.info("gpu-load: phase %s on GPUs %s", load.phase, [g.index for g in load.gpus])
                    last = load
                rate = self._rate(load)
                self._wait(self._wait_s(t, rate, load))
        finally:
            self._remove_file()

    def _write(self, load: ProcLoad, last: ProcLoad | None) -> None:
        if self.memory_total_mib is None or not memory_grows(load, last):
            write_proc_load(self.simgpu_dir, self.plan.node, load)
            return
        with alloc_lock(self.simgpu_dir, self.plan.node):
            others = self.live_loads() if self.live_loads is not None else ()
            short = memory_shortfall(load, others, self.memory_total_mib)
            if short is not None:
                raise GpuOutOfMemory(self.plan.node, short)
            write_proc_load(self.simgpu_dir, self.plan.node, load)

    def _conserves_work(self, load: ProcLoad) -> bool:
        return self.plan.work_conserving and self.live_loads is not None and load.phase == "busy"

    def _rate(self, load: ProcLoad) -> float:
        if not self._conserves_work(load) or self.live_loads is None:
            return 1.0
        return progress_rate(load, self.live_loads())

    def _wait_s(self, t: float, rate: float, load: ProcLoad) -> float:
        wake = next_change_s(self.plan.profile, t)
        if self.plan.seconds > 0:
            wake = min(wake, self.plan.seconds)
        # A bounded wait keeps the loop responsive if the clock jumps; 60 s is plenty.
        bound = CONTENTION_POLL_S if self._conserves_work(load) else 60.0
        return max(0.01, min((wake - t) / rate, bound))

    def _remove_file(self) -> None:
        try:
            proc_file(self.simgpu_dir, self.plan.node, self.pid).unlink()
        except FileNotFoundError:
            pass
