"""sacct output of Slurm 22.05 and 24.11: every row parsed or skipped with its reason."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurm_aigc.errors import SlurmCommandError, SlurmParseError
from slurm_aigc.report.sacct import (
    DELIMITER,
    FIELDS,
    JobRecord,
    SacctQuery,
    SacctReader,
    SkippedRow,
    aigc_class_of,
    parse_sacct_output,
    sacct_args,
    windows,
    with_live_comments,
)
from slurm_aigc.slurm import CommandResult, SlurmCli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sacct"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8").replace("\u241f", DELIMITER)


def parse(name: str) -> tuple[list[JobRecord], list[SkippedRow]]:
    rows = list(parse_sacct_output(fixture_text(name), tz=UTC, source=name))
    return [r for r in rows if isinstance(r, JobRecord)], [r for r in rows if isinstance(r, SkippedRow)]


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def line(**values: str) -> str:
    """One sacct row with defaults for every field not given."""
    defaults = dict.fromkeys(FIELDS, "")
    defaults.update(JobID="1", JobIDRaw="1", State="COMPLETED", Submit="2026-11-30T10:00:00",
                    Start="2026-11-30T10:00:00", End="2026-11-30T11:00:00", ElapsedRaw="3600")
    defaults.update(values)
    return DELIMITER.join(defaults[name] for name in FIELDS)


HEADER = DELIMITER.join(FIELDS)


def test_slurm_22_05_rows() -> None:
    records, skipped = parse("sacct-22.05.txt")
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
    assert [(s.line_no, s.reason) for s in skipped] == [(10, "3 fields, expected 17")]


def test_comment_with_pipes_and_newline_stays_one_row() -> None:
    records, _ = parse("sacct-22.05.txt")
    job = next(r for r in records if r.job_id == "108")
    assert job.comment == "run|with|pipes; k=v\nsecond line aigc:type=infer"
    assert job.name == "vae|decode"
    assert job.aigc_class == "unknown"  # a tag in the comment is user text: the class comes from the AdminComment
    assert job.elapsed_s == 1800
    # The row after it starts on the right line.
    assert next(r for r in records if r.job_id == "109").line_no == 13


def test_slurm_24_11_rows() -> None:
    records, skipped = parse("sacct-24.11.txt")
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
    assert pending_array.start_ts is None and pending_array.eligible_ts is None and pending_array.line_no == 16
    reasons = {s.line_no: s.reason for s in skipped}
    assert set(reasons) == {10, 11}
    assert "Submit '2026-13-30T06:00:00'" in reasons[10]
    assert "cpu='one'" in reasons[11]


@pytest.mark.parametrize("name", ["sacct-22.05.txt", "sacct-24.11.txt"])
def test_no_row_is_dropped_silently(name: str) -> None:
    """Every physical line is a header, a record's line, or a skipped row's line."""
    text = fixture_text(name)
    records, skipped = parse(name)
    physical = text.rstrip("\n").split("\n")
    record_lines = sum(1 + r.comment.count("\n") + r.name.count("\n") for r in records)
    skipped_lines = sum(1 + s.raw.count("\n") for s in skipped)
    assert 1 + record_lines + skipped_lines == len(physical)


def test_header_must_match_requested_fields() -> None:
    wrong = HEADER.replace("AllocTRES", "ReqTRES")
    with pytest.raises(SlurmParseError, match="does not match"):
        list(parse_sacct_output(wrong + "\n" + line() + "\n"))
    with pytest.raises(SlurmParseError, match="empty output"):
        list(parse_sacct_output(""))
    # Case differences between versions are fine.
    rows = list(parse_sacct_output(HEADER.upper() + "\n" + line() + "\n", tz=UTC))
    assert isinstance(rows[0], JobRecord)


def test_header_only_means_no_jobs() -> None:
    assert list(parse_sacct_output(HEADER + "\n")) == []


def test_step_rows_are_reported_not_counted() -> None:
    rows = list(parse_sacct_output("\n".join([HEADER, line(JobID="5.batch", JobIDRaw="5.batch"), line(JobID="5", JobIDRaw="5")]), tz=UTC))
    assert isinstance(rows[0], SkippedRow) and "job step 5.batch" in rows[0].reason
    assert isinstance(rows[1], JobRecord) and rows[1].job_id == "5"


def test_bad_line_does_not_swallow_the_next_one() -> None:
    too_many = line(JobID="7") + DELIMITER + "extra"
    short = "8" + DELIMITER + "8"
    text = "\n".join([HEADER, too_many, line(JobID="9"), short, line(JobID="10"), "trailing"])
    rows = list(parse_sacct_output(text, tz=UTC))
    kinds = [(type(r).__name__, r.line_no) for r in rows]
    assert kinds == [("SkippedRow", 2), ("JobRecord", 3), ("SkippedRow", 4), ("JobRecord", 5), ("SkippedRow", 6)]
    assert rows[0].reason == "18 fields, expected 17"  # type: ignore[union-attr]


def test_non_numeric_elapsed_and_missing_submit_are_reasons() -> None:
    rows = list(parse_sacct_output("\n".join([HEADER, line(ElapsedRaw="soon"), line(Submit="Unknown")]), tz=UTC))
    assert [r.reason for r in rows if isinstance(r, SkippedRow)] == [
        "ElapsedRaw 'soon' is not a number of seconds", "Submit 'Unknown': every job has a submit time"]


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
    assert {"--allocations", "--duplicates", "--parsable2", "--noconvert", "--user=aigc-alice", "--partition=gpu", "--name=a,b"} <= set(args)
    assert f"--delimiter={DELIMITER}" in args
    assert f"--format={','.join(FIELDS)}" in args
    assert "--starttime=2026-11-30T00:00:00" in args and "--endtime=2026-12-01T00:00:00" in args
    assert "--allusers" in sacct_args(query.since, query.until, SacctQuery(query.since, query.until))


def test_windows() -> None:
    edges = windows(datetime(2026, 11, 30), datetime(2026, 12, 2, 6), timedelta(days=1))
    assert edges == [(datetime(2026, 11, 30), datetime(2026, 12, 1)), (datetime(2026, 12, 1), datetime(2026, 12, 2)),
                     (datetime(2026, 12, 2), datetime(2026, 12, 2, 6))]
    with pytest.raises(ValueError):
        windows(datetime(2026, 11, 30), datetime(2026, 12, 1), timedelta(0))


class FakeSacct:
    """A runner that behaves like sacct -S/-E on a list of jobs: lists each job that ran
    (or waited) during the window, as the real one does."""

    def __init__(self, jobs: Sequence[dict[str, str]]) -> None:
        self.jobs = jobs
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        self.calls.append(list(argv))
        opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        lo, hi = ts(opts["--starttime"]), ts(opts["--endtime"])
        rows = [HEADER]
        for job in self.jobs:
            start = ts(job["Start"]) if job["Start"] != "Unknown" else ts(job["Submit"])
            end = ts(job["End"]) if job["End"] != "Unknown" else float("inf")
            if start < hi and end >= lo:
                rows.append(line(**job))
        return CommandResult(tuple(argv), 0, "\n".join(rows) + "\n", "")


def test_reader_reads_by_window_and_yields_each_record_once() -> None:
    jobs = [
        {"JobID": "1", "JobIDRaw": "1", "Submit": "2026-11-29T20:00:00", "Start": "2026-11-29T22:00:00", "End": "2026-11-30T02:00:00"},
        {"JobID": "2", "JobIDRaw": "2", "Submit": "2026-11-30T10:00:00", "Start": "2026-11-30T23:00:00", "End": "2026-12-02T01:00:00"},
        {"JobID": "3", "JobIDRaw": "3", "Submit": "2026-12-01T05:00:00", "Start": "2026-12-01T05:00:00", "End": "Unknown"},
        {"JobID": "4", "JobIDRaw": "4", "Submit": "2026-12-01T07:00:00", "Start": "Unknown", "End": "Unknown"},
    ]
    fake = FakeSacct(jobs)
    reader = SacctReader(SlurmCli(runner=fake), tz=UTC, chunk=timedelta(hours=12))
    rows = list(reader.rows(SacctQuery(since=datetime(2026, 11, 30), until=datetime(2026, 12, 2, 12))))
    assert len(fake.calls) == 5
    assert sorted(r.job_id for r in rows if isinstance(r, JobRecord)) == ["1", "2", "3", "4"]
    assert all(call[0] == "sacct" for call in fake.calls)


def test_reader_raises_on_sacct_failure() -> None:
    def failing(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", "sacct: error: Problem talking to the database")

    reader = SacctReader(SlurmCli(runner=failing), tz=UTC)
    with pytest.raises(SlurmCommandError, match="Problem talking to the database"):
        list(reader.rows(SacctQuery(since=datetime(2026, 11, 30), until=datetime(2026, 12, 1))))


def test_recorded_22_05_output_of_the_local_cluster() -> None:
    """Recorded from the local cluster's slurmdbd (Debian 12, Slurm 22.05.8) with our exact arguments."""
    records, skipped = parse("sacct-22.05-recorded.txt")
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


