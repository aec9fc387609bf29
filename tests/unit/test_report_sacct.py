"""sacct --json of Slurm 22.05 and 24.11: every record parsed or skipped with its reason, and no
user text (name, comment, work directory) can create or alter a record."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurm_aigc.errors import SlurmCommandError, SlurmParseError
from slurm_aigc.report.sacct import (
    JobRecord,
    SacctQuery,
    SacctReader,
    SkippedRow,
    aigc_class_of,
    parse_sacct_output,
    sacct_args,
    window_count,
    windows,
    with_live_comments,
)
from slurm_aigc.slurm import CommandResult, SlurmCli
from tests.unit.sacct_json import NOTHING_FOUND

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sacct"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def parse(name: str) -> tuple[list[JobRecord], list[SkippedRow]]:
    rows = list(parse_sacct_output(fixture_text(name), tz=UTC, source=name))
    return [r for r in rows if isinstance(r, JobRecord)], [r for r in rows if isinstance(r, SkippedRow)]


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def job(job_id: int = 1, *, submit: str = "2026-11-30T10:00:00", start: str | None = "2026-11-30T10:00:00",
        end: str | None = "2026-11-30T11:00:00", **extra: Any) -> dict[str, Any]:
    """One job of 22.05's `sacct --json` (dbv0.0.38) with defaults for what is not given."""
    record: dict[str, Any] = {
        "job_id": job_id, "name": "j", "user": "aigc-alice", "account": "aigc", "partition": "gpu", "qos": "normal",
        "state": {"current": "COMPLETED", "reason": "None"}, "nodes": "a100-01",
        "comment": {"administrator": None, "job": "", "system": None},
        "array": {"job_id": 0, "task_id": None}, "het": {"job_id": 0, "job_offset": None},
        "time": {"submission": int(ts(submit)), "eligible": int(ts(submit)), "start": int(ts(start)) if start else 0,
                 "end": int(ts(end)) if end else 0, "elapsed": 3600},
        "tres": {"allocated": [{"type": "cpu", "name": None, "id": 1, "count": 1},
                               {"type": "gres", "name": "gpu", "id": 1001, "count": 1}]},
        "steps": [],
    }
    record.update(extra)
    return record


def sacct_json(*jobs: dict[str, Any]) -> str:
    return json.dumps({"meta": {}, "errors": [] if jobs else [NOTHING_FOUND], "jobs": list(jobs)})


def test_slurm_22_05_records() -> None:
    records, skipped = parse("sacct-22.05.json")
    by_id: dict[str, list[JobRecord]] = {}
    for record in records:
        by_id.setdefault(record.job_id, []).append(record)
    assert sorted(by_id) == ["101", "102", "103", "104", "105", "106", "107", "108", "109"]
    assert [r.state for r in by_id["104"]] == ["REQUEUED", "COMPLETED"]
    running = by_id["103"][0]
    assert running.running and running.end_ts is None and running.start_ts == ts("2026-11-30T23:00:00")
    pending = by_id["106"][0]
    assert pending.start_ts is None and pending.node_list == "" and pending.tres.gpus == 0
    assert by_id["105"][0].tres.gpus == 0 and by_id["105"][0].aigc_class == "unknown"
    assert dict(by_id["107"][0].tres.other) == {"billing": "2", "gres/nic": "1", "license/matlab": "1"}
    cancelled = by_id["109"][0]
    assert (cancelled.state, cancelled.aigc_class) == ("CANCELLED", "batch")  # class from AdminComment
    assert by_id["101"][0].queue_wait_s == 300.0
    assert by_id["101"][0].sacct_gpu_util_pct is None  # 22.05 records no gres/gpuutil
    assert [(s.line_no, s.reason) for s in skipped] == [(9, "job 110: no submit time (every job has one)")]


def test_comment_with_pipes_and_newline_stays_one_record() -> None:
    records, _ = parse("sacct-22.05.json")
    job = next(r for r in records if r.job_id == "108")
    assert job.comment == "run|with|pipes; k=v\nsecond line aigc:type=infer"
    assert job.name == "vae|decode"
    assert job.aigc_class == "unknown"  # a tag in the comment is user text: the class comes from the AdminComment
    assert job.elapsed_s == 1800


