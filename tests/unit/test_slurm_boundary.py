"""The Slurm boundary on recorded `scontrol` output and a fake runner (no cluster needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_aigc.errors import SlurmCommandError
from slurm_aigc.slurm import CommandResult, SlurmCli, parse_duration_s, parse_key_values

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scontrol"

# Slurm 24.11 prints GPU requests as `gres/gpu...` and jobs' allocation as AllocTRES.
JOB_24_11 = (
    "JobId=77 JobName=sd-xl UserId=aigc-bob(1002) GroupId=aigc-bob(1002) MCS_label=N/A Priority=1 Nice=0 "
    "Account=aigc QOS=normal JobState=PENDING Reason=Resources Dependency=(null) Requeue=0 Restarts=2 BatchFlag=1 "
    "TimeLimit=1-02:03:04 SubmitTime=2026-01-02T03:04:05 StartTime=Unknown EndTime=Unknown Partition=gpu "
    "NodeList=(null) NumNodes=1-1 Features=nvlink&a100 Comment=run Batch=3 aigc:type=imagegen "
    "AdminComment=aigc: notified TresPerNode=gres/gpu:a100:2"
)


class FakeRunner:
    def __init__(self, outputs: dict[tuple[str, ...], CommandResult]) -> None:
        self.outputs = outputs
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        self.calls.append(tuple(argv))
        return self.outputs.get(tuple(argv), CommandResult(tuple(argv), 0, "", ""))


def result(argv: Sequence[str], stdout: str = "", rc: int = 0, stderr: str = "") -> CommandResult:
    return CommandResult(tuple(argv), rc, stdout, stderr)


def test_nodes_read_gres_features_weight_state_from_recorded_22_05_output() -> None:
    argv = ("scontrol", "-d", "show", "node", "-o")
    runner = FakeRunner({argv: result(argv, (FIXTURES / "show-node-22.05.txt").read_text())})
    nodes = {n.name: n for n in SlurmCli(runner).nodes()}
    assert sorted(nodes) == ["a100-01", "a100-02", "t4-01", "t4-02"]
    assert nodes["a100-01"].gres == "gpu:a100:8,shard:a100:640"
    assert nodes["t4-02"].available_features == ("t4",)
    assert nodes["a100-02"].weight == 1
    assert nodes["t4-01"].partitions == ("gpu",)
    assert nodes["a100-01"].fields["OS"].startswith("Linux")


def test_job_keeps_lowercase_tags_in_comment_and_reads_22_05_fields() -> None:
    line = (FIXTURES / "show-job-22.05.txt").read_text().strip()
    job_id = line.split()[0].split("=")[1]
    argv = ("scontrol", "show", "job", "-o", job_id)
    job = SlurmCli(FakeRunner({argv: result(argv, line)})).job(job_id)
    assert job is not None
    assert job.name == "my job"
    assert job.user == "aigc-alice"
    assert job.comment == "exp 42 aigc:type=train,model=llama3-8b"
    assert job.tres_per_node == "gres:gpu:a100:2"
    assert "gres/gpu=2" in job.alloc_tres
    assert job.batch_flag and job.requeue
    assert job.time_limit_s is None


def test_job_24_11_format() -> None:
    argv = ("scontrol", "show", "job", "-o")
    job = SlurmCli(FakeRunner({argv: result(argv, JOB_24_11 + "\n")})).jobs()[0]
    assert job.tres_per_node == "gres/gpu:a100:2"
    assert job.restarts == 2 and not job.requeue
    assert job.time_limit_s == ((24 + 2) * 60 + 3) * 60 + 4
    assert job.num_nodes == 1
    assert job.start_time is None
    # An upper-case ` Word=` inside a comment is where the documented limit of `-o` parsing lies.
    assert job.comment == "run"
    assert job.admin_comment == "aigc: notified"


def test_failed_command_raises_with_argv_exit_code_and_stderr() -> None:
    argv = ("scontrol", "requeue", "5")
    cli = SlurmCli(FakeRunner({argv: result(argv, rc=1, stderr="Invalid job id specified")}))
    with pytest.raises(SlurmCommandError) as caught:
        cli.requeue("5")
    assert caught.value.argv == list(argv)
    assert caught.value.returncode == 1
    assert "Invalid job id" in caught.value.stderr


def test_unknown_job_is_none_and_no_jobs_is_empty() -> None:
    gone = ("scontrol", "show", "job", "-o", "9")
    empty = ("scontrol", "show", "job", "-o")
    runner = FakeRunner({
        gone: result(gone, rc=1, stderr="slurm_load_jobs error: Invalid job id specified"),
        empty: result(empty, rc=0, stdout="No jobs in the system\n"),
    })
    assert SlurmCli(runner).job("9") is None
    assert SlurmCli(runner).jobs() == []


def test_update_node_sets_both_feature_lists_and_weight() -> None:
    runner = FakeRunner({})
    SlurmCli(runner).update_node("a100-01", features=["a100", "nvlink"], weight=7)
    assert runner.calls == [("scontrol", "update", "NodeName=a100-01", "AvailableFeatures=a100,nvlink",
                             "ActiveFeatures=a100,nvlink", "Weight=7")]


def test_version_and_pidinfo() -> None:
    version = ("scontrol", "--version")
    pid = ("scontrol", "pidinfo", "4242")
    runner = FakeRunner({
        version: result(version, "slurm-wlm 24.11.5\n"),
        pid: result(pid, "Slurm JobId=31 ends at Mon Jan 1 00:00:00 2027\nJob remaining time is 100 seconds\n"),
    })
    assert SlurmCli(runner).version() == (24, 11, 5)
    assert SlurmCli(runner).job_of_pid(4242) == "31"
    assert SlurmCli(runner).job_of_pid(1) is None


def test_parse_helpers() -> None:
    assert parse_duration_s("00:05") == 5
    assert parse_duration_s("2-00:00:01") == 2 * 86400 + 1
    assert parse_duration_s("UNLIMITED") is None
    assert parse_key_values("A=1 B=two words C=(null)") == {"A": "1", "B": "two words", "C": "(null)"}
