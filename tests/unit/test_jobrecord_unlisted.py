"""A Prolog record without a GPU list (Slurm 24.11 after `scontrol reconfigure`, issue 13).

Measured on 24.11.5: once slurmctld has run `scontrol reconfigure`, the Prolog of a GPU job gets
neither SLURM_JOB_GPUS nor CUDA_VISIBLE_DEVICES. The record must then say "no GPU list" (null),
not "no GPUs" ([]), and the agent must ask slurmctld for such a job on 23.02+ even while it runs
nothing on its GPU, or an allocated idle GPU never shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_aigc.errors import AigcError
from slurm_aigc.slurm import CommandResult, SlurmCli
from slurm_aigc.telemetry.agent import looks_up_unlisted
from slurm_aigc.telemetry.attribution import JobAllocations, JobRecord, parse_job_record
from slurm_aigc.telemetry.procfs import JobRecordDir
from tests.unit.test_jobrecord import GPU_JOB, run

# The Prolog environment of a `--gres=gpu:t4:1` job on 24.11.5 after `scontrol reconfigure` (env dump).
AFTER_RECONFIGURE = {"SLURM_JOB_ID": "2", "SLURMD_NODENAME": "t4-01", "SLURM_JOB_USER": "root",
                     "SLURM_JOB_ACCOUNT": "root", "SLURM_JOB_PARTITION": "gpu", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}


class Lookups:
    def __init__(self, table: dict[str, set[int]]) -> None:
        self.table = table
        self.calls: list[str] = []

    def __call__(self, job: str) -> frozenset[int]:
        self.calls.append(job)
        return frozenset(self.table.get(job, set()))


def recorded(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    assert run(env, tmp_path).returncode == 0
    return JobRecordDir(env["SLURMD_NODENAME"], tmp_path, require_root=False).read()


def test_a_prolog_without_gpu_variables_records_no_gpu_list(tmp_path: Path) -> None:
    texts = recorded(tmp_path, AFTER_RECONFIGURE)
    assert json.loads(texts["2"])["gpus"] is None
    assert parse_job_record(texts["2"], "2", "t4-01") == JobRecord("2", "t4-01", None, "root", "root")


def test_an_idle_job_with_an_unlisted_record_is_looked_up_once_on_23_02_plus(tmp_path: Path) -> None:
    texts = recorded(tmp_path, AFTER_RECONFIGURE)
    lookups = Lookups({"2": {1}})
    allocations = JobAllocations("t4-01", lambda: texts, lookups, None, look_up_unlisted=True)
    for _ in range(3):  # the job runs nothing on its GPU: no pid names it
        assert allocations({}) == {"2": [1]}
    assert lookups.calls == ["2"] and allocations.lookups == 1


def test_on_22_05_an_unlisted_record_of_an_idle_job_costs_no_lookup(tmp_path: Path) -> None:
    texts = recorded(tmp_path, AFTER_RECONFIGURE)
    lookups = Lookups({"2": {1}})
    allocations = JobAllocations("t4-01", lambda: texts, lookups, None, look_up_unlisted=False)
    assert allocations({}) == {}
    assert allocations({500: "2"}) == {"2": [1]}  # but a job on a GPU with no listed GPUs is asked about
    assert lookups.calls == ["2"]


def test_a_listed_record_still_costs_no_lookup(tmp_path: Path) -> None:
    texts = recorded(tmp_path, GPU_JOB)
    lookups = Lookups({"10": {7}})
    allocations = JobAllocations("a100-01", lambda: texts, lookups, None, look_up_unlisted=True)
    assert allocations({}) == {"10": [0, 1]} and lookups.calls == []


def test_the_lookup_of_an_unlisted_job_ends_with_its_record(tmp_path: Path) -> None:
    texts = recorded(tmp_path, AFTER_RECONFIGURE)
    lookups = Lookups({"2": {1}})
    allocations = JobAllocations("t4-01", lambda: dict(texts), lookups, None, look_up_unlisted=True)
    allocations({})
    texts.clear()  # the Epilog removed it
    assert allocations({}) == {}
    texts.update(recorded(tmp_path, AFTER_RECONFIGURE))  # a requeued run of the job on the node
    assert allocations({}) == {"2": [1]} and lookups.calls == ["2", "2"]


@pytest.mark.parametrize("gpus", ["0", {"0": 1}, [0, "1"]])
def test_gpus_must_be_null_or_indices(gpus: object) -> None:
    with pytest.raises(AigcError, match="gpus must be null or a list of GPU indices"):
        parse_job_record(json.dumps({"job_id": "2", "node": "t4-01", "gpus": gpus}), "2", "t4-01")


@pytest.mark.parametrize(("version", "asks"), [("slurm-wlm 22.05.8", False), ("slurm 23.02.7", True),
                                                ("slurm-wlm 24.11.5", True), ("slurm 26.05.0", True)])
def test_the_agent_asks_about_unlisted_records_from_23_02(version: str, asks: bool) -> None:
    def runner(argv: object, timeout_s: float, stdin: str | None = None) -> CommandResult:
        return CommandResult(("scontrol", "--version"), 0, version, "")

    assert looks_up_unlisted(SlurmCli(runner)) is asks


def test_without_a_slurm_version_the_agent_asks() -> None:
    def runner(argv: object, timeout_s: float, stdin: str | None = None) -> CommandResult:
        return CommandResult(("scontrol", "--version"), 127, "", "scontrol: not found")

    assert looks_up_unlisted(SlurmCli(runner)) is True
