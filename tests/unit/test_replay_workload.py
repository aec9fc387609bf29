"""The workload file format: round trip, strict validation naming line and column, profiles, tags."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_aigc.profiles import PHASE_KINDS, Phase, ProfileError, format_phases, parse_phases
from slurm_aigc.replay.workload import (
    COLUMNS,
    Workload,
    WorkloadError,
    WorkloadJob,
    format_tags,
    format_workload,
    parse_tags,
    parse_workload,
    span_s,
    summarize,
)
from slurm_aigc.replay.workload_files import read_workload, write_workload

HEADER = ",".join(COLUMNS)


def job(**overrides: object) -> WorkloadJob:
    values: dict[str, object] = {
        "name": "infer-1",
        "submit_offset_s": 5.0,
        "job_class": "infer",
        "gpus": 1,
        "vram_gib_per_gpu": 8.0,
        "duration_s": 60.0,
        "time_limit_s": 120,
        "profile": (Phase("loading", 10.0), Phase("busy", 30.0), Phase("idle", 20.0)),
        "requeue_profile": (),
        "mem_used_gib_per_gpu": 6.5,
        "util_pct": 55.0,
        "tags": "aigc:type=infer,model=llama3-8b,vram=8G,share=yes",
        "share": "yes",
        "model": "llama3-8b",
        "user": "aigc-alice",
        "source": "test:1",
    }
    values.update(overrides)
    return WorkloadJob(**values)  # type: ignore[arg-type]


def row(**cells: str) -> str:
    """One CSV row from a valid job's cells with some replaced."""
    text = format_workload(Workload((job(),)))
    values = dict(zip(COLUMNS, _split_csv(text.splitlines()[-1])))
    values.update(cells)
    return ",".join(f'"{values[c]}"' for c in COLUMNS)


def _split_csv(line: str) -> list[str]:
    import csv

    return next(csv.reader([line]))


def test_round_trip_keeps_every_field_and_meta(tmp_path: Path) -> None:
    jobs = (
        job(),
        job(name="train-2", job_class="train", gpus=8, vram_gib_per_gpu=60.0, gpus_used=2, nvlink="yes", share="",
            tags="aigc:type=train,vram=60G,nvlink=yes", model="", submit_offset_s=1.5,
            requeue_profile=(Phase("loading", 10.0), Phase("busy", 15.0)), requeue=False),
    )
    workload = Workload(jobs, {"seed": "7", "compression": "60"})
    path = tmp_path / "w.csv"
    write_workload(workload, path)
    back = read_workload(path)
    assert back.meta == {"seed": "7", "compression": "60"}
    assert back.jobs == tuple(sorted(jobs, key=lambda j: j.submit_offset_s))
    assert path.read_text().startswith("# slurm-aigc workload: 1\n")


@pytest.mark.parametrize(
    ("cells", "column", "message"),
    [
        ({"gpus": "0"}, "gpus", "integer >= 1"),
        ({"gpus": "two"}, "gpus", "integer >= 1"),
        ({"class": "trian"}, "class", "expected one of"),
        ({"submit_offset_s": "-1"}, "submit_offset_s", ">= 0"),
        ({"submit_offset_s": "nan"}, "submit_offset_s", ">= 0"),
        ({"vram_gib_per_gpu": "0"}, "vram_gib_per_gpu", "> 0"),
        ({"profile": "loading:10,sleeping:50"}, "profile", "unknown phase 'sleeping'"),
        ({"profile": "loading:10,busy"}, "profile", "'busy' in 'loading:10,busy' needs seconds"),
        ({"profile": "busy:60,repeat"}, "profile", "'repeat' is not allowed"),
        ({"profile": "busy:-60"}, "profile", "> 0"),
        ({"profile": ""}, "profile", "empty profile"),
        ({"duration_s": "90"}, "duration_s", "differs from the profile's 60"),
        ({"time_limit_s": "90"}, "time_limit_s", "whole minutes"),
        ({"time_limit_s": "30"}, "time_limit_s", "integer >= 60"),
        ({"gpus_used": "2"}, "gpus_used", "exceeds gpus 1"),
        ({"mem_used_gib_per_gpu": "9"}, "mem_used_gib_per_gpu", "exceeds vram_gib_per_gpu 8"),
        ({"util_pct": "120"}, "util_pct", "at most 100"),
        ({"share": "maybe"}, "share", "expected one of"),
        ({"requeue": "true"}, "requeue", "expected one of"),
        ({"name": "bad name"}, "name", "letters, digits"),
        ({"tags": "aigc:type=train"}, "tags", "disagrees with class infer"),
        ({"tags": "aigc:type=infer,vram=40G"}, "tags", "vram=40G disagrees"),
        ({"tags": "aigc:type=infer,vram=lots"}, "tags", "not a size"),
        ({"tags": "aigc:type"}, "tags", "not key=value"),
        ({"tags": "aigc:type=infer,type=infer"}, "tags", "repeated"),
        ({"tags": "type=infer"}, "tags", "expected an aigc:"),
        ({"tags": "aigc:type=infer,share=no"}, "tags", "share=no disagrees"),
        ({"submit_offset_s": "1e300"}, "submit_offset_s", "<= 31622400"),
        ({"submit_offset_s": "inf"}, "submit_offset_s", "<= 31622400"),
        ({"gpus": "100000"}, "gpus", "<= 4096"),
        ({"gpus": "9" * 5000}, "gpus", "<= 4096"),
        ({"gpus_used": "9" * 5000}, "gpus_used", "<= 4096"),
        ({"time_limit_s": "6" * 5000}, "time_limit_s", "<= 31622400"),
        ({"time_limit_s": "31622460"}, "time_limit_s", "<= 31622400"),
        ({"vram_gib_per_gpu": "1e9"}, "vram_gib_per_gpu", "<= 1024"),
        ({"mem_used_gib_per_gpu": "1e9"}, "mem_used_gib_per_gpu", "<= 1024"),
        ({"duration_s": "1e300", "profile": "busy:1e300"}, "duration_s", "<= 31622400"),
        ({"requeue_profile": "busy:1e12"}, "requeue_profile", "more than 31622400 s"),
    ],
)
def test_bad_cells_name_line_and_column(cells: dict[str, str], column: str, message: str) -> None:
    text = f"# note: x\n{HEADER}\n{row()}\n{row(**{'name': 'second', **cells})}\n"
    with pytest.raises(WorkloadError) as error:
        parse_workload(text, "w.csv")
    assert error.value.line == 4
    assert error.value.column == column
    assert message in error.value.problem
    assert str(error.value).startswith(f"w.csv: line 4: column {column}: ")


