"""The shipped Prolog/Epilog (daemon/slurm-aigc-jobrecord) and the agent's reader of its records."""

from __future__ import annotations

import json
import os
import runpy
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_aigc.shipped import JOB_RECORD, shipped_file
from slurm_aigc.telemetry.attribution import JobAllocations, JobRecord, parse_job_record
from slurm_aigc.telemetry.procfs import DEFAULT_JOB_RECORDS_DIR, JOB_RECORDS_ENV, JobRecordDir, job_records_dir

# What 22.05's Prolog environment holds (measured with an env dump on the local cluster).
GPU_JOB = {"SLURM_JOB_ID": "10", "SLURMD_NODENAME": "a100-01", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1",
           "SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "nlp", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
SHARD_JOB = {"SLURM_JOB_ID": "11", "SLURMD_NODENAME": "t4-01", "SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1",
             "SLURM_JOB_USER": "bob", "SLURM_JOB_ACCOUNT": "cv", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}


def run(env: dict[str, str], records: Path) -> subprocess.CompletedProcess[str]:
    script = shipped_file(JOB_RECORD)
    full = {"PATH": os.environ.get("PATH", ""), "SLURM_AIGC_JOB_RECORDS": str(records), **env}
    return subprocess.run([sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=30, check=False)


def test_the_script_is_executable_and_shipped() -> None:
    assert shipped_file(JOB_RECORD).stat().st_mode & stat.S_IXUSR


def test_the_script_and_the_agent_agree_on_the_record_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The script may not import slurm_aigc, so its default is a copy of procfs's: they must not drift.
    script = str(shipped_file(JOB_RECORD))
    monkeypatch.delenv(JOB_RECORDS_ENV, raising=False)
    assert Path(runpy.run_path(script, run_name="jobrecord")["RECORDS_DIR"]) == DEFAULT_JOB_RECORDS_DIR == job_records_dir()
    monkeypatch.setenv(JOB_RECORDS_ENV, str(tmp_path))  # and on the variable that moves them
    assert Path(runpy.run_path(script, run_name="jobrecord")["RECORDS_DIR"]) == tmp_path == job_records_dir()


def test_prolog_writes_a_record_the_agent_reads_and_epilog_removes_it(tmp_path: Path) -> None:
    assert run(GPU_JOB, tmp_path).returncode == 0
    assert run(SHARD_JOB, tmp_path).returncode == 0
    path = tmp_path / "a100-01" / "10.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind
    reader = JobRecordDir("a100-01", tmp_path, require_root=os.geteuid() == 0)
    texts = reader.read()
    assert parse_job_record(texts["10"], "10", "a100-01") == JobRecord("10", "a100-01", frozenset({0, 1}), "alice", "nlp")
    shard_texts = JobRecordDir("t4-01", tmp_path, require_root=False).read()
    assert JobAllocations("t4-01", lambda: shard_texts, None, None)({}) == {"11": [1]}
    assert run({**GPU_JOB, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}, tmp_path).returncode == 0
    assert not path.exists() and (tmp_path / "t4-01" / "11.json").exists()
    assert run({**GPU_JOB, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}, tmp_path).returncode == 0  # idempotent


@pytest.mark.parametrize("bad", [{"SLURM_JOB_ID": "10/../../x"}, {"SLURMD_NODENAME": "../etc"}, {"SLURM_JOB_ID": ""}])
def test_unplain_ids_record_nothing_and_never_fail(tmp_path: Path, bad: dict[str, str]) -> None:
    result = run({**GPU_JOB, **bad}, tmp_path)
    assert result.returncode == 0  # a failing Prolog drains the node
    assert "nothing recorded" in result.stderr
    assert not any(tmp_path.rglob("*.json"))


def test_a_job_without_gpus_and_hostile_text_is_recorded_as_json(tmp_path: Path) -> None:
    env = {**GPU_JOB, "SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": "NoDevFiles",
           "SLURM_JOB_ADMIN_COMMENT": 'aigc_class=train" ,"gpus":[7]'}
    assert run(env, tmp_path).returncode == 0
    document = json.loads((tmp_path / "a100-01" / "10.json").read_text())
    assert document["gpus"] is None and document["admin_comment"] == env["SLURM_JOB_ADMIN_COMMENT"]


def test_an_unwritable_directory_is_logged_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run(GPU_JOB, blocker)
    assert result.returncode == 0 and "slurm-aigc-jobrecord:" in result.stderr
