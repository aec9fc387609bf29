"""`slurm-aigc replay convert|show` and `replay --from-sacct ... --output` through click's CliRunner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.cli.replay import ReplayEnv, replay
from slurm_aigc.db import JobGpuSample, open_database, transaction
from slurm_aigc.replay.generator import GeneratorError
from slurm_aigc.replay.traces import DEFAULT_FILES
from slurm_aigc.replay.workload import COLUMNS
from slurm_aigc.replay.workload_files import read_workload
from slurm_aigc.slurm import CommandResult
from tests.unit.sacct_json import DELIMITER, FIELDS, text_to_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "etc" / "slurm-aigc.yaml"
FIXTURE_FILES = {
    "alibaba-2023": "openb_pod_list_small.csv",
    "genai-2026": "lora_request_trace_small.csv",
    "philly": "pollux_philly_jobs_small.csv",
}


def traces_dir(tmp_path: Path) -> Path:
    """The shared traces layout, holding the small fixtures."""
    root = tmp_path / "traces"
    for trace, name in FIXTURE_FILES.items():
        target = root / DEFAULT_FILES[trace]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / name, target)
    return root


def test_convert_writes_a_valid_workload_and_reports_skipped_rows(tmp_path: Path) -> None:
    out = tmp_path / "w.csv"
    result = CliRunner().invoke(
        replay,
        ["convert", "--trace", "philly", "--input", str(FIXTURES / FIXTURE_FILES["philly"]), "--output", str(out),
         "--seed", "4", "--compression", "30", "--minutes", "2", "--load", "5", "--set", "finetune.loading_s=3"],
    )
    assert result.exit_code == 0, result.output
    assert "philly: skipped 4 malformed row(s) of 9" in result.output
    assert "gpu_time 999" in result.output
    workload = read_workload(out)
    assert workload.meta["seed"] == "4" and workload.meta["compression"] == "30"
    params = json.loads(workload.meta["params"])
    assert params["arrival_window_s"] == 120.0 and params["finetune"]["loading_s"] == 3.0
    assert "class" in result.output and "finetune" in result.output


def test_convert_mix_from_a_traces_folder_is_deterministic(tmp_path: Path) -> None:
    root = traces_dir(tmp_path)
    outputs = []
    for name in ("a.csv", "b.csv"):
        result = CliRunner().invoke(replay, ["convert", "--trace", "mix", "--input", str(root), "-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        outputs.append((tmp_path / name).read_text())
    assert outputs[0] == outputs[1]
    sources = {j.source.split(":")[0] for j in read_workload(tmp_path / "a.csv").jobs}
    assert sources <= {"alibaba-2023", "genai-2026", "philly"} and len(sources) >= 2


def test_convert_rejects_bad_options(tmp_path: Path) -> None:
    path = str(FIXTURES / FIXTURE_FILES["philly"])
    both = CliRunner().invoke(replay, ["convert", "--trace", "philly", "--input", path, "-o", str(tmp_path / "x.csv"),
                                       "--minutes", "2", "--duration-s", "100"])
    assert both.exit_code != 0 and "not both" in both.output
    bad_set = CliRunner().invoke(replay, ["convert", "--trace", "philly", "--input", path, "-o", str(tmp_path / "x.csv"),
                                          "--set", "nonsense"])
    assert bad_set.exit_code != 0 and "KEY=VALUE" in bad_set.output
    unknown = CliRunner().invoke(replay, ["convert", "--trace", "philly", "--input", path, "-o", str(tmp_path / "x.csv"),
                                          "--set", "colour=blue"])
    assert unknown.exit_code != 0
    assert "unknown generator parameter" in str(unknown.exception)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--compression", "inf"], "--compression"),
        (["--compression", "nan"], "--compression"),
        (["--compression", "1e7"], "--compression"),
        (["--minutes", "1e308"], "--minutes"),
        (["--minutes", "nan"], "--minutes"),
        (["--duration-s", "inf"], "--duration-s"),
        (["--load", "nan"], "--load"),
        (["--window-start-s", "nan"], "--window-start-s"),
        (["--untagged-fraction", "nan"], "--untagged-fraction"),
        (["--max-jobs", "-3"], "--max-jobs"),
        (["--capacity-gpus", "0"], "--capacity-gpus"),
        (["--show-skipped", "-1"], "--show-skipped"),
        (["--set", "compression=inf"], "compression must be"),
        (["--set", "finetune.loading_s=nan"], "finetune.loading_s must be"),
        (["--set", "time_limit_factor=inf"], "time_limit_factor must be"),
    ],
)
def test_convert_refuses_non_finite_and_absurd_values_with_one_named_error(args: list[str], named: str, tmp_path: Path) -> None:
    out = tmp_path / "x.csv"
    result = CliRunner().invoke(replay, ["convert", "--trace", "philly", "--input", str(FIXTURES / FIXTURE_FILES["philly"]),
                                         "-o", str(out), *args])
    # A usage error (exit 2) or the generator's own error, which main() prints as one line; no traceback.
    assert isinstance(result.exception, SystemExit | GeneratorError), result.exception
    assert result.exit_code != 0 and named in result.output + str(result.exception)
    assert not out.exists()


def test_show_prints_a_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "w.csv"
    CliRunner().invoke(replay, ["convert", "--trace", "alibaba-2023", "--input", str(FIXTURES / FIXTURE_FILES["alibaba-2023"]),
                                "-o", str(out), "--load", "100", "--compression", "1", "--duration-s", "100000"])
    table = CliRunner().invoke(replay, ["show", "--workload", str(out)])
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[0].split()[:3] == ["class", "jobs", "gpus"]
    data = json.loads(CliRunner().invoke(replay, ["show", "--workload", str(out), "--json"]).output)
    workload = read_workload(out)
    assert data["jobs"] == len(workload.jobs)
    assert sum(c["jobs"] for c in data["classes"]) == len(workload.jobs)
    assert "params" not in data["meta"]


def test_show_reports_a_broken_file_with_line_and_column(tmp_path: Path) -> None:
    out = tmp_path / "w.csv"
    CliRunner().invoke(replay, ["convert", "--trace", "philly", "--input", str(FIXTURES / FIXTURE_FILES["philly"]), "-o", str(out)])
    lines = out.read_text().splitlines()
    header_index = next(i for i, line in enumerate(lines) if line.startswith("name,"))
    lines[header_index + 1] = lines[header_index + 1].replace(",finetune,", ",fine-tune,").replace(",train,", ",trian,")
    out.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(replay, ["show", "--workload", str(out)])
    assert result.exit_code != 0
    assert f"line {header_index + 2}: column class" in str(result.exception)


class FakeSacct:
    """Answers `sacct` with recorded output and remembers the arguments."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.text = text_to_json("\n".join([DELIMITER.join(FIELDS), *lines]) + "\n")
        self.calls: list[list[str]] = []

    def run(self, tool: str, args: Sequence[str]) -> CommandResult:
        self.calls.append([tool, *args])
        return CommandResult((tool, *args), 0, self.text, "")