def test_slurm_24_11_records() -> None:
    records, skipped = parse("sacct-24.11.json")
    ids = [r.job_id for r in records]
    assert ids == ["200_1", "200_2", "210+0", "210+1", "220", "220", "220", "230", "260", "270_[3-5]"]
    array = records[0]
    assert (array.job_id_raw, array.tres.memory_mib, array.aigc_class) == ("201", 8192.0, "unknown")  # aigc_class= in a comment is not trusted
    shards = records[4]
    assert (shards.tres.shards, dict(shards.tres.shards_by_type)) == (8, {"t4": 8})
    assert [r.state for r in records if r.job_id == "220"] == ["PREEMPTED", "REQUEUED", "RUNNING"]
    multi = next(r for r in records if r.job_id == "260")
    assert multi.comment == "line one\n\nline three|x aigc:type=train\n"
    assert multi.node_list == "a100-[01-02]" and multi.tres.gpus == 8
    pending_array = records[-1]
    assert pending_array.start_ts is None and pending_array.eligible_ts is None and pending_array.line_no == 12
    reasons = {s.line_no: s.reason for s in skipped}
    assert reasons == {9: "job 240: no submit time (every job has one)", 10: "expected a number, got 'one'"}


@pytest.mark.parametrize("name", ["sacct-22.05.json", "sacct-24.11.json", "sacct-22.05-recorded.json"])
def test_no_record_is_dropped_silently(name: str) -> None:
    records, skipped = parse(name)
    assert len(records) + len(skipped) == len(json.loads(fixture_text(name))["jobs"])


def test_not_sacct_json_raises() -> None:
    with pytest.raises(SlurmParseError, match="not JSON"):
        list(parse_sacct_output("JobID|JobIDRaw\n1|1\n"))
    with pytest.raises(SlurmParseError, match="Problem talking"):
        list(parse_sacct_output('{"errors": [{"error": "Problem talking to the database"}], "jobs": []}'))
    with pytest.raises(SlurmParseError, match="list of objects"):
        list(parse_sacct_output('{"errors": [], "jobs": [1]}'))


def test_no_jobs_means_no_records() -> None:
    assert list(parse_sacct_output(sacct_json())) == []


def test_steps_are_not_records() -> None:
    step = {"step": {"id": "batch", "job_id": 5}, "tres": {"requested": {"average": [], "max": []}}, "tasks": {"count": 1}}
    rows = list(parse_sacct_output(sacct_json(job(5, steps=[step]))))
    assert [type(r).__name__ for r in rows] == ["JobRecord"] and rows[0].job_id == "5"  # type: ignore[union-attr]


def test_a_bad_record_does_not_touch_its_neighbours() -> None:
    bad = job(8, tres={"allocated": [{"type": "cpu", "name": None, "count": "many"}]})
    rows = list(parse_sacct_output(sacct_json(job(7), bad, job(9), job(10, time={"submission": 0}))))
    assert [(type(r).__name__, r.line_no) for r in rows] == [
        ("JobRecord", 1), ("SkippedRow", 2), ("JobRecord", 3), ("SkippedRow", 4)]
    assert [r.job_id for r in rows if isinstance(r, JobRecord)] == ["7", "9"]


@pytest.mark.parametrize("admin_comment, expected", [
    ("aigc_class=batch", "batch"),                       # the hook's stamp
    ("aigc_class=train aigc_reclaim=no; aigc-reclaim: job 1 idle", "train"),
    ("site note; aigc_class=interactive", "unknown"),     # only the leading stamp counts
    ("aigc:type=infer", "unknown"),
    ("", "unknown"),
])
def test_aigc_class(admin_comment: str, expected: str) -> None:
    assert aigc_class_of(admin_comment) == expected


