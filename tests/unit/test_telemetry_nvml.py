"""The NVML backend against named fake machines (real pynvml error classes)."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime

import pynvml
import pytest

from slurm_aigc.errors import NvmlUnavailableError
from slurm_aigc.telemetry.nvml import NvmlBackend
from slurm_aigc.telemetry.topology import cross_check_nvlink, parse_topo_matrix
from tests.fakes import nvml as fakes
from tests.fakes.nvml import FakeNvml

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def backend(machine: fakes.FakeMachine) -> tuple[NvmlBackend, FakeNvml]:
    nvml = FakeNvml(machine)
    return NvmlBackend("gpu-01", nvml=nvml, clock=lambda: T0, smi=fakes.smi_runner(machine)), nvml


def test_dgx_a100_reads_every_field_with_units() -> None:
    source, _nvml = backend(fakes.dgx_a100())
    reading = source.read()
    assert (reading.node, reading.ts, reading.driver_version) == ("gpu-01", T0, "550.54.15")
    assert [g.index for g in reading.gpus] == list(range(8))
    gpu0 = reading.gpus[0]
    assert gpu0.name == "NVIDIA A100-SXM4-80GB" and gpu0.uuid and gpu0.uuid.startswith("GPU-")
    assert (gpu0.memory_total_mib, gpu0.memory_used_mib) == (81920.0, 30720.0)
    assert (gpu0.sm_util_pct, gpu0.mem_bw_util_pct) == (85.0, 40.0)
    assert (gpu0.power_draw_w, gpu0.power_limit_w, gpu0.temperature_c) == (310.0, 400.0, 61.0)
    assert gpu0.active_nvlinks == 12 and not gpu0.lost and gpu0.error is None
    pids = {p.pid: (p.used_memory_mib, p.sm_util_pct) for p in reading.gpus[1].processes}
    assert pids == {5001: (12288.0, 60.0), 5002: (8192.0, 30.0)}
    assert reading.gpus[2].processes == ()


def test_per_process_utilization_is_asked_only_where_processes_share_a_gpu() -> None:
    source, nvml = backend(fakes.dgx_a100())
    reading = source.read()
    asked = [call for call in nvml.calls if call == "nvmlDeviceGetProcessUtilization"]
    assert len(asked) == 1  # GPU 1 (two processes); not GPU 0 (one) nor the idle GPUs
    (alone,) = reading.gpus[0].processes
    assert (alone.pid, alone.used_memory_mib, alone.sm_util_pct) == (4242, 30720.0, None)
    assert reading.gpus[0].sm_util_pct == 85.0  # the GPU's own figure, which a lone process gets


def test_pcie_box_has_no_nvlink_and_process_util_unknown() -> None:
    reading = backend(fakes.pcie_l40s_x4())[0].read()
    assert all(g.nvlink == () for g in reading.gpus)
    (process,) = reading.gpus[2].processes
    assert (process.pid, process.used_memory_mib, process.sm_util_pct) == (777, 9000.0, None)


def test_gpu_lost_mid_poll_becomes_a_record_and_the_poll_goes_on() -> None:
    reading = backend(fakes.gpu_lost_mid_poll(lost_index=3))[0].read()
    lost = reading.gpus[3]
    assert lost.lost and lost.error is not None and "GPU is lost" in lost.error
    assert lost.uuid is not None  # read before the failure, kept to identify the GPU
    assert lost.memory_used_mib is None and lost.sm_util_pct is None
    assert [g.index for g in reading.gpus if not g.lost] == [0, 1, 2, 4, 5, 6, 7]
    assert reading.gpus[4].sm_util_pct == 0.0


def test_handle_error_also_marks_the_gpu_lost() -> None:
    machine = fakes.dgx_a100()
    gpus = list(machine.gpus)
    gpus[0] = replace(gpus[0], errors={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_UNKNOWN})
    reading = backend(replace(machine, gpus=tuple(gpus)))[0].read()
    assert reading.gpus[0].lost and reading.gpus[0].uuid is None
    assert not reading.gpus[1].lost


def quirky(errors: dict[int, dict[str, int]]) -> fakes.FakeMachine:
    """A DGX A100 whose GPUs raise the given NVML errors ({gpu index: {function: error code}})."""
    machine = fakes.dgx_a100()
    gpus = [replace(gpu, errors=errors.get(gpu.index, {})) for gpu in machine.gpus]
    return replace(machine, gpus=tuple(gpus))


def test_an_optional_field_failing_leaves_the_gpu_and_its_other_fields(caplog: pytest.LogCaptureFixture) -> None:
    # INSUFFICIENT_SIZE: a process gained a sample between pynvml's sizing and fill calls.
    source, _ = backend(quirky({
        1: {"nvmlDeviceGetProcessUtilization": pynvml.NVML_ERROR_INSUFFICIENT_SIZE},
        2: {"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_UNKNOWN},
        3: {"nvmlDeviceGetNvLinkState": pynvml.NVML_ERROR_UNKNOWN},
    }))
    with caplog.at_level(logging.WARNING):
        reading = source.read()
        source.read()
    assert not any(g.lost for g in reading.gpus)
    gpu1 = reading.gpus[1]
    assert (gpu1.sm_util_pct, gpu1.memory_used_mib, gpu1.temperature_c) == (90.0, 20480.0, 63.0)
    assert [(p.pid, p.used_memory_mib, p.sm_util_pct) for p in gpu1.processes] == [
        (5001, 12288.0, None), (5002, 8192.0, None)]
    assert reading.gpus[2].temperature_c is None and reading.gpus[2].active_nvlinks == 12
    assert reading.gpus[3].nvlink == () and reading.gpus[3].temperature_c == 35.0
    logged = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert len(logged) == 3  # once per GPU and error, not every poll


def test_an_optional_field_saying_the_gpu_is_lost_still_marks_it_lost() -> None:
    reading = backend(quirky({1: {"nvmlDeviceGetProcessUtilization": pynvml.NVML_ERROR_GPU_IS_LOST},
                              2: {"nvmlDeviceGetNvLinkState": pynvml.NVML_ERROR_GPU_IS_LOST}}))[0].read()
    assert [g.index for g in reading.gpus if g.lost] == [1, 2]


def test_unsupported_fields_read_as_not_available_only_for_that_field(caplog: pytest.LogCaptureFixture) -> None:
    source, _ = backend(fakes.field_unsupported())
    with caplog.at_level(logging.WARNING):
        first = source.read()
        source.read()
    gpu = first.gpus[2]
    assert gpu.power_draw_w is None and gpu.power_limit_w is None
    assert gpu.memory_used_mib == 9000.0 and gpu.temperature_c == 35.0 and not gpu.lost
    missing = [r for r in caplog.records if "nvmlDeviceGetProcessUtilization" in r.getMessage()]
    assert len(missing) == 1  # a missing symbol is logged once, not per GPU per poll


def test_function_absent_from_old_bindings_reads_as_none() -> None:
    reading = backend(fakes.old_bindings())[0].read()
    assert reading.gpus[0].processes[0].sm_util_pct is None
    assert reading.gpus[0].sm_util_pct == 85.0


def test_missing_driver_is_a_start_up_error() -> None:
    source, nvml = backend(fakes.no_driver())
    with pytest.raises(NvmlUnavailableError, match="Driver Not Loaded"):
        source.start()
    assert nvml.init_calls == 1


def test_nvml_is_initialised_lazily_once_and_shut_down_once() -> None:
    source, nvml = backend(fakes.dgx_a100())
    assert nvml.init_calls == 0
    source.read()
    source.read()
    assert nvml.init_calls == 1
    source.close()
    source.close()
    assert nvml.shutdown_calls == 1 and not nvml.initialized


def test_a_failed_session_is_ended_and_the_next_poll_starts_a_new_one() -> None:
    # A driver reload mid-run: nvmlDeviceGetCount fails. Before, every later poll asked the dead session.
    source, nvml = backend(fakes.dgx_a100())
    source.read()
    healthy = nvml.nvmlDeviceGetCount

    def reloading() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    nvml.nvmlDeviceGetCount = reloading  # type: ignore[method-assign]
    with pytest.raises(NvmlUnavailableError, match="new one starts at the next poll"):
        source.read()
    assert nvml.shutdown_calls == 1
    nvml.nvmlDeviceGetCount = healthy  # type: ignore[method-assign]
    assert len(source.read().gpus) == 8 and nvml.init_calls == 2


def test_topology_text_comes_from_nvidia_smi_and_cross_checks_with_nvml() -> None:
    source, _ = backend(fakes.dgx_a100())
    text = source.topology_text()
    assert text is not None
    assert cross_check_nvlink(parse_topo_matrix(text), source.read()) == []


def test_nvidia_smi_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.telemetry import nvml

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(NvmlUnavailableError, match="nvidia-smi not found"):
        nvml.run_nvidia_smi(["nvidia-smi", "topo", "-m"])


# --------------------------------------------------------------------------- MIG


def test_a_mig_gpu_is_read_as_a_device_without_per_job_figures() -> None:
    # On a MIG GPU's parent handle NVML has no utilization, sums every instance's memory and lists
    # every instance's processes: none of it is one job's use, so none of it is read.
    source, nvml = backend(fakes.dgx_a100_mig())
    reading = source.read()
    assert [g.mig for g in reading.gpus] == [True] * 4 + [False] * 4
    mig = reading.gpus[0]
    assert (mig.sm_util_pct, mig.mem_bw_util_pct, mig.memory_used_mib, mig.processes) == (None, None, None, ())
    assert (mig.name, mig.memory_total_mib, mig.power_draw_w, mig.temperature_c) == ("NVIDIA A100-SXM4-80GB", 81920.0,
                                                                                       180.0, 35.0)
    assert mig.active_nvlinks == 12 and not mig.lost and mig.uuid is not None
    whole = reading.gpus[4]
    assert (whole.sm_util_pct, whole.memory_used_mib, [p.pid for p in whole.processes]) == (85.0, 30720.0, [4242])
    for function in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetUtilizationRates"):
        assert nvml.calls.count(function) == 4  # the whole GPUs only


def test_mig_mode_is_logged_once_per_gpu(caplog: pytest.LogCaptureFixture) -> None:
    source, _ = backend(fakes.dgx_a100_mig(mig_gpus=(2, 5)))
    with caplog.at_level(logging.WARNING):
        source.read()
        source.read()
    logged = [r.getMessage() for r in caplog.records if "MIG mode" in r.getMessage()]
    assert len(logged) == 2 and logged[0].startswith("GPU 2 ") and logged[1].startswith("GPU 5 ")


def test_no_mig_support_missing_function_or_pending_mode_is_not_mig(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        l40s = backend(fakes.pcie_l40s_x4())[0].read()  # a GPU without MIG: NOT_SUPPORTED
    assert not any(g.mig for g in l40s.gpus) and l40s.gpus[2].memory_used_mib == 9000.0
    assert not caplog.records  # NOT_SUPPORTED is quiet
    machine = fakes.dgx_a100_mig(mig_gpus=(0,))
    old_bindings = replace(machine, missing_functions=frozenset({"nvmlDeviceGetMigMode"}))
    old_driver = replace(machine, gpus=tuple(replace(g, errors={"nvmlDeviceGetMigMode": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
                                             for g in machine.gpus))
    # Enabling MIG takes a GPU reset: until then the pending mode changes nothing.
    pending = replace(machine, gpus=(replace(machine.gpus[0], mig_mode=(pynvml.NVML_DEVICE_MIG_DISABLE,
                                                                         pynvml.NVML_DEVICE_MIG_ENABLE)),
                                     *machine.gpus[1:]))
    for quirk in (old_bindings, old_driver):
        gpu = backend(quirk)[0].read().gpus[4]
        assert not gpu.mig and gpu.sm_util_pct == 85.0
    gpu = backend(pending)[0].read().gpus[0]
    assert not gpu.mig and gpu.sm_util_pct == 0.0 and gpu.memory_used_mib == 39936.0
