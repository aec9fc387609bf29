"""Rendering: terminal table, CSV, JSON, HTML with PNG plots, the per-job view."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_aigc.report import render
from slurm_aigc.report.figures import Report, ReportParams, build_report, job_view
from slurm_aigc.report.records import ActionEvent, SampleSlice
from slurm_aigc.report.sacct import JobRecord, SkippedRow, parse_sacct_output
from tests.unit.report_fixtures import SHARDS_PER_GPU, stamped_sacct

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sacct"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def rows() -> list[JobRecord | SkippedRow]:
    return list(parse_sacct_output(stamped_sacct(), tz=UTC, source="fixture"))  # classes stamped as the hook would have


def sample_report() -> Report:
    samples = [SampleSlice("101", "a100-01", g, ts("2026-11-30T10:05:00") + 60 * i, 60.0, 40.0, 5000.0, 81920.0)
               for g in range(2) for i in range(120)]
    params = ReportParams(ts("2026-11-30T00:00:00"), ts("2026-12-01T00:00:00"), ("class", "user"), SHARDS_PER_GPU, tz=UTC)
    return build_report(params, rows(), samples)


def test_table_shows_unknowns_as_such() -> None:
    text = render.render_table(sample_report())
    lines = text.splitlines()
    train_alice = next(line for line in lines if line.startswith("train") and "aigc-alice" in line)
    assert "40%" in train_alice  # 101's samples: 40 % of its 4 GPU-hours
    infer_bob = next(line for line in lines if line.startswith("infer") and "aigc-bob" in line)
    assert "no samples" in infer_bob
    assert any(line.startswith("TOTAL") for line in lines)
    assert "note: shards count as GPU fractions" in text


def test_csv_round_trips() -> None:
    report = sample_report()
    table = list(csv.DictReader(io.StringIO(render.render_csv(report))))
    assert [r["class"] for r in table][-1] == "TOTAL"
    train = next(r for r in table if r["class"] == "train" and r["user"] == "aigc-alice")
    assert float(train["gpu_hours_allocated"]) == 12.0
    assert float(train["gpu_hours_used"]) == 1.6
    bob = next(r for r in table if r["class"] == "infer" and r["user"] == "aigc-bob")
    assert bob["gpu_hours_used"] == "" and bob["efficiency"] == ""


def test_json_has_groups_total_notes_and_skipped() -> None:
    data = json.loads(render.render_json(sample_report()))
    assert data["group_by"] == ["class", "user"] and data["shards_per_gpu"] == {"a100": 80, "t4": 16}
    groups = {(g["group"]["class"], g["group"]["user"]): g for g in data["groups"]}
    assert groups[("train", "aigc-alice")]["efficiency"] == 1.6 / 4.0
    assert data["total"]["jobs"] == 9
    assert data["skipped"][0]["line_no"] == 9 and "no submit time" in data["skipped"][0]["reason"]  # sacct --json record 9


def test_html_embeds_three_png_plots() -> None:
    page = render.render_html(sample_report())
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3
    assert all(base64.b64decode(image).startswith(PNG_MAGIC) for image in images)
    assert "<table>" in page and "no samples" in page


def test_skipped_summary_names_line_and_reason() -> None:
    text = render.skipped_summary(sample_report().skipped)
    assert "1 sacct row(s) skipped" in text and "fixture line 9: job 110: no submit time" in text
    assert render.skipped_summary(()) == ""


def test_sparkline_and_durations() -> None:
    assert render.sparkline([0.0, 50.0, 100.0], 0, 100) == "▁▅█"
    assert render.sparkline([None, 100.0], 0, 100) == " █"
    assert len(render.sparkline([float(i) for i in range(500)], 0, 500, width=40)) == 40
    assert [render.fmt_duration(s) for s in (None, 5, 725, 11220, 187200)] == ["-", "5s", "12m05s", "3h07m", "2d04h"]


UTILS = [10.0 * (i % 11) for i in range(60)]


def test_job_view_text_json_html() -> None:
    records = [r for r in rows() if isinstance(r, JobRecord) and r.job_id == "104"]
    samples = [SampleSlice("104", "a100-02", g, ts("2026-11-30T09:30:00") + 60 * i, 60.0, UTILS[i], 1024.0 * i, 81920.0)
               for g in range(4) for i in range(60)]
    actions = [ActionEvent("104", ts("2026-11-30T08:50:00"), "idle", "requeue", "done", False, "idle 30 min", 4, 4, 0.5)]
    view = job_view("104", records, samples, actions, now_ts=ts("2026-12-01T00:00:00"))
    assert view.gpu_hours_allocated == 8.0 and view.gpus == 4 and view.gpu_type == "a100"
    text = render.render_job(view, "table", UTC)
    assert "run segments: 2 (requeues: 1)" in text
    assert text.count("a100-02 GPU") == 4 and "▁" in text and "█" in text
    assert "requeue" in text and "idle 30 min" in text
    data = json.loads(render.render_job(view, "json", UTC))
    assert [s["state"] for s in data["segments"]] == ["REQUEUED", "COMPLETED"]
    assert data["gpus_series"][0]["mean_util_pct"] == pytest.approx(sum(UTILS) / len(UTILS))
    page = render.render_job(view, "html", UTC)
    image = re.search(r'base64,([A-Za-z0-9+/=]+)"', page)
    assert image and base64.b64decode(image.group(1)).startswith(PNG_MAGIC)
    csv_rows = render.render_job(view, "csv", UTC).splitlines()
    assert len(csv_rows) == 1 + 4 * 60


def test_job_without_samples_says_so() -> None:
    records = [r for r in rows() if isinstance(r, JobRecord) and r.job_id == "109"]
    view = job_view("109", records, [], [], now_ts=ts("2026-12-01T00:00:00"))
    text = render.render_job(view, "table", UTC)
    assert "used no samples" in text and "none recorded" in text
    assert view.gpu_hours_allocated == 0.5


def test_a_job_name_with_control_characters_cannot_rewrite_the_admins_terminal() -> None:
    name = "ok\n[2026-12-04] error: forged\x1b[2J\x1b]0;title\x07\u202egnp.exe"
    records = [replace(r, name=name) for r in rows() if isinstance(r, JobRecord) and r.job_id == "109"]
    text = render.render_job(job_view("109", records, [], [], now_ts=ts("2026-12-01T00:00:00")), "table", UTC)
    assert "name: ok\\n[2026-12-04] error: forged\\x1b[2J\\x1b]0;title\\x07\\u202egnp.exe" in text
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f\u202e]", text)  # only the view's own newlines are left
    table = render.text_table(["name", "GPUs"], [[name, "1"]])
    assert table.count("\n") == 2 and "\x1b" not in table


def test_hours_keep_precision_for_short_jobs() -> None:
    assert [render.fmt_hours(h) for h in (0.0, 0.01234, 4.5, 1234.56)] == ["0", "0.0123", "4.50", "1234.6"]


def test_every_format_shows_useful_work_beside_the_sm_figure() -> None:
    """Issue 14.2: `report` shows useful utilization beside the SM figure, in each format."""
    report = sample_report()
    header = render.render_table(report).splitlines()[2]
    columns = [c for c in re.split(r"\s{2,}", header.strip()) if c]
    assert columns.index("useful eff") == columns.index("GPU-h useful") + 1 == columns.index("eff") + 2
    train = next(r for r in csv.DictReader(io.StringIO(render.render_csv(report)))
                 if r["class"] == "train" and r["user"] == "aigc-alice")
    # 101's samples carry no power reading, so none is fake-busy: all 1.6 SM GPU-hours are work.
    assert float(train["gpu_hours_useful"]) == pytest.approx(1.6) and float(train["useful_efficiency"]) == pytest.approx(0.4)
    data = json.loads(render.render_json(report))
    alice = next(g for g in data["groups"] if g["group"] == {"class": "train", "user": "aigc-alice"})
    assert alice["gpu_hours_useful"] == pytest.approx(1.6) and alice["useful_efficiency"] == pytest.approx(0.4)
    assert "useful eff" in render.render_html(report)