def test_sacct_args() -> None:
    query = SacctQuery(since=datetime(2026, 11, 30), until=datetime(2026, 12, 1), users=("aigc-alice",), partitions=("gpu",),
                       names=("a", "b"))
    args = sacct_args(query.since, query.until, query)
    assert {"--allocations", "--duplicates", "--json", "--user=aigc-alice", "--partition=gpu", "--name=a,b"} <= set(args)
    assert not any(a.startswith(("--parsable", "--delimiter", "--format")) for a in args)
    assert "--starttime=2026-11-30T00:00:00" in args and "--endtime=2026-12-01T00:00:00" in args
    assert "--allusers" in sacct_args(query.since, query.until, SacctQuery(query.since, query.until))
    # Steps carry 23.02+'s gres/gpuutil and gpumem, and -X makes slurmdbd leave them out.
    with_steps = sacct_args(query.since, query.until, SacctQuery(query.since, query.until, steps=True))
    assert "--allocations" not in with_steps and "--duplicates" in with_steps


def test_an_empty_answer_is_no_error() -> None:
    # 22.05 says "Nothing found" (ESLURM_REST_EMPTY_RESULT) beside "jobs": []; it failed every
    # window without a job, which stopped the learner on a quiet night and failed the tick.
    assert list(parse_sacct_output(sacct_json(), source="sacct window")) == []
    other = json.dumps({"meta": {}, "errors": [{"error_number": 1, "error": "Unspecified error"}], "jobs": []})
    with pytest.raises(SlurmParseError, match="Unspecified error"):
        list(parse_sacct_output(other, source="sacct window"))


def test_windows() -> None:
    edges = windows(datetime(2026, 11, 30), datetime(2026, 12, 2, 6), timedelta(days=1))
    assert edges == [(datetime(2026, 11, 30), datetime(2026, 12, 1)), (datetime(2026, 12, 1), datetime(2026, 12, 2)),
                     (datetime(2026, 12, 2), datetime(2026, 12, 2, 6))]
    with pytest.raises(ValueError):
        windows(datetime(2026, 11, 30), datetime(2026, 12, 1), timedelta(0))


@pytest.mark.parametrize("more", [timedelta(0), timedelta(microseconds=1), timedelta(hours=-1)])
def test_window_count_is_the_number_of_windows(more: timedelta) -> None:
    # The last microsecond of a span over 2**53 us is lost in a float quotient.
    chunk, since = timedelta(hours=2500), datetime(1456, 7, 8, 16)
    until = since + 2000 * chunk + more
    assert window_count(since, until, chunk) == len(windows(since, until, chunk)) == 2000 + (more > timedelta(0))
    assert window_count(until, since, chunk) == 0


# sacct -P's field names and how each is printed from a JSON job (for FakeSacct's text mode).
_TEXT_FIELDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "JobID": lambda j: str(j["job_id"]), "JobIDRaw": lambda j: str(j["job_id"]), "JobName": lambda j: j["name"],
    "User": lambda j: j["user"], "Account": lambda j: j["account"], "Partition": lambda j: j["partition"],
    "QOS": lambda j: j["qos"], "State": lambda j: j["state"]["current"],
    "Submit": lambda j: _iso(j["time"]["submission"]), "Eligible": lambda j: _iso(j["time"]["eligible"]),
    "Start": lambda j: _iso(j["time"]["start"]), "End": lambda j: _iso(j["time"]["end"]),
    "AllocTRES": lambda j: ",".join(f"{t['type']}/{t['name']}={t['count']}" if t["name"] else f"{t['type']}={t['count']}"
                                    for t in j["tres"]["allocated"]),
    "NodeList": lambda j: j["nodes"], "AdminComment": lambda j: j["comment"]["administrator"] or "",
    "Comment": lambda j: j["comment"]["job"], "ElapsedRaw": lambda j: str(j["time"]["elapsed"]),
}


def _iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S") if epoch else "Unknown"


