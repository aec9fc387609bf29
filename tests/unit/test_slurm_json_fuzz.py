"""Fuzz: hostile job names, comments and work directories through the JSON readers of jobs
(`SlurmCli.jobs/job`, 22.05 and 24.11 shapes) and of sacct records never change a job's id,
user, account, state or GRES, nor the number of jobs or records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_aigc.report.sacct import JobRecord, parse_sacct_output
from slurm_aigc.slurm import CommandResult, SlurmCli, job_from_json, parse_key_values
from slurm_aigc.telemetry.gres import job_gpu_indices

# Text a user may write: anything, and above all Slurm's own syntax and separators.
PIECES = ["JobId=53", " UserId=aigc-bob(1002)", " Account=vip", " JobState=RUNNING", " GRES=gpu:a100:8(IDX:0-7)",
          "|", "\x1f", "\n", "\r", "\t", "\"", "\\", "}", "{\"job_id\": 9}", "]", " Nodes=a100-02 CPU_IDs=0 Mem=0 GRES=gpu:a100:8(IDX:0-7)",
          "ßü—🚀", "\u2028", "\x00", "=", "(", ")", ","]
hostile = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=20)), max_size=12).map("".join)
long_text = st.integers(min_value=1000, max_value=5000).map(lambda n: ("x JobId=53 " * n)[:n])
user_text = st.one_of(hostile, long_text)


def squeue_22_05(jobs: Sequence[dict[str, Any]]) -> str:
    return json.dumps({"jobs": list(jobs), "errors": []})


def job_22_05(job_id: int, name: str, comment: str, workdir: str) -> dict[str, Any]:
    return {"job_id": job_id, "name": name, "comment": comment, "current_working_directory": workdir,
            "user_name": "aigc-alice", "account": "aigc", "job_state": "RUNNING", "nodes": "a100-01",
            "gres_detail": ["gpu:a100:2(IDX:0-1)"], "job_resources": {"allocated_nodes": [{"nodename": "a100-01"}]},
            "tres_per_node": "gres:gpu:2", "tres_alloc_str": "cpu=1,gres/gpu=2"}


def job_24_11(job_id: int, name: str, comment: str, workdir: str) -> dict[str, Any]:
    record = job_22_05(job_id, name, comment, workdir)
    record.update(job_state=["RUNNING"], node_count={"set": True, "infinite": False, "number": 1},
                  job_resources={"nodes": {"allocation": [{"index": 0, "name": "a100-01"}]}})
    return record


class Runner:
    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        return CommandResult(tuple(argv), 0, self.text, "")


@settings(max_examples=150, deadline=None)
@given(name=user_text, comment=user_text, workdir=user_text, new=st.booleans())
def test_user_text_never_changes_a_jobs_identity_or_gres(name: str, comment: str, workdir: str, new: bool) -> None:
    make, version = (job_24_11, (24, 11, 5)) if new else (job_22_05, (22, 5, 8))
    text = squeue_22_05([make(61, name, comment, workdir), make(53, "bob", "", "/home/bob") | {"user_name": "aigc-bob", "account": "vip"}])
    jobs = SlurmCli(Runner(text), slurm_version=version).jobs()
    assert [(j.job_id, j.user, j.account, j.state) for j in jobs] == [("61", "aigc-alice", "aigc", "RUNNING"), ("53", "aigc-bob", "vip", "RUNNING")]
    alice = jobs[0]
    assert (alice.name, alice.comment, alice.work_dir) == (name, comment, workdir)
    assert alice.gres_detail == (("a100-01", "gpu:a100:2(IDX:0-1)"),) and job_gpu_indices(alice, "a100-01") == {0, 1}
    assert alice.alloc_tres == "cpu=1,gres/gpu=2" and alice.tres_per_node == "gres:gpu:2"


def sacct_job(job_id: int, user: str, name: str, comment: str, workdir: str) -> dict[str, Any]:
    return {"job_id": job_id, "name": name, "user": user, "account": "aigc", "partition": "gpu", "qos": "normal",
            "state": {"current": "COMPLETED"}, "nodes": "a100-01", "working_directory": workdir,
            "comment": {"job": comment, "administrator": None}, "array": {}, "het": {},
            "time": {"submission": 1796300000, "start": 1796300000, "end": 1796303600, "elapsed": 3600},
            "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 1}]}, "steps": []}


@settings(max_examples=150, deadline=None)
@given(name=user_text, comment=user_text, workdir=user_text)
def test_user_text_never_creates_or_alters_a_sacct_record(name: str, comment: str, workdir: str) -> None:
    text = json.dumps({"jobs": [sacct_job(1, "aigc-alice", name, comment, workdir), sacct_job(2, "aigc-bob", "b", "", "/")],
                       "errors": []})
    rows = list(parse_sacct_output(text))
    assert all(isinstance(r, JobRecord) for r in rows)
    assert [(r.job_id, r.user, r.account, r.state, r.tres.gpus, r.elapsed_s) for r in rows] == [  # type: ignore[union-attr]
        ("1", "aigc-alice", "aigc", "COMPLETED", 1, 3600), ("2", "aigc-bob", "aigc", "COMPLETED", 1, 3600)]
    assert (rows[0].name, rows[0].comment) == (name, comment)  # type: ignore[union-attr]


def test_the_old_key_value_reading_was_fooled() -> None:
    """Why the JSON: `scontrol show job -o` text read job 61's comment as job 53's fields."""
    line = ("JobId=61 JobName=x UserId=aigc-alice(1001) Account=aigc JobState=PENDING "
            "Comment=x JobId=53 UserId=aigc-bob(1002) Account=vip JobState=RUNNING")
    fields = parse_key_values(line)
    assert (fields["JobId"], fields["Account"]) == ("53", "vip")
    safe = job_from_json(job_22_05(61, "x", "x JobId=53 UserId=aigc-bob(1002) Account=vip JobState=RUNNING", "/tmp"))
    assert (safe.job_id, safe.account, safe.user) == ("61", "aigc", "aigc-alice")
