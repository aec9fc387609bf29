"""Simulated GPUs: the same `GpuBackend` interface as NVML, driven by files jobs write.

Layout under the simgpu directory (`default_simgpu_dir()`: `$SLURM_AIGC_SIMGPU_DIR`, else
the policy model's `DEFAULT_SIMGPU_DIR`), one folder per node:

- `<node>/inventory.json`: the node's GPUs and its `nvidia-smi topo -m` text, written by
  the local cluster through `write_inventory` (format in docs/architecture.md).
- `<node>/alloc.lock`: held while a `gpu-load` checks that its memory fits beside the others
  and writes its process file, so two jobs starting together cannot both take the last GiB.
- `<node>/procs/<pid>.json`: what process `pid` does to which GPUs, written by
  `slurm-aigc gpu-load` inside a job (`write_proc_load`), removed when it exits. A file
  whose process is gone (or whose pid was reused: the start time differs) is ignored
  and removed on the next read, so a `kill -9` leaves no ghost load.

Per GPU the backend sums its processes: memory (capped at the GPU's total), SM
utilization (capped at 100 %), and power = idle + (limit - idle) * min(1, sum of
util/100 * power_factor), so a "hung" process (100 % util, power factor 0.15) reads as
busy yet cool, as a spinning kernel does on real hardware.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from slurm_aigc.errors import AigcError
from slurm_aigc.fsio import atomic_write_text
from slurm_aigc.policy.model import DEFAULT_SIMGPU_DIR
from slurm_aigc.policy.paths import simgpu_dir_from_env
from slurm_aigc.telemetry.procfs import ProcFs
from slurm_aigc.telemetry.records import (
    GpuProcess,
    GpuReading,
    NodeReading,
    NvLinkState,
    utc_now,
)

LOG = logging.getLogger(__name__)

SIM_DRIVER_VERSION = "sim-550.54.15"
_MEM_BW_PER_UTIL = 0.6  # simulated memory-bandwidth utilization per % of SM utilization
_NVLINKS_PER_GPU = 12  # A100 SXM4: 12 NVLink 3 links, matching the NV12 of sim_topology_text


class SimGpuError(AigcError):
    """The simulated-GPU inventory of a node is missing or malformed."""


def default_simgpu_dir() -> Path:
    """`$SLURM_AIGC_SIMGPU_DIR`, else the policy's default `agent.simgpu_dir` (for every user: one default)."""
    return Path(simgpu_dir_from_env() or DEFAULT_SIMGPU_DIR)