def sacct_line(job_id: str, start: str, end: str, tres: str, comment: str, elapsed: int) -> str:
    values = {
        "JobID": job_id, "JobIDRaw": job_id, "JobName": "j", "User": "aigc-alice", "Account": "aigc", "Partition": "gpu",
        "QOS": "normal", "State": "COMPLETED", "Submit": start, "Eligible": start, "Start": start, "End": end,
        "AllocTRES": tres, "NodeList": "a100-01", "AdminComment": "", "Comment": comment, "ElapsedRaw": str(elapsed),
    }
    return DELIMITER.join(values[f] for f in FIELDS)


def test_from_sacct_writes_a_workload_with_samples(tmp_path: Path) -> None:
    fake = FakeSacct([
        sacct_line("7", "2026-12-01T10:00:00", "2026-12-01T10:02:00", "cpu=1,gres/gpu=1,node=1", "aigc:type=infer,vram=10G", 120),
        sacct_line("8", "2026-12-01T10:01:00", "2026-12-01T10:02:00", "cpu=1,node=1", "", 60),
    ])
    db_url = f"sqlite:///{tmp_path / 'state.db'}"
    factory = open_database(db_url)
    start = datetime.fromisoformat("2026-12-01T10:00:00").timestamp()
    with transaction(factory) as session:
        for i, util in enumerate([0.0, 90.0, 90.0, 0.0]):
            session.add(JobGpuSample(ts=start + 30 * i, node="a100-01", job_id="7", gpu_index=0, sm_util_pct=util,
                                     memory_used_mib=4096.0, memory_total_mib=81920.0))
    env = ReplayEnv(slurm=lambda: fake, database=lambda url: open_database(url or db_url),
                    now=lambda: datetime(2026, 12, 2, 0, 0))
    out = tmp_path / "site.csv"
    result = CliRunner().invoke(replay, ["--from-sacct", "--since", "2026-12-01", "--until", "2026-12-02", "--output", str(out),
                                         "--db", db_url], obj=env)
    assert result.exit_code == 0, result.output
    assert "left out job 8: no GPUs or shards allocated" in result.output
    assert "wrote 1 jobs" in result.output and "samples for 1 jobs" in result.output
    assert any("--starttime=2026-12-01T00:00:00" in a for a in fake.calls[0])
    # Steps too: with -X slurmdbd leaves them out, and with them their gres/gpuutil and gpumem.
    assert "--allocations" not in fake.calls[0]
    (job,) = read_workload(out).jobs
    assert [p.kind for p in job.profile] == ["loading", "busy", "idle"]
    assert (job.job_class, job.vram_gib_per_gpu, job.mem_used_gib_per_gpu) == ("infer", 10.0, 4.0)


