"""The Slurm boundary on hand-made `--json` output of 22.05 and 24.11 and a fake runner (no cluster needed)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_aigc.errors import SlurmCommandError, SlurmParseError
from slurm_aigc.slurm import (
    CommandResult,
    NodeInfo,
    SlurmCli,
    active_features_after,
    job_from_json,
    parse_duration_s,
    parse_key_values,
)

JSON = Path(__file__).resolve().parents[1] / "fixtures" / "slurm-json"
V22, V24 = (22, 5, 8), (24, 11, 5)
HOSTILE_NAME = "exp1 JobId=53 UserId=aigc-bob(1002)\nJobId=54 Account=vip"
HOSTILE_COMMENT = "x JobId=53 UserId=aigc-bob(1002) Account=vip JobState=RUNNING GRES=gpu:a100:8(IDX:0-7)|\n\x1f|a"
class FakeRunner:
    def __init__(self, outputs: dict[tuple[str, ...], CommandResult]) -> None:
        self.outputs = outputs
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        self.calls.append(tuple(argv))
        return self.outputs.get(tuple(argv), CommandResult(tuple(argv), 0, "", ""))


def result(argv: Sequence[str], stdout: str = "", rc: int = 0, stderr: str = "") -> CommandResult:
    return CommandResult(tuple(argv), rc, stdout, stderr)


def cli(version: tuple[int, int, int], argv: Sequence[str], fixture: str) -> tuple[SlurmCli, FakeRunner]:
    runner = FakeRunner({tuple(argv): result(argv, (JSON / fixture).read_text())})
    return SlurmCli(runner, slurm_version=version), runner


def test_22_05_nodes_come_from_sinfo_json_with_gres_used_and_states() -> None:
    slurm, runner = cli(V22, ["sinfo", "--json"], "sinfo-22.05.json")
    nodes = {n.name: n for n in slurm.nodes()}
    assert runner.calls == [("sinfo", "--json")]
    assert nodes["a100-01"].gres_used == "gpu:a100:2(IDX:0-1),shard:a100:0(IDX:N/A)"
    assert nodes["a100-01"].available_features == ("a100", "nvlink8") and nodes["a100-01"].state == "MIXED"
    assert nodes["t4-01"].state == "IDLE+DRAIN" and nodes["t4-01"].weight == 5 and nodes["t4-01"].cpus == 16
    assert nodes["t4-01"].partitions == ("gpu", "debug")
    assert nodes["a100-01"].fields["AllocTRES"] == "cpu=1,gres/gpu=2" and "AllocTRES" not in nodes["t4-01"].fields
    assert [n.name for n in slurm.nodes(["t4-01"])] == ["t4-01"]


def test_24_11_nodes_come_from_scontrol_json_with_state_lists_and_shard_pairs() -> None:
    slurm, runner = cli(V24, ["scontrol", "-d", "--json", "show", "node"], "scontrol-show-node-24.11.json")
    nodes = {n.name: n for n in slurm.nodes()}
    assert nodes["t4-01"].state == "IDLE+DRAIN" and nodes["a100-01"].state == "MIXED"
    assert nodes["a100-01"].gres_used == "gpu:a100:0(IDX:N/A),shard:a100:8(8/16,0/16,0/16,0/16)"
    assert nodes["a100-01"].available_features == ("a100", "nvlink4")


def test_22_05_hostile_name_and_comment_stay_inside_their_job() -> None:
    slurm, runner = cli(V22, ["squeue", "--json"], "squeue-22.05.json")
    jobs = {j.job_id: j for j in slurm.jobs()}
    assert sorted(jobs) == ["53", "61", "62"]
    job = jobs["61"]
    assert (job.user, job.account, job.state, job.name, job.comment) == (
        "aigc-alice", "aigc", "RUNNING", HOSTILE_NAME, HOSTILE_COMMENT)
    assert job.gres_detail == (("a100-01", "gpu:a100:2(IDX:0-1)"),)
    assert job.alloc_tres == "cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:a100=2" and job.admin_comment == "aigc_class=train"
    assert job.time_limit_s is None and job.batch_flag and job.requeue and job.num_nodes == 1
    bob = jobs["53"]
    assert (bob.user, bob.account, bob.state, bob.restarts) == ("aigc-bob", "vip", "PENDING", 1)
    assert bob.reason == "job_requeued_in_held_state" and bob.fields["Priority"] == "0" and bob.start_time is None
    assert bob.alloc_tres == "cpu=1,node=1,gres/gpu=4"  # pending: the request, as scontrol's TRES=


def test_22_05_gres_detail_follows_slurmctld_node_order_and_compat_fields() -> None:
    slurm, _ = cli(V22, ["squeue", "--json"], "squeue-22.05.json")
    job = slurm.job("62")
    assert job is not None and job.gres_detail == (("a100-02", "gpu:a100:1(IDX:0)"), ("a100-01", "shard:a100:8(IDX:3)"))
    assert job.fields["TresPerJob"] == "gres:gpu:1" and job.fields["Prefer"] == "a100&model_x"
    assert "TresPerNode" not in job.fields and job.time_limit_s == 3600 and not job.requeue and job.restarts == 3
    assert slurm.job("99") is None


def test_24_11_jobs_read_number_objects_state_lists_and_allocation_names() -> None:
    argv = ["scontrol", "-d", "--json", "show", "job", "71"]
    slurm, runner = cli(V24, argv, "scontrol-show-job-24.11.json")
    job = slurm.job("71")
    assert runner.calls == [tuple(argv)]
    assert job is not None and (job.user, job.account, job.state, job.comment) == ("aigc-alice", "aigc", "RUNNING", HOSTILE_COMMENT)
    assert job.gres_detail == (("a100-01", "shard:8(8/16,0/16,0/16,0/16)"),)
    assert job.time_limit_s is None and job.num_nodes == 1 and job.restarts == 2
    assert job.submit_time is not None and job.submit_time.timestamp() == 1796308865
    slurm, _ = cli(V24, ["scontrol", "-d", "--json", "show", "job"], "scontrol-show-job-24.11.json")
    states = {j.job_id: j.state for j in slurm.jobs()}
    assert states == {"71": "RUNNING", "53": "REQUEUED", "75": "COMPLETING"}  # flags win, as scontrol prints them
    (bob,) = [j for j in slurm.jobs() if j.job_id == "53"]
    assert bob.fields["Priority"] == "0" and bob.time_limit_s == 90 * 60 and bob.start_time is None


def test_a_listing_reuses_the_jobinfo_of_unchanged_records_and_converts_changed_ones() -> None:
    """Each listing equals a fresh conversion of every record; an unchanged record keeps its JobInfo object."""
    records = json.loads((JSON / "squeue-22.05.json").read_text())["jobs"]
    ended = [{**r, "job_state": "COMPLETED"} if r["job_id"] == 61 else r for r in records]
    answers = [records, ended, [r for r in ended if r["job_id"] != 62], ended]

    def runner(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        return result(argv, json.dumps({"jobs": answers.pop(0), "errors": []}))

    slurm = SlurmCli(runner, slurm_version=V22)
    listings = [{j.job_id: j for j in slurm.jobs()} for _ in range(4)]
    fresh = [{j.job_id: j for j in map(job_from_json, each)} for each in (records, ended, ended[:1] + ended[2:], ended)]
    assert listings == fresh
    first, second, third, fourth = listings
    assert second["61"].state == "COMPLETED" and first["61"].state == "RUNNING"
    assert second["53"] is first["53"] and second["62"] is first["62"]
    assert "62" not in third and third["61"] is second["61"]
    assert fourth["62"] is not second["62"]  # only the last listing is kept: 62 was converted again


def test_version_is_asked_once_and_picks_the_json_source() -> None:
    version = ("scontrol", "--version")
    runner = FakeRunner({version: result(version, "slurm-wlm 22.05.8\n"),
                         ("squeue", "--json"): result(("squeue", "--json"), '{"jobs": [], "errors": []}')})
    slurm = SlurmCli(runner)
    assert slurm.jobs() == [] and slurm.jobs() == []
    assert runner.calls == [version, ("squeue", "--json"), ("squeue", "--json")]


def test_json_errors_and_garbage_raise_naming_the_command() -> None:
    bad = ("squeue", "--json")
    for text, words in [("No jobs", "not JSON"), ('{"errors": [{"error": "boom"}], "jobs": []}', "boom"),
                        ('{"jobs": {"a": 1}}', "list of objects")]:
        runner = FakeRunner({bad: result(bad, text)})
        with pytest.raises(SlurmParseError, match=words):
            SlurmCli(runner, slurm_version=V22).jobs()


def test_job_state_is_one_single_job_squeue_without_user_text() -> None:
    argv = ("squeue", "-h", "-t", "all", "-j", "61", "-o", "%A|%T")
    gone = ("squeue", "-h", "-t", "all", "-j", "9", "-o", "%A|%T")
    runner = FakeRunner({argv: result(argv, "61|RUNNING\n"),
                         gone: result(gone, rc=1, stderr="slurm_load_jobs error: Invalid job id specified")})
    slurm = SlurmCli(runner, slurm_version=V22)
    assert slurm.job_state("61") == "RUNNING" and slurm.job_state("9") is None


def test_requeue_asks_slurm_for_incomplete_jobs_only() -> None:
    runner = FakeRunner({})
    slurm = SlurmCli(runner, slurm_version=V22)
    slurm.requeue("5")
    slurm.requeue("6", hold=True)
    slurm.requeue("7", incomplete_only=False)
    assert runner.calls == [("scontrol", "requeue", "Incomplete", "5"), ("scontrol", "requeuehold", "Incomplete", "6"),
                            ("scontrol", "requeue", "7")]


def test_failed_command_raises_with_argv_exit_code_and_stderr() -> None:
    argv = ("scontrol", "requeue", "Incomplete", "5")
    slurm = SlurmCli(FakeRunner({argv: result(argv, rc=1, stderr="Invalid job id specified")}))
    with pytest.raises(SlurmCommandError) as caught:
        slurm.requeue("5")
    assert caught.value.argv == list(argv)
    assert caught.value.returncode == 1
    assert "Invalid job id" in caught.value.stderr


def test_unknown_job_is_none_and_no_jobs_is_empty() -> None:
    gone = ("scontrol", "-d", "--json", "show", "job", "9")
    empty = ("scontrol", "-d", "--json", "show", "job")
    runner = FakeRunner({
        gone: result(gone, rc=1, stderr="slurm_load_jobs error: Invalid job id specified"),
        empty: result(empty, rc=0, stdout='{"jobs": [], "errors": []}'),
    })
    assert SlurmCli(runner, slurm_version=V24).job("9") is None
    assert SlurmCli(runner, slurm_version=V24).jobs() == []


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


@pytest.mark.parametrize(("stderr", "jobless"), [
    ("Failed to locate job for requested pid\n", True),  # what 22.05.8 prints for a pid in no job
    ("scontrol: error: s_p_parse_file: cannot stat file /etc/slurm/slurm.conf\nscontrol: fatal: Unable to process "
     "configuration file\nFailed to locate job for requested pid\n", False),
])
def test_pidinfo_tells_no_job_from_a_failed_lookup(stderr: str, jobless: bool) -> None:
    # A failed lookup read as "no job" was cached for minutes: the job's work read as a stranger's.
    def runner(argv: object, timeout_s: float, stdin: str | None = None) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", stderr)  # type: ignore[call-overload]

    if jobless:
        assert SlurmCli(runner).job_of_pid(77) is None
    else:
        with pytest.raises(SlurmCommandError, match="Unable to process configuration"):
            SlurmCli(runner).job_of_pid(77)


def test_parse_helpers() -> None:
    assert parse_duration_s("00:05") == 5
    assert parse_duration_s("2-00:00:01") == 2 * 86400 + 1
    assert parse_duration_s("UNLIMITED") is None
    assert parse_key_values("A=1 B=two words C=(null)") == {"A": "1", "B": "two words", "C": "(null)"}


def node_with(available: Sequence[str], active: Sequence[str]) -> NodeInfo:
    return NodeInfo(name="a100-01", state="IDLE", gres="gpu:a100:8", gres_used="", available_features=tuple(available),
                    active_features=tuple(active), weight=1, cpus=32, partitions=("gpu",), fields={})


def test_update_node_keeps_the_active_features_a_node_features_plugin_chose() -> None:
    # node_features/helpers (or knl_*): the node is booted in one of the modes it offers, so only
    # `mode_a` is active. Writing AvailableFeatures as ActiveFeatures would claim every mode.
    current = node_with(["a100", "mode_a", "mode_b", "nvfree2"], ["a100", "mode_a", "nvfree2"])
    runner = FakeRunner({})
    SlurmCli(runner).update_node("a100-01", features=["a100", "mode_a", "mode_b", "nvfree4", "model_x"], current=current)
    assert runner.calls == [("scontrol", "update", "NodeName=a100-01",
                             "AvailableFeatures=a100,mode_a,mode_b,nvfree4,model_x",
                             "ActiveFeatures=a100,mode_a,nvfree4,model_x")]


def test_update_node_without_a_features_plugin_writes_exactly_as_before() -> None:
    current = node_with(["a100", "ib", "nvfree2"], ["ib", "a100", "nvfree2"])  # active == available, any order
    runner = FakeRunner({})
    SlurmCli(runner).update_node("a100-01", features=["a100", "ib", "nvfree4"], weight=3, current=current)
    SlurmCli(runner).update_node("a100-01", features=["a100", "ib", "nvfree4"], current=node_with(["a100"], []))
    assert [call[3:5] for call in runner.calls] == [("AvailableFeatures=a100,ib,nvfree4", "ActiveFeatures=a100,ib,nvfree4")] * 2
    assert active_features_after(node_with(["a100", "x"], ["x", "gone"]), ["a100", "y"]) == ("y",)  # a subset of Available