# --------------------------------------------------------------------------- inventory


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU as listed in `inventory.json`."""

    index: int
    uuid: str
    name: str
    memory_total_mib: float
    power_limit_w: float
    idle_power_w: float
    nvlink_peers: tuple[int, ...] = ()
    lost: bool = False  # simulate a GPU that fell off the bus (`nvidia-smi` shows "GPU is lost")


@dataclass(frozen=True)
class SimGpuModel:
    """Static numbers of a GPU model, from its data sheet."""

    name: str
    memory_total_mib: float
    power_limit_w: float
    idle_power_w: float


SIM_GPU_MODELS: Mapping[str, SimGpuModel] = {
    "a100": SimGpuModel("NVIDIA A100-SXM4-80GB", 81920, 400.0, 55.0),
    "h100": SimGpuModel("NVIDIA H100 80GB HBM3", 81559, 700.0, 70.0),
    "l40s": SimGpuModel("NVIDIA L40S", 46068, 350.0, 35.0),
    "t4": SimGpuModel("Tesla T4", 15360, 70.0, 10.0),
}


def sim_gpus(node: str, model: str, count: int, nvlink: bool) -> list[SimGpu]:
    """`count` GPUs of `model` (a key of SIM_GPU_MODELS) with stable UUIDs derived from node+index."""
    spec = SIM_GPU_MODELS[model]
    gpus = []
    for index in range(count):
        peers = tuple(i for i in range(count) if i != index) if nvlink else ()
        gpu_uuid = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}.slurm-aigc')}"
        gpus.append(SimGpu(index, gpu_uuid, spec.name, spec.memory_total_mib, spec.power_limit_w, spec.idle_power_w, peers))
    return gpus


def write_inventory(
    simgpu_dir: Path,
    node: str,
    gpus: Sequence[SimGpu],
    topology_text: str,
    driver_version: str = SIM_DRIVER_VERSION,
) -> Path:
    """Write `<simgpu>/<node>/inventory.json` (atomically), a world-writable `procs/` and `alloc.lock`.

    `procs/` is mode 1777 (like /tmp) because `gpu-load` runs as the job's user. The lock
    file is 0644: flock needs only a read-only descriptor, and a file the writer owns outside
    the sticky folder cannot be swapped by a job.
    """
    node_dir = Path(simgpu_dir) / node
    procs = node_dir / "procs"
    procs.mkdir(parents=True, exist_ok=True)
    os.chmod(procs, 0o1777)  # noqa: S103 - sticky and world-writable like /tmp: jobs of every user write here
    (node_dir / ALLOC_LOCK).touch(mode=0o644, exist_ok=True)
    document = {
        "node": node,
        "driver_version": driver_version,
        "gpus": [_gpu_json(gpu) for gpu in gpus],
        "topology": topology_text,
    }
    path = node_dir / "inventory.json"
    atomic_write_json(path, document)
    return path


def _gpu_json(gpu: SimGpu) -> dict[str, Any]:
    data = asdict(gpu)
    data["nvlink_peers"] = list(gpu.nvlink_peers)
    if not gpu.lost:
        del data["lost"]
    return data


def atomic_write_json(path: Path, document: Mapping[str, Any], mode: int = 0o644) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    atomic_write_text(path, json.dumps(document, indent=1, sort_keys=True) + "\n", mode=mode)


def read_inventory(simgpu_dir: Path, node: str) -> tuple[str, list[SimGpu], str | None]:
    """(driver_version, gpus, topology text) of `<simgpu>/<node>/inventory.json`."""
    path = Path(simgpu_dir) / node / "inventory.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        gpus = [_gpu_from_json(entry) for entry in document["gpus"]]
        return str(document.get("driver_version", SIM_DRIVER_VERSION)), gpus, document.get("topology")
    except FileNotFoundError:
        raise SimGpuError(f"{path}: no simulated-GPU inventory for node {node}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise SimGpuError(f"{path}: malformed inventory: {error}") from None


def _gpu_from_json(entry: Mapping[str, Any]) -> SimGpu:
    return SimGpu(
        index=int(entry["index"]),
        uuid=str(entry["uuid"]),
        name=str(entry["name"]),
        memory_total_mib=float(entry["memory_total_mib"]),
        power_limit_w=float(entry["power_limit_w"]),
        idle_power_w=float(entry["idle_power_w"]),
        nvlink_peers=tuple(int(p) for p in entry.get("nvlink_peers", ())),
        lost=bool(entry.get("lost", False)),
    )


# --------------------------------------------------------------------------- process files


@dataclass(frozen=True)
class GpuLoad:
    """What one process does to one GPU."""

    index: int
    sm_util_pct: float
    memory_used_mib: float
    power_factor: float = 1.0


@dataclass(frozen=True)
class ProcLoad:
    """Contents of `procs/<pid>.json`: a process's load on its GPUs, as gpu-load declares it."""

    pid: int
    gpus: tuple[GpuLoad, ...]
    phase: str = ""
    job_id: str | None = None
    start_ticks: int | None = None  # field 22 of /proc/<pid>/stat: tells a reused pid apart
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)


ALLOC_LOCK = "alloc.lock"


