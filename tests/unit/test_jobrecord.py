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


def run(env: dict[str, str], records: Path, *, umask: int = -1) -> subprocess.CompletedProcess[str]:
    """The script as slurmd runs it (`umask`: slurmd's; -1 keeps the test's)."""
    script = shipped_file(JOB_RECORD)
    full = {"PATH": os.environ.get("PATH", ""), "SLURM_AIGC_JOB_RECORDS": str(records), **env}
    return subprocess.run([sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=30, check=False,
                          umask=umask)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


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


# --------------------------------------------------------------------------- the folders, as root sees them
# The script runs as root: a folder on the way that a user can change would let the user point
# root's writes (and the Epilog's unlink) anywhere.


def victim_folder(tmp_path: Path) -> Path:
    """A folder of root's that a planted symlink points at: mode 0700, holding a file named like a record."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "10.json").write_text("not a record")
    return victim


def assert_untouched(victim: Path) -> None:
    assert mode(victim) == 0o700
    assert [p.name for p in victim.iterdir()] == ["10.json"] and (victim / "10.json").read_text() == "not a record"


@pytest.mark.parametrize("context", ["prolog_slurmd", "epilog_slurmd"])
def test_a_symlink_planted_where_users_may_write_changes_nothing_where_it_points(tmp_path: Path, context: str) -> None:
    victim = victim_folder(tmp_path)
    records = tmp_path / "records"
    records.mkdir()
    records.chmod(0o777)  # what mkdir made under slurmd's umask 0 before the fix
    (records / "a100-01").symlink_to(victim)  # a user's <records>/<node> -> the victim
    result = run({**GPU_JOB, "SLURM_SCRIPT_CONTEXT": context}, records)
    assert result.returncode == 0  # a failing Prolog drains the node
    assert f"refusing {records} " in result.stderr
    assert_untouched(victim)


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's symlink takes root")
@pytest.mark.parametrize("context", ["prolog_slurmd", "epilog_slurmd"])
def test_another_users_symlink_in_a_sticky_folder_is_not_followed(tmp_path: Path, context: str) -> None:
    victim = victim_folder(tmp_path)
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # /tmp, where an admin chose to keep the records
    planted = shared / "aigc-jobs"  # a user made it before the first Prolog did
    planted.symlink_to(victim)
    os.lchown(planted, 65534, 65534)
    result = run({**GPU_JOB, "SLURM_SCRIPT_CONTEXT": context}, planted)
    assert result.returncode == 0 and f"refusing {planted}: a symlink of uid 65534" in result.stderr
    assert_untouched(victim)
    assert not (victim / "a100-01").exists()


@pytest.mark.parametrize("umask", [0o000, 0o077], ids=["umask000", "umask077"])
def test_folders_and_records_get_their_modes_whatever_slurmds_umask(tmp_path: Path, umask: int) -> None:
    records = tmp_path / "run" / "slurm-aigc" / "jobs"  # none of it there yet
    assert run(GPU_JOB, records, umask=umask).returncode == 0
    made = [tmp_path / "run", tmp_path / "run" / "slurm-aigc", records, records / "a100-01"]
    assert [mode(folder) for folder in made] == [0o755] * 4  # umask 0 made 0777 parents; 077 hid them from the agent
    assert mode(records / "a100-01" / "10.json") == 0o644


@pytest.mark.parametrize(("where", "folder_mode"), [("records", 0o775), ("records", 0o757), ("node", 0o775),
                                                    ("node", 0o1777)], ids=["records775", "records757", "node775", "node1777"])
def test_a_folder_others_may_write_is_refused_and_left_as_it_is(tmp_path: Path, where: str, folder_mode: int) -> None:
    records = tmp_path / "records"
    (records / "a100-01").mkdir(parents=True)
    folder = records if where == "records" else records / "a100-01"
    folder.chmod(folder_mode)  # sticky passes on the way (/tmp), never for the folder holding the records
    for context in ("prolog_slurmd", "epilog_slurmd"):
        result = run({**GPU_JOB, "SLURM_SCRIPT_CONTEXT": context}, records)
        assert result.returncode == 0 and f"refusing {folder} " in result.stderr
    assert not any(records.rglob("*.json")) and mode(folder) == folder_mode


def test_roots_own_symlink_on_the_way_is_followed(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("../run")  # as /var/run -> /run (docs/deploy.md's example)
    records = tmp_path / "var" / "run" / "aigc-jobs"
    result = run(GPU_JOB, records)
    assert result.returncode == 0 and result.stderr == ""
    assert (tmp_path / "run" / "aigc-jobs" / "a100-01" / "10.json").is_file()
    assert run({**GPU_JOB, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}, records).returncode == 0
    assert not (tmp_path / "run" / "aigc-jobs" / "a100-01" / "10.json").exists()