def test_from_sacct_needs_an_output_and_finished_jobs(tmp_path: Path) -> None:
    env = ReplayEnv(slurm=lambda: FakeSacct([]), database=_no_database, now=lambda: datetime(2026, 12, 2))
    missing = CliRunner().invoke(replay, ["--from-sacct"], obj=env)
    assert missing.exit_code != 0 and "--output" in missing.output
    empty = CliRunner().invoke(replay, ["--from-sacct", "-o", str(tmp_path / "x.csv")], obj=env)
    assert empty.exit_code != 0 and "no finished GPU jobs" in str(empty.exception)
    bad_time = CliRunner().invoke(replay, ["--from-sacct", "--since", "yesterday-ish", "-o", str(tmp_path / "x.csv")], obj=env)
    assert bad_time.exit_code != 0 and "not a time" in bad_time.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--compression", "nan"], "--compression"),  # was: ValueError when the workload was written
        (["--compression", "inf"], "--compression"),
        (["--compression", "0"], "--compression"),
        (["--max-jobs", "-3"], "--max-jobs"),  # was: all but the last 3 jobs
    ],
)
def test_from_sacct_refuses_bad_values_before_reading_sacct(args: list[str], named: str, tmp_path: Path) -> None:
    fake = FakeSacct([sacct_line("7", "2026-12-01T10:00:00", "2026-12-01T10:02:00", "cpu=1,gres/gpu=1,node=1", "", 120)])
    env = ReplayEnv(slurm=lambda: fake, database=_no_database, now=lambda: datetime(2026, 12, 2))
    result = CliRunner().invoke(replay, ["--from-sacct", "--no-samples", "--since", "2026-12-01", "-o", str(tmp_path / "x.csv"), *args],
                                obj=env)
    assert result.exit_code == 2 and named in result.output
    assert fake.calls == []


def _no_database(url: str | None) -> sessionmaker[Session]:
    raise AssertionError("no database wanted here")


def test_workload_option_validates_then_hands_over_to_the_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "w.csv"
    CliRunner().invoke(replay, ["convert", "--trace", "philly", "--input", str(FIXTURES / FIXTURE_FILES["philly"]), "-o", str(out)])
    seen: list[Path] = []
    backlogs: list[tuple[int | None, float | None]] = []

    @click.command()
    @click.option("--workload", "workload_path", type=Path)
    @click.option("--backlog", type=int)
    @click.option("--duration-s", type=float)
    def fake_run(workload_path: Path, backlog: int | None, duration_s: float | None) -> None:
        seen.append(workload_path)
        backlogs.append((backlog, duration_s))

    from slurm_aigc.cli import replay_run

    monkeypatch.setattr(replay_run, "run_workload_command", fake_run)
    result = CliRunner().invoke(replay, ["--workload", str(out)])
    assert result.exit_code == 0, result.output
    assert seen == [out] and backlogs == [(None, None)]
    backlogged = CliRunner().invoke(replay, ["--workload", str(out), "--backlog", "4", "--duration-s", "60"])
    assert backlogged.exit_code == 0, backlogged.output
    assert backlogs[-1] == (4, 60.0)
    seen.clear()
    broken = tmp_path / "broken.csv"
    broken.write_text(out.read_text().replace(",philly", ",nonsense-source", 1).replace("name,", "nom,", 1))
    rejected = CliRunner().invoke(replay, ["--workload", str(broken)])
    assert rejected.exit_code != 0 and seen == []


def test_same_seed_gives_the_same_file_across_processes(tmp_path: Path) -> None:
    root = traces_dir(tmp_path)
    texts = []
    for hash_seed in ("1", "4242"):
        out = tmp_path / f"w{hash_seed}.csv"
        code = "import sys; from slurm_aigc.cli.main import main; sys.argv[0] = 'slurm-aigc'; main()"
        argv = [sys.executable, "-c", code, "replay", "convert", "--trace", "mix", "--input", str(root), "-o", str(out), "--seed", "9"]
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run(argv, check=True, capture_output=True, env=env)
        texts.append(out.read_text())
    assert texts[0] == texts[1]


