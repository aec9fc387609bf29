"""`slurm-aigc report` and `slurm-aigc report job` through click's CliRunner with a fake sacct."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc import fsio
from slurm_aigc.cli.main import cli
from slurm_aigc.cli.report import ReportEnv
from slurm_aigc.db import ActionRecord, JobGpuSample, open_database, transaction
from slurm_aigc.errors import AigcError
from slurm_aigc.report.sacct import MAX_WINDOWS, SacctQuery, SacctReader
from slurm_aigc.slurm import CommandResult, SlurmCli
from tests.unit.report_fixtures import stamped_sacct

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sacct"
NOW = datetime(2026, 12, 1, 0, 0, 0)
WINDOW = ["--since", "2026-11-30T00:00:00", "--until", "2026-12-01T00:00:00"]


class RecordedSacct:
    """Answers every sacct call with a recorded output, as sacct would for a wide window;
    more than `MAX_CALLS` calls is a flood of slurmdbd, and fails the test at once."""

    MAX_CALLS = 100

    def __init__(self, name: str) -> None:
        self.text = stamped_sacct(name)  # classes stamped as the hook would have
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        self.calls.append(list(argv))
        assert len(self.calls) <= self.MAX_CALLS, f"sacct called {len(self.calls)} times: {argv}"
        return CommandResult(tuple(argv), 0, self.text, "")


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


def env(sacct: RecordedSacct) -> ReportEnv:
    # A set version: the recorded sacct answers every call, `scontrol --version` included.
    return ReportEnv(slurm=lambda: SlurmCli(runner=sacct, slurm_version=(22, 5, 8)), database=lambda url: open_database(url), now=lambda: NOW)


def invoke(sacct: RecordedSacct, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["report", *args], obj=env(sacct))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def seed(factory: sessionmaker[Session]) -> None:
    start = datetime(2026, 11, 30, 10, 5).timestamp()
    with transaction(factory) as session:
        for gpu in range(2):
            for i in range(720):
                session.add(JobGpuSample(ts=start + 10 * i, node="a100-01", job_id="101", gpu_index=gpu,
                                         sm_util_pct=60.0, memory_used_mib=4096.0, memory_total_mib=81920.0))
        session.add(ActionRecord(observation_key="k1", ts_intent=datetime(2026, 11, 30, 8, 55).timestamp(), job_id="104",
                                 verdict="idle", action="requeue", state="done", dry_run=False, gpu_hours_recovered=3.0))


def test_json_report_with_samples_and_actions(db_url: str) -> None:
    seed(open_database(db_url))
    sacct = RecordedSacct("sacct-22.05.json")
    code, out, err = invoke(sacct, *WINDOW, "--group-by", "class,user", "--format", "json", "--db", db_url, "--chunk-hours", "6")
    assert code == 0, err
    assert len(sacct.calls) == 4  # four 6-hour windows, each record kept once
    data = json.loads(out)
    groups = {(g["group"]["class"], g["group"]["user"]): g for g in data["groups"]}
    train = groups[("train", "aigc-alice")]
    assert train["gpu_hours_allocated"] == pytest.approx(12.0)
    assert train["gpu_hours_used"] == pytest.approx(2 * 2 * 0.6)
    assert train["efficiency"] == pytest.approx(0.6)
    assert train["jobs_requeued_by_aigc"] == 1 and train["gpu_hours_recovered"] == 3.0
    assert data["total"]["jobs"] == 9
    # The fake repeats its malformed line in each of the four windows; each is reported.
    assert "4 sacct row(s) skipped" in err and err.count("line 9: job 110: no submit time") == 4


def test_filters_and_table(db_url: str) -> None:
    sacct = RecordedSacct("sacct-24.11.json")
    code, out, _ = invoke(sacct, *WINDOW, "--class", "infer", "-u", "aigc-bob", "-g", "gpu_type", "--db", db_url)
    assert code == 0
    assert "--user=aigc-bob" in sacct.calls[0]
    lines = out.splitlines()
    assert lines[0].startswith("GPU report") and "grouped by gpu_type" in lines[0]
    t4 = next(line for line in lines if line.startswith("t4"))
    assert t4.split()[1:4] == ["1", "1", "2.00"]  # het job 210+0: 2 t4 GPUs for 1 h
    assert not any(line.startswith("a100") for line in lines)


def test_csv_to_output_file(db_url: str, tmp_path: Path) -> None:
    target = tmp_path / "out" / "report.csv"
    code, _, err = invoke(RecordedSacct("sacct-22.05.json"), *WINDOW, "-g", "day", "--format", "csv", "--output", str(target), "--db", db_url)
    assert code == 0 and f"wrote {target}" in err
    table = list(csv.DictReader(io.StringIO(target.read_text())))
    assert [r["day"] for r in table] == ["2026-11-30", "TOTAL"]


def test_html_report(db_url: str) -> None:
    code, out, _ = invoke(RecordedSacct("sacct-22.05.json"), *WINDOW, "--format", "html", "--db", db_url)
    assert code == 0 and out.count("data:image/png;base64,") == 3


def test_bad_options_exit_2(db_url: str) -> None:
    sacct = RecordedSacct("sacct-22.05.json")
    assert invoke(sacct, *WINDOW, "-g", "qos", "--db", db_url)[0] == 2
    assert invoke(sacct, "--since", "yesterday-ish", "--db", db_url)[0] == 2
    assert invoke(sacct, *WINDOW, "--shards-per-gpu", "a100=lots", "--db", db_url)[0] == 2
    assert sacct.calls == []


def test_job_view(db_url: str) -> None:
    seed(open_database(db_url))
    sacct = RecordedSacct("sacct-22.05.json")
    code, out, _ = invoke(sacct, "job", "101", "--db", db_url)
    assert code == 0
    assert "--jobs=101" in sacct.calls[0]
    assert "a100-01 GPU0: util mean 60%" in out and "a100-01 GPU1" in out


def test_job_view_json_lists_all_segments_and_actions(db_url: str) -> None:
    seed(open_database(db_url))
    code, out, _ = invoke(RecordedSacct("sacct-22.05.json"), "job", "104", "--format", "json", "--db", db_url)
    data = json.loads(out)
    assert code == 0
    assert [s["state"] for s in data["segments"]] == ["REQUEUED", "COMPLETED"]
    assert data["gpu_hours_allocated"] == pytest.approx(8.0)
    assert [a["action"] for a in data["actions"]] == ["requeue"]
    assert data["gpus_series"] == []


def test_shards_per_gpu_default_to_the_policy_inventory(db_url: str, tmp_path: Path) -> None:
    # Job 102 holds shard:20 on a100-02: 1/4 of an A100 at 80 shards per GPU, 1/2 at 40.
    policy = tmp_path / "policy.yaml"
    policy.write_text("inventory: {gpu_types: {a100: {memory_gib: 80, shards_per_gpu: 40}, t4: {memory_gib: 16}}}\n")
    code, out, err = invoke(RecordedSacct("sacct-22.05.json"), *WINDOW, "--policy", str(policy), "--format", "json", "--db", db_url)
    assert code == 0, err
    assert json.loads(out)["shards_per_gpu"] == {"a100": 40}  # t4 has no shards in this inventory

    def job_102(*job_options: str) -> float:
        code, out, err = invoke(RecordedSacct("sacct-22.05.json"), "--policy", str(policy), "job", "102", *job_options,
                                "--format", "json", "--db", db_url)
        assert code == 0, err
        return float(json.loads(out)["gpu_hours_allocated"])

    halves = job_102()  # `report job` takes the group's --policy
    assert halves > 0 and halves == pytest.approx(2 * job_102("--shards-per-gpu", "a100=80"))
    # The option overrides the inventory, in the group as in `report job`.
    code, out, _ = invoke(RecordedSacct("sacct-22.05.json"), *WINDOW, "--policy", str(policy), "--shards-per-gpu", "a100=80,t4=16",
                          "--format", "json", "--db", db_url)
    assert code == 0 and json.loads(out)["shards_per_gpu"] == {"a100": 80, "t4": 16}


# ---------------------------------------------------------------- bad input: one line, never a traceback

LAST_HOUR = ["--since", "now-1hours"]


def run(sacct: RecordedSacct, *args: str, report_env: ReportEnv | None = None) -> Result:
    """The raw result: `slurm-aigc` prints a click error (SystemExit) or an AigcError as one line."""
    return CliRunner().invoke(cli, ["report", *args], obj=report_env or env(sacct))


def test_an_until_after_now_reads_sacct_only_up_to_now(db_url: str) -> None:
    # Before the fix --until 2099-01-01 ran sacct one day at a time up to 2099: 26,324 calls.
    calls = {}
    for until in ("now", "2099-01-01"):
        sacct = RecordedSacct("sacct-22.05.json")
        code, _, err = invoke(sacct, *LAST_HOUR, "--until", until, "--db", db_url)
        assert code == 0, err
        calls[until] = sacct.calls
    assert len(calls["2099-01-01"]) == len(calls["now"]) == 1
    assert calls["2099-01-01"] == calls["now"]  # --endtime=now


def test_a_window_of_too_many_sacct_calls_is_refused_before_any(db_url: str) -> None:
    # --since 1970-01-01 at the default day-long windows was 20,000 sacct calls on slurmdbd.
    sacct = RecordedSacct("sacct-22.05.json")
    result = run(sacct, "--since", "1970-01-01", "--db", db_url)
    assert result.exit_code == 2 and "sacct windows of 24 h; at most 2,000" in result.stderr, result.stderr
    assert sacct.calls == []
    wide = run(RecordedSacct("sacct-22.05.json"), "--since", "now-3000days", "--chunk-hours", "720", "--db", db_url)
    assert wide.exit_code == 0, wide.stderr  # the same span in larger windows is fine


class EmptySacct(RecordedSacct):
    """Answers every sacct call with no jobs, up to as many calls as a read may make."""

    MAX_CALLS = MAX_WINDOWS

    def __init__(self) -> None:
        self.text = json.dumps({"meta": {}, "errors": [], "jobs": []})
        self.calls = []


HOURS_1_5, HOURS_2500, US = timedelta(hours=1.5), timedelta(hours=2500), timedelta(microseconds=1)


@pytest.mark.parametrize(("chunk_hours", "span", "count"), [
    (1.5, MAX_WINDOWS * HOURS_1_5, MAX_WINDOWS),  # whole chunks
    (1.5, MAX_WINDOWS * HOURS_1_5 + US, MAX_WINDOWS + 1),
    (1.5, (MAX_WINDOWS - 1) * HOURS_1_5 + timedelta(minutes=30), MAX_WINDOWS),  # the last one partial
    (1.5, MAX_WINDOWS * HOURS_1_5 + timedelta(minutes=30), MAX_WINDOWS + 1),
    (2500.0, MAX_WINDOWS * HOURS_2500, MAX_WINDOWS),  # 570 years: over 2**53 microseconds
    (2500.0, MAX_WINDOWS * HOURS_2500 + US, MAX_WINDOWS + 1),
])
def test_the_report_refuses_exactly_the_ranges_the_sacct_reader_refuses(db_url: str, chunk_hours: float,
                                                                        span: timedelta, count: int) -> None:
    # The command counted windows in floats: 2,000 windows of 2,500 h and a microsecond came to
    # 2,000, the reader's edges to 2,001; the report passed its own check and then failed in the
    # reader, with a message that names neither --since nor --chunk-hours.
    since = NOW - span
    sacct, reader_sacct = EmptySacct(), EmptySacct()
    result = run(sacct, "--since", since.isoformat(), "--chunk-hours", f"{chunk_hours:g}", "--db", db_url)
    reader = SacctReader(SlurmCli(runner=reader_sacct, slurm_version=(22, 5, 8)), chunk=timedelta(hours=chunk_hours))
    if count <= MAX_WINDOWS:  # read by both
        assert result.exit_code == 0, result.stderr
        assert list(reader.rows(SacctQuery(since=since, until=NOW))) == []
        assert len(sacct.calls) == len(reader_sacct.calls) == count
        return
    assert result.exit_code == 2, result.stderr
    assert f"is {count:,} sacct windows of {chunk_hours:g} h; at most {MAX_WINDOWS:,}: give a later --since " \
           "or a larger --chunk-hours" in result.stderr
    with pytest.raises(AigcError, match=f"is {count:,} sacct windows"):
        list(reader.rows(SacctQuery(since=since, until=NOW)))
    assert sacct.calls == reader_sacct.calls == []


@pytest.mark.parametrize("hours", ["0", "-1", "nan", "inf", "1e-9", "0.05", "1e300"])
def test_chunk_hours_must_be_a_sane_finite_number(db_url: str, hours: str) -> None:
    # Before the fix nan and 1e-9 passed (a billion windows of an hour), 1e300 raised OverflowError.
    # One second, not an hour: a regression then fails on the fake's call limit, not out of memory.
    sacct = RecordedSacct("sacct-22.05.json")
    result = run(sacct, "--since", "now-1seconds", "--chunk-hours", hours, "--db", db_url)
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2
    assert "Invalid value for '--chunk-hours'" in result.stderr and "from 0.1 to 100000" in result.stderr
    assert sacct.calls == []


@pytest.mark.parametrize(("args", "message"), [
    (["--since", "now-99999999days"], "Invalid value for --since: out of range: 'now-99999999days'"),
    (["--until", "now+99999999999weeks"], "Invalid value for --until: out of range: 'now+99999999999weeks'"),
    (["--since", "0001-01-01"], "Invalid value for --since: out of range: '0001-01-01'"),
    (["--since", "2099-01-01"], "Invalid value for --since: '2099-01-01' is not in the past"),
    (["--since", "now-1hours", "--until", "now-2hours"], "Invalid value for --until: 'now-2hours' is not after --since 'now-1hours'"),
])
def test_bad_windows_are_named_one_at_a_time(db_url: str, args: list[str], message: str) -> None:
    # Before the fix: OverflowError tracebacks, and one message for two conditions.
    sacct = RecordedSacct("sacct-22.05.json")
    result = run(sacct, *args, "--db", db_url)
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2
    assert message in result.stderr and "chunk" not in result.stderr
    assert sacct.calls == []


@pytest.mark.parametrize("where", ["under a file", "/proc/version"])
def test_an_output_that_cannot_be_written_is_one_error_naming_it(db_url: str, tmp_path: Path, where: str) -> None:
    # Before the fix: FileExistsError and OSError tracebacks.
    afile = tmp_path / "afile"
    afile.write_text("kept\n")
    target = afile / "r.csv" if where == "under a file" else Path(where)
    result = run(RecordedSacct("sacct-22.05.json"), *LAST_HOUR, "--output", str(target), "--db", db_url)
    assert isinstance(result.exception, AigcError) and result.exit_code == 1  # main() prints it as one line
    assert f"cannot write the report to {target}: " in str(result.exception)
    assert afile.read_text() == "kept\n"


def test_a_report_that_fails_to_be_written_leaves_the_old_one_whole(db_url: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Before the fix the file was truncated, then written in place.
    target = tmp_path / "out" / "r.csv"
    target.parent.mkdir()
    target.write_text("yesterday's report\n")

    def no_room(*_args: object) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fsio.os, "replace", no_room)
    result = run(RecordedSacct("sacct-22.05.json"), *LAST_HOUR, "--output", str(target), "--db", db_url)
    assert result.exit_code == 1 and "No space left on device" in str(result.exception)
    assert target.read_text() == "yesterday's report\n" and [p.name for p in target.parent.iterdir()] == ["r.csv"]  # no temp file


def test_a_device_is_written_to_and_a_symlink_through(db_url: str, tmp_path: Path) -> None:
    # Replaced by a temp file, /dev/null (run as root) would become a regular file.
    result = run(RecordedSacct("sacct-22.05.json"), *LAST_HOUR, "--output", "/dev/null", "--db", db_url)
    assert result.exit_code == 0 and "wrote /dev/null" in result.stderr and Path("/dev/null").is_char_device()
    (tmp_path / "latest.csv").symlink_to("r.csv")
    result = run(RecordedSacct("sacct-22.05.json"), *LAST_HOUR, "--format", "csv", "--output", str(tmp_path / "latest.csv"),
                 "--db", db_url)
    assert result.exit_code == 0 and (tmp_path / "latest.csv").is_symlink()
    assert (tmp_path / "r.csv").read_text().startswith("group,jobs,")


def test_a_missing_database_is_not_created(tmp_path: Path) -> None:
    # Before the fix `report --db sqlite:///typo.db` created typo.db (and its folder and lock file).
    from slurm_aigc.cli.env import default_env

    missing = tmp_path / "nodir" / "typo.db"
    sacct = RecordedSacct("sacct-22.05.json")
    result = run(sacct, *LAST_HOUR, "--db", f"sqlite:///{missing}",
                 report_env=replace(env(sacct), database=default_env().database))  # the real env's opener
    assert result.exit_code == 0, result.stderr  # the report, without GPU-hours used
    assert f"no sample database (sqlite:///{missing}: no such database file" in result.stderr
    assert list(tmp_path.iterdir()) == []