def test_running_jobs_take_their_comment_from_slurmctld() -> None:
    """22.05's slurmdbd has no comment for a job that started at once until it ends."""
    records, _ = parse("sacct-22.05-recorded.txt")
    asked: list[list[str]] = []

    def scontrol(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        asked.append(list(argv))
        line = f"JobId={argv[-1]} JobName=rec-long UserId=root(0) JobState=RUNNING Comment=aigc:type=infer AdminComment=aigc_class=infer"
        return CommandResult(tuple(argv), 0, line + "\n", "")

    enriched = list(with_live_comments(records, SlurmCli(runner=scontrol)))
    running = next(r for r in enriched if isinstance(r, JobRecord) and r.job_id == "2100")
    assert (running.comment, running.aigc_class) == ("aigc:type=infer", "infer")
    assert asked == [["scontrol", "show", "job", "-o", "2100"]]  # finished jobs keep sacct's comment
    assert [r.job_id for r in enriched if isinstance(r, JobRecord)] == [r.job_id for r in records]


def test_live_comments_are_best_effort() -> None:
    records, _ = parse("sacct-22.05-recorded.txt")

    def down(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", "slurm_load_jobs error: Connection reset by peer")

    enriched = [r for r in with_live_comments(records, SlurmCli(runner=down)) if isinstance(r, JobRecord)]
    assert next(r for r in enriched if r.job_id == "2100").aigc_class == "unknown"
    assert len(enriched) == len(records)