HAND_WRITTEN = ",".join(COLUMNS) + """
idle-1,0,finetune,1,8,120,180,"loading:10,busy:20,idle:90",,0,6,80,,,,,aigc-alice,yes,hand
idle-2,5,finetune,1,8,120,180,"loading:10,busy:20,idle:90",,0,6,80,,,,,aigc-bob,yes,hand
"""


def test_show_says_a_hand_written_file_replays_at_compression_1_and_warns(tmp_path: Path) -> None:
    path = tmp_path / "hand.csv"
    path.write_text(HAND_WRITTEN)
    result = CliRunner().invoke(replay, ["show", "--workload", str(path), "--policy", str(SHIPPED_POLICY)])
    assert result.exit_code == 0, result.output
    assert "compression 1 (the workload has no `# compression:` line)" in result.output
    assert "class finetune: reclaim needs grace 600 s + window 1800 s" in result.output
    assert "cannot fire within this replay: nothing will be reclaimed" in result.output
    data = json.loads(CliRunner().invoke(replay, ["show", "--workload", str(path), "--json",
                                                  "--policy", str(SHIPPED_POLICY)]).output)
    assert data["compression"].startswith("compression 1") and len(data["warnings"]) == 2
    path.write_text("# compression: 60\n" + HAND_WRITTEN)
    fixed = CliRunner().invoke(replay, ["show", "--workload", str(path), "--policy", str(SHIPPED_POLICY)])
    assert "compression 60 (the workload's `# compression:` line)" in fixed.output
    assert "warning" not in fixed.output
    path.write_text("# compression: fast\n" + HAND_WRITTEN)
    bad = CliRunner().invoke(replay, ["show", "--workload", str(path), "--policy", str(SHIPPED_POLICY)])
    assert bad.exit_code == 2 and "'fast'" in bad.output


def test_backlog_needs_a_positive_duration_before_any_cluster_is_touched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.cli import replay_run

    def no_cluster(*args: object, **kwargs: object) -> None:
        raise AssertionError("no cluster wanted here")

    monkeypatch.setattr(replay_run, "LocalCluster", no_cluster)
    missing = CliRunner().invoke(replay, ["compare", "--backlog", "4", "--out-dir", str(tmp_path)])
    assert missing.exit_code == 2 and "--backlog needs --duration-s" in missing.output
    zero = CliRunner().invoke(replay, ["compare", "--backlog", "4", "--duration-s", "0", "--out-dir", str(tmp_path)])
    assert zero.exit_code == 2 and "--duration-s" in zero.output
    bad_k = CliRunner().invoke(replay, ["compare", "--backlog", "0", "--duration-s", "60"])
    assert bad_k.exit_code == 2 and "--backlog" in bad_k.output
    path = tmp_path / "hand.csv"
    path.write_text(HAND_WRITTEN)
    run = CliRunner().invoke(replay, ["run", "--workload", str(path), "--backlog", "2"])
    assert run.exit_code == 2 and "--backlog needs --duration-s" in run.output



def test_the_replay_says_when_classes_judge_waste_by_other_thresholds(tmp_path: Path) -> None:
    # The replay's samples are per GPU, so its useful figure uses the defaults' thresholds; a
    # policy whose train class has its own busy_util_pct must say so, not count silently.
    from slurm_aigc.cli import replay_run

    shipped = tmp_path / "shipped.yaml"
    shipped.write_text((Path(__file__).resolve().parents[2] / "etc" / "slurm-aigc.yaml").read_text())
    assert replay_run.useful_rule(shipped)[1] == []
    site = tmp_path / "site.yaml"
    site.write_text(shipped.read_text().replace("  classes:\n    train:\n",
                                                "  classes:\n    train:\n      busy_util_pct: 90\n", 1))
    rule, notes = replay_run.useful_rule(site)
    assert rule.busy_util_pct == 95  # the defaults'
    assert len(notes) == 1 and "train set their own" in notes[0]


@pytest.mark.parametrize("value", ["nan", "inf", "-5"])
def test_replay_run_refuses_a_duration_that_is_not_a_finite_positive_number(tmp_path: Path, value: str) -> None:
    # nan passed `duration_s <= 0` and reached the backlogged run, which never ended its window.
    from slurm_aigc.cli.replay_run import run_workload_command

    workload = tmp_path / "w.csv"
    workload.write_text("")
    result = CliRunner().invoke(run_workload_command, ["--workload", str(workload), "--backlog", "4",
                                                       "--duration-s", value])
    assert result.exit_code == 2 and "--duration-s" in result.output, result.output


