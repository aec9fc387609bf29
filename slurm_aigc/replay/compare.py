"""Side-by-side figures of a stock and a slurm-aigc run: table, JSON and a utilization plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_aigc.replay.metrics import BacklogFigures, RunMetrics, backlog_figures, compute, utilization_timeline
from slurm_aigc.replay.runner import RunRecord
from slurm_aigc.report.figures import DEFAULT_USEFUL_RULE, UsefulRule
from slurm_aigc.textfmt import text_table

Row = tuple[str, str, str, str]


def metrics_of(record: RunRecord, useful: UsefulRule = DEFAULT_USEFUL_RULE) -> RunMetrics:
    return compute(record.outcomes, record.samples, record.capacity_gpus, record.gpu_hours_reclaimed, now_ts=record.end_ts,
                   useful=useful)


def backlog_of(record: RunRecord, useful: UsefulRule = DEFAULT_USEFUL_RULE) -> BacklogFigures:
    """The window figures of a backlogged run (`record.backlog` > 0)."""
    if record.backlog <= 0:
        raise ValueError(f"the {record.mode} run was not backlogged")
    return backlog_figures(record.outcomes, record.samples, record.capacity_gpus, record.start_ts, record.duration_s,
                           record.backlog, gpu_hours_reclaimed=record.gpu_hours_reclaimed,
                           stream_exhausted=record.stream_exhausted, useful=useful)


def ratio(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return new / old


def comparison_rows(stock: RunMetrics, aigc: RunMetrics) -> list[tuple[str, str, str, str]]:
    """(figure, stock, slurm-aigc, aigc/stock) rows for the table."""
    def pct(value: float) -> str:
        return f"{100 * value:.1f} %"

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    def rel(new: float | None, old: float | None) -> str:
        value = ratio(new, old)
        return "-" if value is None else f"{value:.2f}x"

    rows = [
        ("jobs (completed)", f"{stock.jobs} ({stock.completed})", f"{aigc.jobs} ({aigc.completed})", ""),
        ("makespan", secs(stock.makespan_s), secs(aigc.makespan_s), rel(aigc.makespan_s, stock.makespan_s)),
        ("GPU allocation ratio", pct(stock.allocation_ratio), pct(aigc.allocation_ratio), rel(aigc.allocation_ratio, stock.allocation_ratio)),
        ("effective utilization (SM)", pct(stock.effective_utilization), pct(aigc.effective_utilization),
         rel(aigc.effective_utilization, stock.effective_utilization)),
        ("useful utilization", pct(stock.useful_utilization), pct(aigc.useful_utilization),
         rel(aigc.useful_utilization, stock.useful_utilization)),
        ("mean queue wait", secs(stock.mean_wait_s), secs(aigc.mean_wait_s), rel(aigc.mean_wait_s, stock.mean_wait_s)),
        ("p95 queue wait", secs(stock.p95_wait_s), secs(aigc.p95_wait_s), rel(aigc.p95_wait_s, stock.p95_wait_s)),
        ("jobs finished per hour", f"{stock.jobs_per_hour:.1f}", f"{aigc.jobs_per_hour:.1f}", rel(aigc.jobs_per_hour, stock.jobs_per_hour)),
        ("GPU-hours reclaimed", f"{stock.gpu_hours_reclaimed:.3f}", f"{aigc.gpu_hours_reclaimed:.3f}", ""),
        ("jobs requeued", str(stock.jobs_requeued), str(aigc.jobs_requeued), ""),
        ("jobs harmed (lost)", f"{stock.jobs_harmed} ({stock.jobs_lost})", f"{aigc.jobs_harmed} ({aigc.jobs_lost})", ""),
    ]
    stock_waits = {w.job_class: w for w in stock.waits}
    for wait in aigc.waits:
        before = stock_waits.get(wait.job_class)
        rows.append((f"mean wait: {wait.job_class}", secs(before.mean_wait_s if before else None), secs(wait.mean_wait_s),
                     rel(wait.mean_wait_s, before.mean_wait_s if before else None)))
    return rows


def backlog_rows(stock: BacklogFigures, aigc: BacklogFigures) -> list[Row]:
    """(figure, stock, slurm-aigc, aigc/stock) rows of two backlogged runs, over the same window."""
    def pct(value: float) -> str:
        return f"{100 * value:.1f} %"

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    def times(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    def both(name: str, fmt: Any, new: Any, old: Any, with_ratio: bool = True) -> Row:
        return (name, fmt(old), fmt(new), times(ratio(new, old)) if with_ratio else "")

    rows = [
        both("useful utilization", pct, aigc.useful_utilization, stock.useful_utilization),
        both("effective utilization (SM)", pct, aigc.effective_utilization, stock.effective_utilization),
        both("work completed (GPU-s)", lambda v: f"{v:.0f}", aigc.work_completed_gpu_s, stock.work_completed_gpu_s),
        both("jobs completed", str, aigc.completed, stock.completed),
        both("jobs submitted", str, aigc.submitted, stock.submitted, with_ratio=False),
        both("mean wait", secs, aigc.mean_wait_s, stock.mean_wait_s),
        both("p95 wait", secs, aigc.p95_wait_s, stock.p95_wait_s),
        both("shared jobs completed", str, aigc.shared_completed, stock.shared_completed, with_ratio=False),
        both("shared slowdown, median", times, aigc.shared_slowdown_median, stock.shared_slowdown_median, with_ratio=False),
        both("shared slowdown, p95", times, aigc.shared_slowdown_p95, stock.shared_slowdown_p95, with_ratio=False),
        both("sharing-caused timeouts", str, aigc.shared_timeouts, stock.shared_timeouts, with_ratio=False),
        both("jobs harmed", str, aigc.jobs_harmed, stock.jobs_harmed, with_ratio=False),
        both("jobs requeued", str, aigc.jobs_requeued, stock.jobs_requeued, with_ratio=False),
        both("jobs out of GPU memory, resubmitted", str, aigc.jobs_retried, stock.jobs_retried, with_ratio=False),
        both("GPU-hours reclaimed", lambda v: f"{v:.3f}", aigc.gpu_hours_reclaimed, stock.gpu_hours_reclaimed, with_ratio=False),
    ]
    stock_waits = {w.job_class: w for w in stock.waits}
    aigc_waits = {w.job_class: w for w in aigc.waits}
    for name in sorted(stock_waits.keys() | aigc_waits.keys()):
        old, new = stock_waits.get(name), aigc_waits.get(name)
        rows.append(both(f"mean wait: {name}", secs, new.mean_wait_s if new else None, old.mean_wait_s if old else None))
        rows.append(both(f"p95 wait: {name}", secs, new.p95_wait_s if new else None, old.p95_wait_s if old else None))
    return rows


BACKLOG_RATIOS = ("useful_utilization", "effective_utilization", "work_completed_gpu_s", "completed", "mean_wait_s", "p95_wait_s")


def backlog_json(stock: BacklogFigures, aigc: BacklogFigures, extra: dict[str, Any]) -> dict[str, Any]:
    """Both runs' window figures and the aigc/stock ratios the issue's targets are stated in."""
    stock_dict, aigc_dict = stock.to_dict(), aigc.to_dict()
    return {**extra, "mode": "backlog", "stock": stock_dict, "aigc": aigc_dict,
            "ratios": {key: ratio(aigc_dict[key], stock_dict[key]) for key in BACKLOG_RATIOS}}


def render_table(rows: Sequence[tuple[str, str, str, str]]) -> str:
    return text_table(("figure", "stock Slurm", "slurm-aigc", "ratio"), rows)


def comparison_json(stock: RunMetrics, aigc: RunMetrics, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        **extra,
        "stock": stock.to_dict(),
        "aigc": aigc.to_dict(),
        "ratios": {
            "effective_utilization": ratio(aigc.effective_utilization, stock.effective_utilization),
            "useful_utilization": ratio(aigc.useful_utilization, stock.useful_utilization),
            "allocation_ratio": ratio(aigc.allocation_ratio, stock.allocation_ratio),
            "mean_wait": ratio(aigc.mean_wait_s, stock.mean_wait_s),
            "makespan": ratio(aigc.makespan_s, stock.makespan_s),
            "jobs_per_hour": ratio(aigc.jobs_per_hour, stock.jobs_per_hour),
        },
    }


def plot_utilization(records: Sequence[RunRecord], path: Path, bucket_s: float = 10.0,
                     useful: UsefulRule = DEFAULT_USEFUL_RULE) -> Path:
    """SM (solid) and useful (dashed) utilization over time from each run's start, as PNG.

    A backlogged run is drawn over its window only.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for record in records:
        span = _plot_span(record)
        if span is None:
            continue
        name = "stock Slurm" if record.mode == "stock" else "slurm-aigc"
        for rule, style, what in ((None, "-", "SM"), (useful, "--", "useful")):
            timeline = utilization_timeline(record.samples, record.capacity_gpus, span[0], span[1], bucket_s, useful=rule)
            mean_pct = 100 * sum(u for _, u in timeline) / len(timeline) if timeline else 0.0
            axes.plot([t for t, _ in timeline], [100 * u for _, u in timeline], style, label=f"{name}, {what} (mean {mean_pct:.0f} %)")
    axes.set_xlabel("seconds since first submit")
    axes.set_ylabel("GPU utilization (% of capacity)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _plot_span(record: RunRecord) -> tuple[float, float] | None:
    if record.backlog > 0:
        return record.start_ts, record.start_ts + record.duration_s
    metrics = metrics_of(record)
    if metrics.window_start_ts is None or metrics.window_end_ts is None:
        return None
    return metrics.window_start_ts, metrics.window_end_ts