def test_hung_jobs_may_outlast_their_time_limit_others_not() -> None:
    hung = row(profile="loading:10,hung:170", duration_s="180", time_limit_s="120")
    assert parse_workload(f"{HEADER}\n{hung}\n").jobs[0].duration_s == 180
    late = row(profile="loading:10,busy:170", duration_s="180", time_limit_s="120")
    with pytest.raises(WorkloadError, match="column time_limit_s: 120 s is shorter"):
        parse_workload(f"{HEADER}\n{late}\n")


def test_header_problems_are_named() -> None:
    with pytest.raises(WorkloadError, match="missing column.*gpus"):
        parse_workload(HEADER.replace(",gpus,", ",") + "\n")
    with pytest.raises(WorkloadError, match="unknown column.*colour"):
        parse_workload(HEADER + ",colour\n")
    swapped = HEADER.replace("class,gpus", "gpus,class")
    with pytest.raises(WorkloadError, match="out of order"):
        parse_workload(swapped + "\n")
    with pytest.raises(WorkloadError, match="no jobs"):
        parse_workload(HEADER + "\n")
    with pytest.raises(WorkloadError, match="no header"):
        parse_workload("# only a comment\n")
    with pytest.raises(WorkloadError, match="version '9'"):
        parse_workload(f"# slurm-aigc workload: 9\n{HEADER}\n{row()}\n")


def test_short_rows_and_duplicate_names_are_errors() -> None:
    with pytest.raises(WorkloadError, match="line 2: expected 19 cells, got 3"):
        parse_workload(f"{HEADER}\na,b,c\n")
    with pytest.raises(WorkloadError, match="line 3: column name: duplicate name 'infer-1' \\(first on line 2\\)"):
        parse_workload(f"{HEADER}\n{row()}\n{row()}\n")


def test_unreadable_file_is_a_workload_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="cannot read"):
        read_workload(tmp_path / "absent.csv")


def test_a_leading_utf8_bom_reads_exactly_as_the_plain_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    write_workload(Workload((job(),), {"seed": "7"}), plain)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_workload(bom) == read_workload(plain)
    headless = tmp_path / "headless.csv"  # no comment lines: the BOM would sit on the header
    headless.write_bytes(b"\xef\xbb\xbf" + f"{HEADER}\n{row()}\n".encode())
    assert read_workload(headless).jobs == read_workload(plain).jobs


def test_a_job_holding_nan_or_inf_is_refused_when_written(tmp_path: Path) -> None:
    for value in (math.nan, math.inf, 1e300):
        with pytest.raises(WorkloadError, match="line 3: column submit_offset_s"):
            write_workload(Workload((job(submit_offset_s=value),)), tmp_path / "w.csv")
    assert not (tmp_path / "w.csv").exists()


def test_jobs_are_sorted_by_submit_offset_and_blank_lines_ignored() -> None:
    text = f"{HEADER}\n{row(name='late', submit_offset_s='50')}\n\n{row(name='early', submit_offset_s='1')}\n"
    assert [j.name for j in parse_workload(text).jobs] == ["early", "late"]


