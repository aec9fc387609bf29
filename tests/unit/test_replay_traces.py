"""Trace readers: typed rows from small hand-made fixtures and the shared public traces;
malformed rows are reported with line and reason, never fatal."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_aigc.replay.traces import (
    DEFAULT_FILES,
    TraceError,
    read_genai,
    read_openb,
    read_philly,
    read_trace,
    resolve_trace_file,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
SHARED_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def reasons(read: object) -> dict[int, str]:
    return {row.line: row.reason for row in read.skipped}  # type: ignore[attr-defined]


def test_openb_fixture_rows_are_typed_and_bad_rows_reported() -> None:
    read = read_openb(FIXTURES / "openb_pod_list_small.csv")
    skipped = reasons(read)
    assert sorted(skipped) == [8, 9, 10, 11, 14]
    assert "gpu_milli 'abc'" in skipped[8]
    assert "before creation_time" in skipped[9]
    assert "num_gpu 12 outside 0..8" in skipped[10]
    assert "expected 11 cells, got 8" in skipped[11]
    assert "gpu_milli 0" in skipped[14]
    by_name = {job.job_id: job for job in read.jobs}
    assert len(by_name) == 9
    share = by_name["openb-pod-0001"]
    assert (share.gpus, share.gpu_fraction, share.duration_s, share.arrival_s) == (1, 0.46, 1200.0, 60.0)
    assert by_name["openb-pod-0000"].gpu_fraction == 1.0
    assert by_name["openb-pod-0004"].gpus == 8
    assert by_name["openb-pod-0002"].gpus == 0  # CPU-only pods are read; the generator drops them
    assert by_name["openb-pod-0010"].status == "Pending"
    assert [j.arrival_s for j in read.jobs] == sorted(j.arrival_s for j in read.jobs)


def test_genai_fixture_rows_keep_request_shape() -> None:
    read = read_genai(FIXTURES / "lora_request_trace_small.csv")
    skipped = reasons(read)
    assert sorted(skipped) == [5, 6, 7]
    assert "checkpoint_model_version_id is empty" in skipped[5]
    assert "exec_time_seconds 'not-a-number'" in skipped[6]
    assert "YYYY-MM-DD HH:MM:SS" in skipped[7]
    assert len(read.jobs) == 6
    second = read.jobs[1]
    assert (second.model, second.images, second.loras, second.steps, second.duration_s) == ("M0000", 4, 1, 30, 20.0)
    assert second.arrival_s - read.jobs[0].arrival_s == 50.0
    failed = next(j for j in read.jobs if j.status == "FAILED")
    assert failed.images == 1  # empty num_images_per_prompt reads as one image
    assert failed.loras == 2


def test_philly_fixture_checks_gpu_time_and_sorts_by_arrival() -> None:
    read = read_philly(FIXTURES / "pollux_philly_jobs_small.csv")
    skipped = reasons(read)
    assert sorted(skipped) == [5, 6, 7, 9]
    assert "gpu_time 999 != duration 600 x num_gpus 4" in skipped[5]
    assert "duration '-5.0'" in skipped[6]
    assert "num_gpus 0 outside" in skipped[7]
    assert "timestamp" in skipped[9]
    assert [j.gpus for j in read.jobs] == [1, 8, 16, 2, 1]
    assert read.jobs[0].group == "6214e9"
    assert read.jobs[-1].duration_s == 66.0


def test_missing_columns_and_missing_files_are_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,duration\n2017-10-09 07:01:55,66\n")
    with pytest.raises(TraceError, match="missing column"):
        read_philly(bad)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty file"):
        read_openb(empty)
    with pytest.raises(TraceError, match="cannot read"):
        read_genai(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="unknown trace"):
        read_trace("borg", tmp_path)



@pytest.mark.parametrize(
    ("reader", "name"),
    [(read_openb, "openb_pod_list_small.csv"), (read_genai, "lora_request_trace_small.csv"), (read_philly, "pollux_philly_jobs_small.csv")],
)
def test_a_leading_utf8_bom_reads_exactly_as_the_plain_file(reader: object, name: str, tmp_path: Path) -> None:
    # Excel and PowerShell save CSVs with a BOM; it must not stick to the first column's name.
    plain = FIXTURES / name
    bom = tmp_path / name
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert reader(bom) == reader(plain)  # type: ignore[operator]


def test_a_byte_that_is_not_utf8_is_named_by_line(tmp_path: Path) -> None:
    lines = (FIXTURES / "pollux_philly_jobs_small.csv").read_bytes().split(b"\n")
    lines[4] = lines[4][:5] + b"\xff" + lines[4][5:]
    bad = tmp_path / "philly.csv"
    bad.write_bytes(b"\n".join(lines))
    with pytest.raises(TraceError, match=r"cannot read philly trace: line 5: byte 0xff at column 6 is not UTF-8"):
        read_philly(bad)

def test_a_folder_resolves_to_the_default_file(tmp_path: Path) -> None:
    target = tmp_path / DEFAULT_FILES["philly"]
    target.parent.mkdir(parents=True)
    target.write_text((FIXTURES / "pollux_philly_jobs_small.csv").read_text())
    assert resolve_trace_file("philly", tmp_path) == target
    assert len(read_trace("philly", tmp_path).jobs) == 5
    with pytest.raises(TraceError, match="no "):
        resolve_trace_file("genai-2026", tmp_path)


@pytest.mark.shared
@pytest.mark.parametrize(
    ("trace", "rows"),
    [("alibaba-2023", 8152), ("genai-2026", 26823), ("philly", 82247)],
)
def test_shared_traces_read_every_row_or_say_why(trace: str, rows: int) -> None:
    path = SHARED_TRACES / DEFAULT_FILES[trace]
    if not path.is_file():
        pytest.skip(f"{path} absent")
    read = read_trace(trace, SHARED_TRACES)
    assert len(read.jobs) + len(read.skipped) == rows
    assert len(read.skipped) < rows * 0.01
    assert all(job.duration_s >= 0 for job in read.jobs)


@pytest.mark.shared
def test_shared_openb_matches_its_readme_counts() -> None:
    path = SHARED_TRACES / DEFAULT_FILES["alibaba-2023"]
    if not path.is_file():
        pytest.skip(f"{path} absent")
    jobs = read_openb(path).jobs
    single = [j for j in jobs if j.gpus == 1]
    assert len(single) == 6989
    assert sum(1 for j in single if j.gpu_fraction < 1.0) == 3078
    assert sum(1 for j in jobs if j.gpus == 8) == 44


@pytest.mark.shared
def test_shared_genai_skips_only_requests_without_a_model() -> None:
    path = SHARED_TRACES / DEFAULT_FILES["genai-2026"]
    if not path.is_file():
        pytest.skip(f"{path} absent")
    read = read_genai(path)
    assert read.skipped
    assert all("checkpoint_model_version_id is empty" in row.reason for row in read.skipped)