class FakeSacct:
    """Behaves like sacct -S/-E on a list of jobs: lists each job that ran (or waited) during
    the window, printed as asked: `--json`, or `--parsable2 --delimiter=D --format=F` text
    where (as in the real sacct) a comment is printed as the user wrote it."""

    def __init__(self, jobs: Sequence[dict[str, Any]]) -> None:
        self.jobs = jobs
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        self.calls.append(list(argv))
        opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        lo, hi = ts(opts["--starttime"]), ts(opts["--endtime"])
        listed = [j for j in self.jobs
                  if (j["time"]["start"] or j["time"]["submission"]) < hi and (j["time"]["end"] or float("inf")) >= lo]
        if "--json" in argv:
            return CommandResult(tuple(argv), 0, sacct_json(*listed), "")
        fields, delimiter = opts["--format"].split(","), opts.get("--delimiter", "|")
        rows = [delimiter.join(fields)] + [delimiter.join(_TEXT_FIELDS[f](j) for f in fields) for j in listed]
        return CommandResult(tuple(argv), 0, "\n".join(rows) + "\n", "")


def test_reader_reads_by_window_and_yields_each_record_once() -> None:
    jobs = [
        job(1, submit="2026-11-29T20:00:00", start="2026-11-29T22:00:00", end="2026-11-30T02:00:00"),
        job(2, submit="2026-11-30T10:00:00", start="2026-11-30T23:00:00", end="2026-12-02T01:00:00"),
        job(3, submit="2026-12-01T05:00:00", start="2026-12-01T05:00:00", end=None),
        job(4, submit="2026-12-01T07:00:00", start=None, end=None),
    ]
    fake = FakeSacct(jobs)
    reader = SacctReader(SlurmCli(runner=fake, slurm_version=(22, 5, 8)), tz=UTC, chunk=timedelta(hours=12))
    rows = list(reader.rows(SacctQuery(since=datetime(2026, 11, 30), until=datetime(2026, 12, 2, 12))))
    assert len(fake.calls) == 5
    assert sorted(r.job_id for r in rows if isinstance(r, JobRecord)) == ["1", "2", "3", "4"]
    assert all(call[0] == "sacct" for call in fake.calls)


# A comment that closes its own row and adds a record: 8 GPUs for 24 h (192 GPU-hours) on aigc-bob's
# vip account, in the delimiter the old reader used (0x1F, typeable with printf) and in plain `|`.
def _forged_comment(delimiter: str) -> str:
    forged = ["666", "666", "forged", "aigc-bob", "vip", "gpu", "normal", "COMPLETED", "2026-11-30T10:00:00",
              "2026-11-30T10:00:00", "2026-11-30T10:00:00", "2026-12-01T10:00:00", "cpu=8,gres/gpu=8,gres/gpu:a100=8",
              "a100-01", "aigc_class=train", ""]
    return "x" + delimiter + "60\n" + delimiter.join(forged)


@pytest.mark.parametrize("delimiter", ["\x1f", "|", "\u241f"])
def test_forged_comment_cannot_add_or_alter_a_record(delimiter: str) -> None:
    victim = job(1, user="aigc-alice", account="aigc", comment={"administrator": None, "job": _forged_comment(delimiter), "system": None},
                 name="exp" + delimiter + "1\nJobId=666")
    reader = SacctReader(SlurmCli(runner=FakeSacct([victim]), slurm_version=(22, 5, 8)), tz=UTC)
    rows = list(reader.rows(SacctQuery(since=datetime(2026, 11, 30), until=datetime(2026, 12, 1))))
    assert [(type(r).__name__, getattr(r, "job_id", None)) for r in rows] == [("JobRecord", "1")]
    (record,) = rows
    assert isinstance(record, JobRecord)
    assert (record.user, record.account, record.tres.gpus, record.elapsed_s) == ("aigc-alice", "aigc", 1, 3600)
    assert record.comment == _forged_comment(delimiter) and record.name == "exp" + delimiter + "1\nJobId=666"


