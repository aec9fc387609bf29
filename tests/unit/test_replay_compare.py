"""The side-by-side table and JSON of two runs, open-loop and backlogged (issue 14.1/14.2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_aigc.replay.compare import backlog_json, backlog_of, backlog_rows, comparison_json, comparison_rows, metrics_of, plot_utilization
from slurm_aigc.replay.metrics import JobOutcome, UsageSample
from slurm_aigc.replay.runner import RunRecord

T0 = 1000.0


def samples(util: float, power: float, seconds: int = 100) -> tuple[UsageSample, ...]:
    return tuple(UsageSample(T0 + t, "a100-01", 0, util, power, 400.0) for t in range(0, seconds, 10))


def record(mode: str, *, hung: bool, work: float, backlog: int = 4) -> RunRecord:
    outcomes = (JobOutcome("1", "infer", 1.0, T0, T0 + 5, T0 + 50, "COMPLETED", work_gpu_s=work, nominal_s=40.0, shared=True,
                           last_start_ts=T0 + 5),)
    return RunRecord(mode, outcomes, samples(100.0, 50.0 if hung else 380.0), 2, 0.0, end_ts=T0 + 120, start_ts=T0,
                     backlog=backlog, duration_s=100.0)


def test_backlog_table_and_json_show_every_window_figure_and_the_ratios() -> None:
    stock, aigc = backlog_of(record("stock", hung=True, work=30.0)), backlog_of(record("aigc", hung=False, work=60.0))
    assert stock.useful_utilization == 0.0 and aigc.useful_utilization == pytest.approx(0.5)
    rows = {name: (old, new, ratio) for name, old, new, ratio in backlog_rows(stock, aigc)}
    assert rows["useful utilization"][:2] == ("0.0 %", "50.0 %") and rows["useful utilization"][2] == "-"  # stock 0: no ratio
    assert rows["effective utilization (SM)"] == ("50.0 %", "50.0 %", "1.00x")
    assert rows["work completed (GPU-s)"] == ("30", "60", "2.00x")
    assert rows["shared slowdown, median"][1] == "1.12x"
    assert {"mean wait: infer", "p95 wait: infer", "jobs harmed", "sharing-caused timeouts"} <= rows.keys()
    document = backlog_json(stock, aigc, {"shape": "x"})
    assert document["mode"] == "backlog" and document["ratios"]["work_completed_gpu_s"] == 2.0
    assert document["aigc"]["useful_utilization"] == pytest.approx(0.5)


def test_an_open_loop_run_cannot_be_read_as_backlogged_and_shows_useful_beside_sm() -> None:
    with pytest.raises(ValueError, match="not backlogged"):
        backlog_of(record("stock", hung=True, work=1.0, backlog=0))
    stock, aigc = metrics_of(record("stock", hung=True, work=1.0, backlog=0)), metrics_of(record("aigc", hung=False, work=1.0, backlog=0))
    rows = {name: (old, new) for name, old, new, _ in comparison_rows(stock, aigc)}
    assert rows["useful utilization"] == ("0.0 %", f"{100 * aigc.useful_utilization:.1f} %")
    assert comparison_json(stock, aigc, {})["ratios"]["useful_utilization"] is None


def test_the_plot_is_drawn_for_backlogged_runs(tmp_path: Path) -> None:
    path = plot_utilization([record("stock", hung=True, work=1.0), record("aigc", hung=False, work=1.0)], tmp_path / "u.png")
    assert path.stat().st_size > 10_000