def test_from_sacct_reads_sacct_only_up_to_now_and_refuses_too_many_windows(tmp_path: Path) -> None:
    # --until 2099 read sacct one day at a time up to 2099, as `report` did; --since 1970 was 20,000 calls.
    calls: list[list[str]] = []

    class Counting:
        def run(self, tool: str, args: Sequence[str]) -> CommandResult:
            calls.append([tool, *args])
            return CommandResult((tool, *args), 0, json.dumps({"jobs": []}), "")

    now = datetime(2026, 12, 6, 12, 0, 0)
    env = ReplayEnv(slurm=lambda: Counting(), database=lambda url: None, now=lambda: now)  # type: ignore[arg-type]
    far = CliRunner().invoke(replay, ["--from-sacct", "--no-samples", "--since", "now-2days", "--until", "2099-01-01",
                                      "-o", str(tmp_path / "w.csv")], obj=env)
    assert "and 2026-12-06 12:00:00" in str(far.exception) and len(calls) == 2, (far.exception, len(calls))
    calls.clear()
    old = CliRunner().invoke(replay, ["--from-sacct", "--no-samples", "--since", "1970-01-01",
                                      "-o", str(tmp_path / "w.csv")], obj=env)
    assert "at most 2,000" in str(old.exception) and calls == [], old.exception


def test_compare_says_which_compression_applies_and_refuses_bad_input_before_the_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14.6 on `compare`: the compression line and the window warning come first; a workload
    or shape it refuses must not have replaced the running cluster on the way."""
    from slurm_aigc.cli import replay_run

    touched: list[str] = []

    class NoCluster:
        def __init__(self, **kwargs: object) -> None:
            touched.append("cluster")

        def up(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("stop before the runs")

    monkeypatch.setattr(replay_run, "LocalCluster", NoCluster)
    hand = tmp_path / "hand.csv"
    hand.write_text(HAND_WRITTEN)
    result = CliRunner().invoke(replay, ["compare", "--workload", str(hand), "--policy", str(SHIPPED_POLICY),
                                         "--out-dir", str(tmp_path / "out")])
    assert isinstance(result.exception, RuntimeError) and touched == ["cluster"]
    assert "compression 1 (the workload has no `# compression:` line)" in result.output
    assert "class finetune: reclaim needs grace 600 s + window 1800 s" in result.output
    touched.clear()
    bad = tmp_path / "bad.csv"
    bad.write_text("# compression: fast\n" + HAND_WRITTEN)
    refused = CliRunner().invoke(replay, ["compare", "--workload", str(bad), "--policy", str(SHIPPED_POLICY)])
    assert refused.exit_code == 2 and "compression" in refused.output and touched == []
    shape = CliRunner().invoke(replay, ["compare", "--workload", str(hand), "--shape", "v100:8x2"])
    assert shape.exit_code == 2 and "unknown GPU type 'v100'" in shape.output and touched == []


def test_compare_gives_its_database_to_the_slurm_aigc_run_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`compare --db` (a warm learned table): stock Slurm runs no controller, and its agents'
    samples must not join the slurm-aigc run's history."""
    from slurm_aigc.cli import replay_run

    class Cluster:
        def __init__(self, **kwargs: object) -> None:
            pass

        def up(self, *args: object, **kwargs: object) -> None:
            pass

    runs: list[tuple[str, str | None]] = []

    def run_modes(workload: object, modes: Sequence[str], settings: replay_run.RunSettings, *args: object) -> list[object]:
        runs.append((settings.mode, settings.db))
        if settings.mode == "aigc":
            raise RuntimeError("both runs seen")
        return [None]

    monkeypatch.setattr(replay_run, "LocalCluster", Cluster)
    monkeypatch.setattr(replay_run, "run_modes", run_modes)
    hand = tmp_path / "hand.csv"
    hand.write_text(HAND_WRITTEN)
    common = ["compare", "--workload", str(hand), "--policy", str(SHIPPED_POLICY), "--out-dir", str(tmp_path / "out")]
    result = CliRunner().invoke(replay, [*common, "--db", "/var/lib/warm.url"])
    assert isinstance(result.exception, RuntimeError), result.output
    assert runs == [("stock", None), ("aigc", "/var/lib/warm.url")]
    runs.clear()
    CliRunner().invoke(replay, common)
    assert runs == [("stock", None), ("aigc", None)]