def test_gpuutil_and_gpumem_from_slurm_23_02_step_tres() -> None:
    """23.02+ with NVML autodetection: gres/gpuutil (task sum, averaged over tasks) and gres/gpumem (bytes)."""
    records, _ = parse("sacct-24.11-gpuutil.json")
    by_id = {r.job_id: r for r in records}
    two = by_id["301"]  # one batch task on 2 GPUs: 150 (sum) -> 75 per GPU; 12 GiB peak
    assert (two.sacct_gpu_util_pct, two.sacct_gpu_mem_mib) == (75.0, 12288.0)
    four = by_id["302"]  # srun -n4, one GPU each: 40 average per task -> 40 per GPU; busiest step wins
    assert four.sacct_gpu_util_pct == 40.0
    assert by_id["303"].sacct_gpu_util_pct is None and by_id["303"].sacct_gpu_mem_mib is None  # not recorded


def test_reader_raises_on_sacct_failure() -> None:
    def failing(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", "sacct: error: Problem talking to the database")

    reader = SacctReader(SlurmCli(runner=failing, slurm_version=(22, 5, 8)), tz=UTC)
    with pytest.raises(SlurmCommandError, match="Problem talking to the database"):
        list(reader.rows(SacctQuery(since=datetime(2026, 11, 30), until=datetime(2026, 12, 1))))


def test_recorded_22_05_output_of_the_local_cluster() -> None:
    """The jobs recorded from the local cluster's slurmdbd (Debian 12, Slurm 22.05.8), in sacct --json's shape."""
    records, skipped = parse("sacct-22.05-recorded.json")
    assert skipped == []
    states = [(r.job_id, r.state) for r in records]
    assert [s for j, s in states if j == "915"] == ["REQUEUED", "COMPLETED"]  # requeued: two records
    never_started = next(r for r in records if r.job_id == "920")
    assert (never_started.state, never_started.start_ts, never_started.node_list) == ("CANCELLED", None, "")
    running = next(r for r in records if r.job_id == "2100")
    assert running.running and running.tres.shards == 8
    piped = next(r for r in records if r.job_id == "919")
    assert piped.name == "rec|pipe" and piped.comment == "run|with|pipes\nsecond line aigc:type=infer"
    assert piped.aigc_class == "unknown"  # its only class is a user's tag
    assert next(r for r in records if r.job_id == "73").tres.gpus == 0


def _live(comment: str, admin_comment: str) -> Any:
    """A runner answering `SlurmCli.job` as Slurm 22.05 does (`squeue --json`)."""
    asked: list[list[str]] = []

    def runner(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        asked.append(list(argv))
        if list(argv) == ["scontrol", "--version"]:
            return CommandResult(tuple(argv), 0, "slurm-wlm 22.05.8\n", "")
        entry = {"job_id": 2100, "name": "rec-long", "user_name": "root", "job_state": "RUNNING",
                 "comment": comment, "admin_comment": admin_comment}
        return CommandResult(tuple(argv), 0, json.dumps({"jobs": [entry], "errors": []}), "")

    runner.asked = asked  # type: ignore[attr-defined]
    return runner


def test_running_jobs_take_their_comment_from_slurmctld() -> None:
    """22.05's slurmdbd has no comment for a job that started at once until it ends."""
    records, _ = parse("sacct-22.05-recorded.json")
    runner = _live("aigc:type=infer", "aigc_class=infer")
    enriched = list(with_live_comments(records, SlurmCli(runner=runner)))
    running = next(r for r in enriched if isinstance(r, JobRecord) and r.job_id == "2100")
    assert (running.comment, running.aigc_class) == ("aigc:type=infer", "infer")
    assert runner.asked == [["scontrol", "--version"], ["squeue", "--json"]]  # finished jobs keep sacct's comment
    assert [r.job_id for r in enriched if isinstance(r, JobRecord)] == [r.job_id for r in records]


def test_live_comments_are_best_effort() -> None:
    records, _ = parse("sacct-22.05-recorded.json")

    def down(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", "slurm_load_jobs error: Connection reset by peer")

    enriched = [r for r in with_live_comments(records, SlurmCli(runner=down)) if isinstance(r, JobRecord)]
    assert next(r for r in enriched if r.job_id == "2100").aigc_class == "unknown"
    assert len(enriched) == len(records)
