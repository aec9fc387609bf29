"""Named fake machines for tests and benchmarks: a `pynvml` look-alike driven by plain data.

After go-nvml's `mock/dgxa100` and gpustat's tests: a machine is built by name
(`dgx_a100()`, `pcie_l40s_x4()`, `dgx_a100_mig()`), and driver quirks are named too
(`gpu_lost_mid_poll()`, `field_unsupported()`, `no_driver()`, `old_bindings()`). `FakeNvml` exposes the
functions and constants `NvmlBackend` uses, and raises the real `pynvml.NVMLError`
subclasses, so the backend's error handling is exercised exactly as on hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pynvml

from slurm_aigc.telemetry.simgpu import sim_topology_text

MIB = 1024 * 1024


@dataclass(frozen=True)
class FakeProcess:
    """A compute process as `nvmlDeviceGetComputeRunningProcesses` lists it."""

    pid: int
    used_memory_mib: float | None
    sm_util_pct: float | None = None  # None: no `nvmlDeviceGetProcessUtilization` sample


@dataclass(frozen=True)
class FakeGpu:
    """One GPU's answers. `errors` maps an NVML function name to the error code it raises."""

    index: int
    name: str
    memory_total_mib: float
    memory_used_mib: float = 0.0
    sm_util_pct: float = 0.0
    mem_bw_util_pct: float = 0.0
    power_draw_w: float = 50.0
    power_limit_w: float = 400.0
    temperature_c: float = 35.0
    processes: tuple[FakeProcess, ...] = ()
    nvlinks_active: tuple[bool, ...] = ()  # one per supported link; past them NOT_SUPPORTED
    errors: dict[str, int] = field(default_factory=dict, hash=False)
    # `nvmlDeviceGetMigMode` -> [current, pending]; None: a GPU without MIG (NOT_SUPPORTED).
    mig_mode: tuple[int, int] | None = None

    @property
    def uuid(self) -> str:
        return f"GPU-fake0000-0000-0000-0000-{self.index:012d}"

    @property
    def mig(self) -> bool:
        return self.mig_mode is not None and self.mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE


