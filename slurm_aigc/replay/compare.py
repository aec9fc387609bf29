"""Side-by-side figures of a stock and a slurm-aigc run: table, JSON and a utilization plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_aigc.replay.metrics import RunMetrics, compute, utilization_timeline
from slurm_aigc.replay.runner import RunRecord
from slurm_aigc.textfmt import text_table


def metrics_of(record: RunRecord) -> RunMetrics:
    return compute(record.outcomes, record.samples, record.capacity_gpus, record.gpu_hours_reclaimed, now_ts=record.end_ts)


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
        ("effective utilization", pct(stock.effective_utilization), pct(aigc.effective_utilization),
         rel(aigc.effective_utilization, stock.effective_utilization)),
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


def render_table(rows: Sequence[tuple[str, str, str, str]]) -> str:
    return text_table(("figure", "stock Slurm", "slurm-aigc", "ratio"), rows)


def comparison_json(stock: RunMetrics, aigc: RunMetrics, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        **extra,
        "stock": stock.to_dict(),
        "aigc": aigc.to_dict(),
        "ratios": {
            "effective_utilization": ratio(aigc.effective_utilization, stock.effective_utilization),
            "allocation_ratio": ratio(aigc.allocation_ratio, stock.allocation_ratio),
            "mean_wait": ratio(aigc.mean_wait_s, stock.mean_wait_s),
            "makespan": ratio(aigc.makespan_s, stock.makespan_s),
            "jobs_per_hour": ratio(aigc.jobs_per_hour, stock.jobs_per_hour),
        },
    }


def plot_utilization(records: Sequence[RunRecord], path: Path, bucket_s: float = 10.0) -> Path:
    """Utilization over time (from each run's start) for every run, one line each, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for record in records:
        metrics = metrics_of(record)
        if metrics.window_start_ts is None or metrics.window_end_ts is None:
            continue
        timeline = utilization_timeline(record.samples, record.capacity_gpus, metrics.window_start_ts,
                                        metrics.window_end_ts, bucket_s)
        label = f"{'stock Slurm' if record.mode == 'stock' else 'slurm-aigc'} (mean {100 * metrics.effective_utilization:.0f} %)"
        axes.plot([t for t, _ in timeline], [100 * u for _, u in timeline], label=label)
    axes.set_xlabel("seconds since first submit")
    axes.set_ylabel("effective GPU utilization (% of capacity)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