def test_profile_and_tag_helpers() -> None:
    assert parse_phases("loading:30, busy:300,idle:120.5", allow_repeat=False) == (
        (Phase("loading", 30.0), Phase("busy", 300.0), Phase("idle", 120.5)), False)
    assert format_phases((Phase("busy", 30.0), Phase("idle", 12.25))) == "busy:30,idle:12.25"
    assert parse_phases("", allow_repeat=False) == ((), False)
    with pytest.raises(ProfileError, match="must have an end"):
        parse_phases("busy:30,repeat", allow_repeat=False)
    assert parse_tags("exp42 aigc:type=infer,vram=20G") == {"type": "infer", "vram": "20G"}
    assert parse_tags("no tag here") == {}
    with pytest.raises(ValueError, match="more than one"):
        parse_tags("aigc:type=a aigc:type=b")
    assert format_tags({"type": "train", "nvlink": "yes"}) == "aigc:type=train,nvlink=yes"
    assert format_tags({}) == ""


def test_workload_tags_split_like_the_hook() -> None:
    """One grammar (`slurm_aigc.tags.tag_pairs`): empty pairs skipped, the body ends at whitespace."""
    assert parse_tags("exp aigc:type=infer,,vram=8G tail=x") == {"type": "infer", "vram": "8G"}
    assert parse_tags("run-aigc:type=train") == {"type": "train"}  # the hook finds `aigc:` anywhere
    with pytest.raises(ValueError, match="'model' is not key=value"):
        parse_tags("aigc:type=infer,model=")


def test_profiles_are_valid_gpu_load_specs() -> None:
    loadgen = pytest.importorskip("slurm_aigc.telemetry.loadgen")
    spec = format_phases((Phase("loading", 8.0), Phase("busy", 10.0), Phase("idle", 10.0), Phase("hung", 30.0)))
    parsed = loadgen.parse_profile_spec(spec)
    assert [(p.kind, p.seconds) for p in parsed.phases] == [("loading", 8.0), ("busy", 10.0), ("idle", 10.0), ("hung", 30.0)]
    assert set(PHASE_KINDS) == set(loadgen.PHASE_LEVELS)


def test_summary_counts_usage_patterns() -> None:
    jobs = [
        job(),
        job(name="b", profile=(Phase("loading", 10.0), Phase("hung", 50.0))),
        job(name="c", job_class="train", gpus=4, gpus_used=1, tags="", share="", vram_gib_per_gpu=40.0, mem_used_gib_per_gpu=30.0),
    ]
    infer, train = summarize(jobs)
    assert (infer.job_class, infer.jobs, infer.idle_tail, infer.hung, infer.shareable) == ("infer", 2, 1, 1, 2)
    assert (train.jobs, train.gpus_requested, train.over_allocated, train.gpu_seconds_requested) == (1, 4, 1, 240.0)
    assert span_s(jobs) == 65.0


_phase = st.builds(Phase, st.sampled_from(PHASE_KINDS), st.integers(1, 500).map(float))


@settings(max_examples=60, deadline=None)
@given(
    profile=st.lists(_phase, min_size=1, max_size=6),
    offset=st.floats(0, 1e5, allow_nan=False).map(lambda v: round(v, 1)),
    gpus=st.integers(1, 8),
)
def test_any_valid_job_round_trips(profile: list[Phase], offset: float, gpus: int) -> None:
    total = sum(p.seconds for p in profile)
    limit = 60 * (int(total // 60) + 1)
    original = dataclasses.replace(
        job(), profile=tuple(profile), duration_s=total, time_limit_s=limit, submit_offset_s=offset, gpus=gpus, share="",
        tags="aigc:type=infer,vram=8G",
    )
    assert parse_workload(format_workload(Workload((original,)))).jobs == (original,)


def test_the_documented_example_rows_are_valid() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "replay.md"
    if not doc.is_file():
        pytest.skip("docs/replay.md absent")
    text = doc.read_text(encoding="utf-8")
    block = text.split("Example rows:", 1)[1].split("```", 2)[1]
    workload = parse_workload(block.strip() + "\n", str(doc))
    assert [j.name for j in workload.jobs] == ["genai-imagegen-0003", "philly-train-0017"]


def test_a_field_over_the_csv_limit_is_a_clear_error() -> None:
    """Python's csv refuses a field over 128 KiB: a WorkloadError naming the line, not a traceback."""
    text = f"{HEADER}\n{row()}\n{row(name='big', tags='aigc:type=infer,model=' + 'm' * (128 * 1024 + 1))}\n"
    with pytest.raises(WorkloadError, match="not readable as CSV: field larger than field limit") as error:
        parse_workload(text, "w.csv")
    assert error.value.line == 3