@contextlib.contextmanager
def alloc_lock(simgpu_dir: Path, node: str) -> Iterator[None]:
    """Hold the node's `alloc.lock` (exclusive flock); without the file (old inventory) hold nothing."""
    try:
        fd = os.open(Path(simgpu_dir) / node / ALLOC_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


@dataclass(frozen=True)
class OutOfMemory:
    """Why a load does not fit: the GPU, what the process asks, what the others leave free."""

    gpu_index: int
    asked_mib: float
    free_mib: float
    total_mib: float


def memory_shortfall(load: ProcLoad, others: Iterable[ProcLoad], total_mib: Mapping[int, float]) -> OutOfMemory | None:
    """The first of `load`'s GPUs where it asks more memory than the other processes leave, or None.

    As on a real GPU, where cudaMalloc fails once the card's memory is taken: Slurm (and a
    shard) reserves no memory, so a job larger than its GPU, or than what its neighbours
    left, cannot start its work. GPUs missing from `total_mib` are not checked.
    """
    used: dict[int, float] = {}
    for other in others:
        if other.pid == load.pid:
            continue
        for gpu in other.gpus:
            used[gpu.index] = used.get(gpu.index, 0.0) + gpu.memory_used_mib
    for gpu in load.gpus:
        total = total_mib.get(gpu.index)
        if total is None:
            continue
        free = max(0.0, total - used.get(gpu.index, 0.0))
        if gpu.memory_used_mib > free:
            return OutOfMemory(gpu.index, gpu.memory_used_mib, free, total)
    return None


def proc_file(simgpu_dir: Path, node: str, pid: int) -> Path:
    """`<simgpu>/<node>/procs/<pid>.json`."""
    return Path(simgpu_dir) / node / "procs" / f"{pid}.json"


def write_proc_load(simgpu_dir: Path, node: str, load: ProcLoad) -> Path:
    """Atomically write (or replace) the process file of `load.pid`."""
    path = proc_file(simgpu_dir, node, load.pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "pid": load.pid,
        "phase": load.phase,
        "job_id": load.job_id,
        "start_ticks": load.start_ticks,
        "gpus": [asdict(gpu) for gpu in load.gpus],
    }
    atomic_write_json(path, document)
    return path


def parse_proc_load(text: str) -> ProcLoad:
    """Parse a process file; raises ValueError/KeyError/TypeError when malformed."""
    document = json.loads(text)
    gpus = tuple(
        GpuLoad(int(g["index"]), float(g["sm_util_pct"]), float(g["memory_used_mib"]), float(g.get("power_factor", 1.0)))
        for g in document["gpus"]
    )
    ticks = document.get("start_ticks")
    job_id = document.get("job_id")
    return ProcLoad(
        pid=int(document["pid"]),
        gpus=gpus,
        phase=str(document.get("phase", "")),
        job_id=None if job_id is None else str(job_id),
        start_ticks=None if ticks is None else int(ticks),
    )


# --------------------------------------------------------------------------- backend


class SimGpuBackend:
    """`GpuBackend` for the local cluster: inventory + live process files -> NodeReading."""

    def __init__(
        self,
        node: str,
        simgpu_dir: Path | None = None,
        clock: Callable[[], datetime] = utc_now,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.node = node
        self.simgpu_dir = Path(simgpu_dir) if simgpu_dir is not None else default_simgpu_dir()
        self.clock = clock
        self.proc_root = Path(proc_root)

    def read(self) -> NodeReading:
        """One poll: like `nvidia-smi --query-gpu=... --query-compute-apps=...` on a real node."""
        driver, gpus, _ = read_inventory(self.simgpu_dir, self.node)
        loads = self.live_loads()
        readings = tuple(_reading(gpu, loads) for gpu in gpus)
        return NodeReading(node=self.node, ts=self.clock(), driver_version=driver, gpus=readings)

    def topology_text(self) -> str | None:
        """The inventory's `topology` (what `nvidia-smi topo -m` would print there)."""
        return read_inventory(self.simgpu_dir, self.node)[2]

    def close(self) -> None:
        """Nothing to release."""

    def live_loads(self) -> list[ProcLoad]:
        """Process files whose process still runs; stale or malformed ones are removed."""
        procs = self.simgpu_dir / self.node / "procs"
        loads = []
        for path in sorted(procs.glob("*.json")) if procs.is_dir() else []:
            load = self._load_if_alive(path)
            if load is not None:
                loads.append(load)
        return loads

    def _load_if_alive(self, path: Path) -> ProcLoad | None:
        try:
            load = parse_proc_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None  # its process removed it between glob and read
        except (ValueError, KeyError, TypeError) as error:
            LOG.warning("ignoring malformed process file %s: %s", path, error)
            return None
        ticks = ProcFs(self.proc_root).start_ticks(load.pid)
        if ticks is None or (load.start_ticks is not None and ticks != load.start_ticks):
            LOG.info("removing process file %s: pid %d is gone", path, load.pid)
            _unlink_quietly(path)
            return None
        return load


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError as error:
        LOG.debug("could not remove %s: %s", path, error)


def _reading(gpu: SimGpu, loads: Iterable[ProcLoad]) -> GpuReading:
    if gpu.lost:
        return GpuReading(index=gpu.index, uuid=gpu.uuid, name=gpu.name, lost=True, error="GPU is lost (simulated)")
    mine = [(load.pid, g) for load in loads for g in load.gpus if g.index == gpu.index]
    util = min(100.0, sum((g.sm_util_pct for _, g in mine), 0.0))
    busy = min(1.0, sum((g.sm_util_pct / 100.0 * g.power_factor for _, g in mine), 0.0))
    power = gpu.idle_power_w + (gpu.power_limit_w - gpu.idle_power_w) * busy
    return GpuReading(
        index=gpu.index,
        uuid=gpu.uuid,
        name=gpu.name,
        memory_total_mib=gpu.memory_total_mib,
        memory_used_mib=min(gpu.memory_total_mib, sum((g.memory_used_mib for _, g in mine), 0.0)),
        sm_util_pct=util,
        mem_bw_util_pct=min(100.0, util * _MEM_BW_PER_UTIL),
        power_draw_w=round(power, 1),
        power_limit_w=gpu.power_limit_w,
        temperature_c=round(30.0 + 45.0 * busy, 1),
        processes=tuple(GpuProcess(pid, g.memory_used_mib, g.sm_util_pct) for pid, g in mine),
        nvlink=tuple(NvLinkState(link, True) for link in range(_NVLINKS_PER_GPU)) if gpu.nvlink_peers else (),
    )


# --------------------------------------------------------------------------- topology text


def sim_topology_text(n_gpus: int, nvlink: bool, n_cpus: int = 32) -> str:
    """A `nvidia-smi topo -m` text (tab-separated, driver 5xx layout) for a simulated node.

    With `nvlink` every GPU pair is NV12 (an NVSwitch board); without, the first half of
    the GPUs sits on NUMA node 0 and the rest on node 1: PIX within a half, SYS across.
    """
    half = max(1, (n_gpus + 1) // 2)
    cpus_per_node = max(1, n_cpus // 2)

    def numa(i: int) -> int:
        return 0 if i < half else 1

    def code(a: int, b: int) -> str:
        if a == b:
            return " X "
        if nvlink:
            return "NV12"
        return "PIX" if numa(a) == numa(b) else "SYS"

    names = [f"GPU{i}" for i in range(n_gpus)]
    lines = ["\t" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for a in range(n_gpus):
        first = numa(a) * cpus_per_node
        cells = [code(a, b) for b in range(n_gpus)]
        lines.append("\t".join([names[a], *cells, f"{first}-{first + cpus_per_node - 1}", str(numa(a)), "", "N/A"]))
    return "\n".join(lines) + "\n" + _LEGEND


_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

