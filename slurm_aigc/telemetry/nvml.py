"""The NVML backend: the only module that talks to nvidia-ml-py (`pynvml`).

Shaped after nvitop's `libnvml`: NVML is initialised lazily (on `start()` or the first
`read()`) and shut down at exit; one query helper turns "not supported", "no permission"
and "function not found" into `None` for that field only (a missing symbol is logged
once); any other NVML error while reading a GPU turns that GPU's record into
`lost=True` with the error, and the poll goes on with the next GPU. Per-process SM,
temperature and NVLink state are extras the record can do without: an error there that
does not say the GPU (or the session) is gone makes only that field unavailable (None,
or no NVLinks), logged once per GPU, function and error. A missing library or driver is
`NvmlUnavailableError` at start-up, never a per-poll error.

A GPU in MIG mode (`nvmlDeviceGetMigMode`, current mode enabled; A100/H100/H200) is read
as a device only: name, UUID, memory total, power, temperature and NVLinks. Its instances
are handed to different jobs (gres.conf `AutoDetect=nvml` makes each one a Slurm GPU),
while NVML on the parent handle says nothing per instance: utilization is NOT_SUPPORTED,
memory used sums every instance, and processes are listed for all instances or for none,
depending on the caller's privileges. None of it is one job's use, so the record says
`mig=True` and leaves utilization, memory used and processes unread (None, ()): reclaim and
the memory guard then have nothing to judge on that GPU. Logged once per GPU.

The `pynvml` module is a constructor argument so tests drive this code with
`FakeNvml` of tests/fakes/nvml.py, which raises the real `pynvml.NVMLError` classes.
"""

from __future__ import annotations

import atexit
import logging
import subprocess
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from slurm_aigc.errors import NvmlUnavailableError
from slurm_aigc.telemetry.records import (
    GpuProcess,
    GpuReading,
    NodeReading,
    NvLinkState,
    utc_now,
)

LOG = logging.getLogger(__name__)

MIB = 1024 * 1024
_SMI_TIMEOUT_S = 30.0

TextRunner = Callable[[Sequence[str]], str]