@dataclass(frozen=True)
class FakeMachine:
    """A whole node: driver version, GPUs, `topo -m` text, an optional nvmlInit error."""

    name: str
    gpus: tuple[FakeGpu, ...]
    driver_version: str = "550.54.15"
    topology: str | None = None
    init_error: int | None = None
    missing_functions: frozenset[str] = frozenset()


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """Stands in for the `pynvml` module; pass it as `NvmlBackend(node, nvml=FakeNvml(m))`."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE

    def __init__(self, machine: FakeMachine) -> None:
        self.machine = machine
        self.initialized = False
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        # A function the installed bindings lack must look absent, as on old nvidia-ml-py.
        if name.startswith("nvml") and name in object.__getattribute__(self, "machine").missing_functions:
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # -- life cycle
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.machine.init_error is not None:
            raise _error(self.machine.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.shutdown_calls += 1
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.machine.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.machine.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check_init()
        if not 0 <= index < len(self.machine.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.machine.gpus[index]
        self._maybe_fail(gpu, "nvmlDeviceGetHandleByIndex")
        return gpu

    # -- per device
    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        self._maybe_fail(gpu, "nvmlDeviceGetUUID")
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        self._maybe_fail(gpu, "nvmlDeviceGetName")
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> SimpleNamespace:
        self._maybe_fail(gpu, "nvmlDeviceGetMemoryInfo")
        total, used = int(gpu.memory_total_mib * MIB), int(gpu.memory_used_mib * MIB)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        self._maybe_fail(gpu, "nvmlDeviceGetMigMode")
        if gpu.mig_mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(gpu.mig_mode)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> SimpleNamespace:
        self._maybe_fail(gpu, "nvmlDeviceGetUtilizationRates")
        if gpu.mig:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # the parent of MIG instances has no utilization
        return SimpleNamespace(gpu=int(gpu.sm_util_pct), memory=int(gpu.mem_bw_util_pct))

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._maybe_fail(gpu, "nvmlDeviceGetPowerUsage")
        return int(gpu.power_draw_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        self._maybe_fail(gpu, "nvmlDeviceGetEnforcedPowerLimit")
        return int(gpu.power_limit_w * 1000)

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        self._maybe_fail(gpu, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(gpu.temperature_c)

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        self._maybe_fail(gpu, "nvmlDeviceGetComputeRunningProcesses")
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=None if p.used_memory_mib is None else int(p.used_memory_mib * MIB))
            for p in gpu.processes
        ]

    def nvmlDeviceGetProcessUtilization(self, gpu: FakeGpu, since_us: int) -> list[SimpleNamespace]:
        self._maybe_fail(gpu, "nvmlDeviceGetProcessUtilization")
        if gpu.mig:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        samples = [
            SimpleNamespace(pid=p.pid, timeStamp=1_000_000 + i, smUtil=int(p.sm_util_pct), memUtil=0, encUtil=0, decUtil=0)
            for i, p in enumerate(gpu.processes)
            if p.sm_util_pct is not None
        ]
        if not samples:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)  # what NVML says for "no samples in the window"
        return samples

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        self._maybe_fail(gpu, "nvmlDeviceGetNvLinkState")
        if link >= len(gpu.nvlinks_active):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(pynvml.NVML_FEATURE_ENABLED if gpu.nvlinks_active[link] else pynvml.NVML_FEATURE_DISABLED)

    # -- helpers
    def _check_init(self) -> None:
        if not self.initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _maybe_fail(self, gpu: FakeGpu, function: str) -> None:
        self._check_init()
        self.calls.append(function)
        if function in gpu.errors:
            raise _error(gpu.errors[function])


# --------------------------------------------------------------------------- named machines


_MIG_OFF = (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE)
_MIG_ON = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)


def dgx_a100() -> FakeMachine:
    """A DGX A100: 8x A100-SXM4-80GB on NVSwitch (12 NVLinks each, MIG mode off), two jobs running."""
    gpus = [
        FakeGpu(i, "NVIDIA A100-SXM4-80GB", 81920, power_draw_w=60.0, power_limit_w=400.0, nvlinks_active=(True,) * 12,
                mig_mode=_MIG_OFF)
        for i in range(8)
    ]
    gpus[0] = replace(
        gpus[0], memory_used_mib=30720, sm_util_pct=85, mem_bw_util_pct=40, power_draw_w=310.0, temperature_c=61,
        processes=(FakeProcess(4242, 30720, 85),),
    )
    gpus[1] = replace(
        gpus[1], memory_used_mib=20480, sm_util_pct=90, mem_bw_util_pct=55, power_draw_w=330.0, temperature_c=63,
        processes=(FakeProcess(5001, 12288, 60), FakeProcess(5002, 8192, 30)),
    )
    return FakeMachine("dgx_a100", tuple(gpus), topology=sim_topology_text(8, nvlink=True, n_cpus=256))


def pcie_l40s_x4() -> FakeMachine:
    """A PCIe box: 4x L40S, no NVLink (NVLink state NOT_SUPPORTED), one idle job holding memory."""
    gpus = [FakeGpu(i, "NVIDIA L40S", 46068, power_draw_w=35.0, power_limit_w=350.0) for i in range(4)]
    gpus[2] = replace(gpus[2], memory_used_mib=9000, processes=(FakeProcess(777, 9000, None),))
    return FakeMachine("pcie_l40s_x4", tuple(gpus), driver_version="535.183.01", topology=sim_topology_text(4, nvlink=False))


def dgx_a100_mig(mig_gpus: tuple[int, ...] = (0, 1, 2, 3)) -> FakeMachine:
    """A DGX A100 with `mig_gpus` in MIG mode and the others whole.

    NVML answers for a MIG GPU's parent handle as on hardware: utilization NOT_SUPPORTED,
    memory used summed over its instances, the processes of every instance listed (what a
    privileged caller sees). GPU 0 runs pids 6001 (9 GiB) and 6002 (30 GiB) on two of its
    instances; GPU 4 (whole) runs pid 4242 busy; the other whole GPUs are idle.
    """
    base = dgx_a100()
    idle, busy = base.gpus[2], base.gpus[0]
    gpus = [replace(idle, index=i) for i in range(8)]
    gpus[0] = replace(idle, index=0, memory_used_mib=39936, power_draw_w=180.0,
                      processes=(FakeProcess(6001, 9216, 40), FakeProcess(6002, 30720, 0)))
    gpus[4] = replace(busy, index=4)
    gpus = [replace(gpu, mig_mode=_MIG_ON) if gpu.index in mig_gpus else gpu for gpu in gpus]
    return replace(base, name="dgx_a100_mig", gpus=tuple(gpus))


def gpu_lost_mid_poll(lost_index: int = 3) -> FakeMachine:
    """A DGX A100 whose GPU `lost_index` answers its handle and UUID, then says GPU_IS_LOST."""
    machine = dgx_a100()
    gpus = list(machine.gpus)
    gpus[lost_index] = replace(gpus[lost_index], errors={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST})
    return replace(machine, name="gpu_lost_mid_poll", gpus=tuple(gpus))


def field_unsupported() -> FakeMachine:
    """A PCIe box whose driver does not support power draw and denies the power limit."""
    machine = pcie_l40s_x4()
    quirks = {
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetEnforcedPowerLimit": pynvml.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetProcessUtilization": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
    gpus = [replace(gpu, errors=dict(quirks)) for gpu in machine.gpus]
    # Two processes on GPU 2, so the poll asks for per-process utilization (and meets the quirk).
    gpus[2] = replace(gpus[2], processes=(*gpus[2].processes, FakeProcess(778, 0, None)))
    return replace(machine, name="field_unsupported", gpus=tuple(gpus))


def old_bindings() -> FakeMachine:
    """A DGX A100 read through an nvidia-ml-py that lacks `nvmlDeviceGetProcessUtilization`."""
    return replace(dgx_a100(), name="old_bindings", missing_functions=frozenset({"nvmlDeviceGetProcessUtilization"}))


def no_driver() -> FakeMachine:
    """A machine where `nvmlInit` fails: the NVIDIA kernel driver is not loaded."""
    return FakeMachine("no_driver", (), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


def smi_runner(machine: FakeMachine) -> Any:
    """A `nvidia-smi` runner answering `topo -m` with the machine's topology text."""

    def run(argv: Any) -> str:
        if list(argv) != ["nvidia-smi", "topo", "-m"] or machine.topology is None:
            raise AssertionError(f"unexpected nvidia-smi call {argv!r}")
        return machine.topology

    return run


# Every named machine, for a caller that picks one by name (tests/fakes/pynvml_stub/pynvml.py).
MACHINES = {fake.__name__: fake for fake in (dgx_a100, pcie_l40s_x4, dgx_a100_mig, gpu_lost_mid_poll,
                                             field_unsupported, old_bindings, no_driver)}