def run_nvidia_smi(argv: Sequence[str]) -> str:
    """Run `nvidia-smi ...` (argv, no shell) and return stdout; NvmlUnavailableError on failure."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=_SMI_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise NvmlUnavailableError(f"{argv[0]} not found: is the NVIDIA driver installed?") from None
    except subprocess.TimeoutExpired:
        raise NvmlUnavailableError(f"{' '.join(argv)} timed out after {_SMI_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip()[:300]
        raise NvmlUnavailableError(f"{' '.join(argv)} exited {done.returncode}: {message}")
    return done.stdout


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailableError("nvidia-ml-py (pynvml) is not installed") from None
    return pynvml


class NvmlBackend:
    """`GpuBackend` over NVML (what `nvidia-smi --query-gpu=...` reads)."""

    def __init__(
        self,
        node: str,
        nvml: Any = None,
        clock: Callable[[], datetime] = utc_now,
        smi: TextRunner = run_nvidia_smi,
    ) -> None:
        self.node = node
        self._nvml = nvml
        self._clock = clock
        self._smi = smi
        self._started = False
        self._missing_logged: set[str] = set()
        self._mig_logged: set[str] = set()
        self._unavailable_logged: set[tuple[int, str, int]] = set()
        self._last_sample_us: dict[int, int] = {}

    # -- life cycle

    def start(self) -> None:
        """`nvmlInit()`; NvmlUnavailableError when the library or driver is missing."""
        if self._started:
            return
        if self._nvml is None:
            self._nvml = _import_pynvml()
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as error:
            raise NvmlUnavailableError(f"NVML could not start: {error} (is the NVIDIA driver loaded?)") from None
        self._started = True
        atexit.register(self.close)

    def close(self) -> None:
        """`nvmlShutdown()` once; errors at shutdown are only logged."""
        if not self._started:
            return
        self._started = False
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            LOG.debug("nvmlShutdown: %s", error)

    # -- polling

    def read(self) -> NodeReading:
        """One poll of every GPU; a GPU that fails mid-poll becomes a `lost` record.

        An error of the session itself (the driver reloaded or went away) fails the poll, which
        the daemon loop retries with back-off, and ends the session: the next poll starts a new
        one (`nvmlInit`) instead of asking a dead one forever.
        """
        self.start()
        try:
            driver = self._query("nvmlSystemGetDriverVersion")
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as error:
            self.close()
            raise NvmlUnavailableError(f"NVML session failed ({error}); a new one starts at the next poll") from None
        gpus = tuple(self._read_gpu(index) for index in range(count))
        return NodeReading(node=self.node, ts=self._clock(), driver_version=_text(driver), gpus=gpus)

    def topology_text(self) -> str | None:
        """`nvidia-smi topo -m` of this machine."""
        return self._smi(["nvidia-smi", "topo", "-m"])

    def _read_gpu(self, index: int) -> GpuReading:
        fields: dict[str, Any] = {}
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            self._read_fields(handle, index, fields)
        except self._nvml.NVMLError as error:
            LOG.warning("GPU %d failed mid-poll: %s", index, error)
            kept = {k: v for k, v in fields.items() if k in ("uuid", "name")}
            return GpuReading(index=index, lost=True, error=f"{error} (NVML error {error.value})", **kept)
        return GpuReading(index=index, **fields)

    def _read_fields(self, handle: Any, index: int, fields: dict[str, Any]) -> None:
        nvml = self._nvml
        fields["uuid"] = _text(self._query("nvmlDeviceGetUUID", handle))
        fields["name"] = _text(self._query("nvmlDeviceGetName", handle))
        memory = self._query("nvmlDeviceGetMemoryInfo", handle)
        fields["memory_total_mib"] = None if memory is None else memory.total / MIB
        fields["mig"] = self._mig_enabled(handle)
        if fields["mig"]:
            self._log_mig(index, fields["uuid"])
        else:
            self._read_use(handle, index, memory, fields)
        fields["power_draw_w"] = _milli(self._query("nvmlDeviceGetPowerUsage", handle))
        fields["power_limit_w"] = _milli(self._query("nvmlDeviceGetEnforcedPowerLimit", handle))
        try:
            temperature = self._query("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
        except nvml.NVMLError as error:
            self._field_unavailable(index, "nvmlDeviceGetTemperature", error)
            temperature = None
        fields["temperature_c"] = None if temperature is None else float(temperature)
        fields["nvlink"] = self._nvlinks(handle, index)

    def _read_use(self, handle: Any, index: int, memory: Any, fields: dict[str, Any]) -> None:
        """Memory used, utilization and processes: the fields a job's use is read from."""
        fields["memory_used_mib"] = None if memory is None else memory.used / MIB
        rates = self._query("nvmlDeviceGetUtilizationRates", handle)
        fields["sm_util_pct"] = None if rates is None else float(rates.gpu)
        fields["mem_bw_util_pct"] = None if rates is None else float(rates.memory)
        fields["processes"] = self._processes(handle, index)

    def _mig_enabled(self, handle: Any) -> bool:
        """`nvidia-smi --query-gpu=mig.mode.current`: True when MIG mode is on now (a pending change
        takes a GPU reset). NOT_SUPPORTED (a GPU without MIG) and a function missing from the
        driver or the bindings (both older than MIG) read as not MIG."""
        mode = self._query("nvmlDeviceGetMigMode", handle)  # [current, pending]
        return mode is not None and int(mode[0]) == self._nvml.NVML_DEVICE_MIG_ENABLE

    def _log_mig(self, index: int, uuid: str | None) -> None:
        key = uuid or f"#{index}"
        if key not in self._mig_logged:
            self._mig_logged.add(key)
            LOG.warning(
                "GPU %d (%s) is in MIG mode: its instances are not measured one by one; its utilization, "
                "memory used and processes read as not available, so no job on it is judged idle or over "
                "its memory", index, key)

    def _processes(self, handle: Any, index: int) -> tuple[GpuProcess, ...]:
        """`nvidia-smi --query-compute-apps=pid,used_memory`, plus per-process SM util (`pmon`) where
        several processes share the GPU.

        Per-process SM only splits a shared GPU's utilization between jobs (attribution); a
        process alone on its GPU gets all of it either way. It is also the dearest call of a
        poll: 2.5 of 2.7 ms per GPU on an H200 (benchmarks/bench_real_gpu.py), where every other
        call took 0.02 ms or less. A lone process's SM reads None.
        """
        running = self._query("nvmlDeviceGetComputeRunningProcesses", handle) or []
        sm_util = self._process_sm_util(handle, index) if len(running) > 1 else {}
        return tuple(
            GpuProcess(
                pid=int(p.pid),
                used_memory_mib=None if p.usedGpuMemory is None else p.usedGpuMemory / MIB,
                sm_util_pct=sm_util.get(int(p.pid)),
            )
            for p in running
        )

    def _process_sm_util(self, handle: Any, index: int) -> dict[int, float]:
        # Samples since the previous poll; NOT_FOUND means "no sample in that window". Other
        # errors happen on a healthy GPU too: INSUFFICIENT_SIZE when a process gains a sample
        # between pynvml's sizing call and its fill call.
        since_us = self._last_sample_us.get(index, 0)
        try:
            samples = self._query("nvmlDeviceGetProcessUtilization", handle, since_us) or []
        except self._nvml.NVMLError as error:
            if error.value != self._nvml.NVML_ERROR_NOT_FOUND:
                self._field_unavailable(index, "nvmlDeviceGetProcessUtilization", error)
            return {}
        latest: dict[int, tuple[int, float]] = {}
        for sample in samples:
            if sample.pid not in latest or sample.timeStamp >= latest[sample.pid][0]:
                latest[int(sample.pid)] = (int(sample.timeStamp), float(sample.smUtil))
        if latest:
            self._last_sample_us[index] = max(ts for ts, _ in latest.values())
        return {pid: util for pid, (_, util) in latest.items()}

    def _nvlinks(self, handle: Any, index: int) -> tuple[NvLinkState, ...]:
        """`nvidia-smi nvlink --status`: links 0.. until the first unsupported one; none when a
        link's state cannot be read (a partial list would read as links down)."""
        nvml = self._nvml
        states = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self._query("nvmlDeviceGetNvLinkState", handle, link)
            except nvml.NVMLError as error:
                if error.value == nvml.NVML_ERROR_INVALID_ARGUMENT:
                    break  # past this GPU's last link on some drivers
                self._field_unavailable(index, "nvmlDeviceGetNvLinkState", error)
                return ()
            if state is None:
                break
            states.append(NvLinkState(link, state == nvml.NVML_FEATURE_ENABLED))
        return tuple(states)

    def _query(self, name: str, *args: Any) -> Any:
        """Call `pynvml.<name>(*args)`; None when unsupported, not permitted or missing."""
        nvml = self._nvml
        function = getattr(nvml, name, None)
        if function is None:
            self._log_missing(name, "not in this nvidia-ml-py")
            return None
        try:
            return function(*args)
        except nvml.NVMLError as error:
            if error.value == nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                self._log_missing(name, "not in this driver's libnvidia-ml")
                return None
            if error.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_NO_PERMISSION):
                return None
            raise

    def _field_unavailable(self, index: int, name: str, error: Any) -> None:
        """Re-raise an error that says the GPU or the session is gone (the GPU reads lost);
        else the field is unavailable this poll: logged once per GPU, function and error."""
        nvml = self._nvml
        gone = (nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED, nvml.NVML_ERROR_UNINITIALIZED,
                nvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if error.value in gone:
            raise error
        key = (index, name, int(error.value))
        if key not in self._unavailable_logged:
            self._unavailable_logged.add(key)
            LOG.warning("GPU %d: %s failed (%s, NVML error %d); that field reads as not available "
                        "(logged once)", index, name, error, error.value)

    def _log_missing(self, name: str, why: str) -> None:
        if name not in self._missing_logged:
            self._missing_logged.add(name)
            LOG.warning("NVML function %s is %s; its field reads as not available", name, why)


def _milli(value: Any) -> float | None:
    return None if value is None else float(value) / 1000.0


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
