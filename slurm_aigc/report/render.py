"""Rendering reports: terminal table, CSV, JSON, and HTML with PNG plots (matplotlib, Agg).

Missing figures are shown as what they are ("no samples", "-"), never as zero.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields
from datetime import datetime, tzinfo
from typing import Any

from slurm_aigc.report.figures import GpuUse, GroupFigures, JobView, Report
from slurm_aigc.report.records import ActionEvent
from slurm_aigc.report.sacct import JobRecord, SkippedRow
from slurm_aigc.textfmt import printable, text_table

FORMATS = ("table", "csv", "json", "html")
_SPARK = "▁▂▃▄▅▆▇█"
# (header, GroupFigures attribute, formatter) of the terminal/HTML table.
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "int"),
    ("gpu jobs", "gpu_jobs", "int"),
    ("GPU-h alloc", "gpu_hours_allocated", "hours"),
    ("whole", "whole_gpu_hours", "hours"),
    ("shard", "shard_gpu_hours", "hours"),
    ("GPU-h used", "gpu_hours_used", "used"),
    ("idle", "idle_gpu_hours", "used"),
    ("eff", "efficiency", "pct"),
    ("GPU-h useful", "gpu_hours_useful", "used"),
    ("useful eff", "useful_efficiency", "pct"),
    ("no-sample GPU-h", "gpu_hours_unsampled", "hours"),
    ("wait mean", "queue_wait_mean_s", "dur"),
    ("wait p95", "queue_wait_p95_s", "dur"),
    ("requeued", "jobs_requeued", "int"),
    ("aigc requeued", "jobs_requeued_by_aigc", "int"),
    ("aigc shrunk", "jobs_shrunk_by_aigc", "int"),
    ("GPU-h recovered", "gpu_hours_recovered", "hours"),
)


def fmt_duration(seconds: float | None) -> str:
    """Seconds as `45s`, `12m05s`, `3h07m`, `2d04h`; '-' when unknown."""
    if seconds is None:
        return "-"
    total = round(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 86400}d{total % 86400 // 3600:02d}h"


def fmt_hours(hours: float) -> str:
    """GPU-hours with the precision a short test job still shows: 0, 0.0123, 4.50, 1234.5."""
    if hours == 0:
        return "0"
    if abs(hours) < 1:
        return f"{hours:.4f}"
    return f"{hours:.2f}" if abs(hours) < 1000 else f"{hours:.1f}"


def _cell(kind: str, value: Any) -> str:
    if kind == "int":
        return str(value)
    if kind == "hours":
        return fmt_hours(value)
    if kind == "used":
        return "no samples" if value is None else fmt_hours(value)
    if kind == "pct":
        return "-" if value is None else f"{100.0 * value:.0f}%"
    return fmt_duration(value)


def _time(ts: float | None, tz: tzinfo | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M:%S")


def _rows(report: Report) -> tuple[list[str], list[list[str]]]:
    keys = list(report.params.group_by) or ["group"]
    header = keys + [name for name, _, _ in _COLUMNS]
    body = [list(g.key) + [_cell(kind, getattr(g, attr)) for _, attr, kind in _COLUMNS] for g in report.groups]
    if report.params.group_by:
        body.append(["TOTAL"] + [""] * (len(keys) - 1) + [_cell(kind, getattr(report.total, attr)) for _, attr, kind in _COLUMNS])
    return header, body


def _title(report: Report) -> str:
    p = report.params
    by = ", ".join(p.group_by) if p.group_by else "nothing (one total)"
    return f"GPU report {_time(p.since_ts, p.tz)} .. {_time(p.until_ts, p.tz)}, grouped by {by}"


def render_table(report: Report) -> str:
    header, body = _rows(report)
    notes = "\n".join(f"note: {n}" for n in report.notes)
    return f"{_title(report)}\n\n{text_table(header, body)}\n\n{notes}\n"


def render_csv(report: Report) -> str:
    """One row per group (plus TOTAL), every figure in its raw unit; empty = unknown."""
    out = io.StringIO()
    keys = list(report.params.group_by) or ["group"]
    names = [f.name for f in fields(GroupFigures) if f.name != "key"]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(keys + names)
    groups = list(report.groups) + ([report.total] if report.params.group_by else [])
    for g in groups:
        key = list(g.key) if g is not report.total else ["TOTAL"] + [""] * (len(keys) - 1)
        writer.writerow(key + ["" if getattr(g, n) is None else _raw(getattr(g, n)) for n in names])
    return out.getvalue()


def _raw(value: Any) -> str:
    return f"{value:.6f}" if isinstance(value, float) else str(value)


def report_dict(report: Report) -> dict[str, Any]:
    p = report.params
    return {
        "since": _time(p.since_ts, p.tz), "until": _time(p.until_ts, p.tz),
        "since_ts": p.since_ts, "until_ts": p.until_ts,
        "group_by": list(p.group_by), "shards_per_gpu": dict(p.shards_per_gpu),
        "groups": [_group_dict(g, p.group_by) for g in report.groups],
        "total": _group_dict(report.total, ()),
        "notes": list(report.notes),
        "skipped": [_skipped_dict(s) for s in report.skipped],
    }


def _group_dict(group: GroupFigures, group_by: Sequence[str]) -> dict[str, Any]:
    data = asdict(group)
    key = data.pop("key")
    return {"group": dict(zip(group_by, key, strict=True)) if group_by else {}, **data}


def _skipped_dict(row: SkippedRow) -> dict[str, Any]:
    return {"line_no": row.line_no, "reason": row.reason, "raw": row.raw, "source": row.source}


def render_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=2, sort_keys=False) + "\n"


def skipped_summary(skipped: Sequence[SkippedRow]) -> str:
    """What goes to stderr: a count by reason and each row (shortened)."""
    if not skipped:
        return ""
    lines = [f"slurm-aigc report: {len(skipped)} sacct row(s) skipped:"]
    for row in skipped:
        raw = row.raw.replace("\x1f", "|").replace("\n", "\\n")
        lines.append(f"  {row.source} line {row.line_no}: {row.reason}: {raw[:160]}")
    return "\n".join(lines) + "\n"


# -- plots --------------------------------------------------------------------------

def _figure_png(draw: Callable[[Any], None], size: tuple[float, float] = (8.0, 3.6)) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=size, dpi=100)
    try:
        draw(ax)
        return _png_bytes(fig)
    finally:
        pyplot.close(fig)


def _png_bytes(fig: Any) -> bytes:
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def report_plots(report: Report) -> dict[str, bytes]:
    """PNG plots of a report: utilization per class, allocated vs used, queue waits."""
    return {
        "utilization_by_class.png": _figure_png(lambda ax: _plot_util(ax, report)),
        "allocated_vs_used.png": _figure_png(lambda ax: _plot_alloc_used(ax, report)),
        "queue_wait.png": _figure_png(lambda ax: _plot_waits(ax, report)),
    }


def _plot_util(ax: Any, report: Report) -> None:
    tz = report.params.tz
    for cls, points in report.util_by_class.items():
        ax.plot([datetime.fromtimestamp(t, tz) for t, _ in points], [u for _, u in points], marker=".", label=cls)
    if not report.util_by_class:
        ax.text(0.5, 0.5, "no samples in this window", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(title="class", fontsize="small")
    ax.set_ylim(0, 105)
    ax.set_ylabel("mean SM utilization %")
    ax.set_title("GPU utilization over time per AIGC class")
    ax.figure.autofmt_xdate()


def _plot_alloc_used(ax: Any, report: Report) -> None:
    groups = list(report.groups)
    labels = ["/".join(g.key) for g in groups]
    xs = range(len(groups))
    ax.bar([x - 0.2 for x in xs], [g.gpu_hours_allocated for g in groups], width=0.4, label="allocated")
    ax.bar([x + 0.2 for x in xs], [g.gpu_hours_used or 0.0 for g in groups], width=0.4, label="used (sampled jobs)")
    for x, g in zip(xs, groups, strict=True):
        if g.gpu_hours_used is None:
            ax.text(x + 0.2, 0, "no samples", rotation=90, ha="center", va="bottom", fontsize="x-small")
    ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("GPU-hours")
    ax.set_title("Allocated vs used GPU-hours per group")
    ax.legend(fontsize="small")


def _plot_waits(ax: Any, report: Report) -> None:
    waits_min = [w / 60.0 for w in report.queue_waits_s]
    if waits_min:
        top = max(max(waits_min), 1.0)
        ax.hist(waits_min, bins=min(30, max(5, len(waits_min) // 2)), range=(0.0, top))
        ax.set_xlim(0.0, top)
    else:
        ax.text(0.5, 0.5, "no started jobs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("queue wait (minutes)")
    ax.set_ylabel("run segments")
    ax.set_title("Queue wait distribution")


def _img(name: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"><figcaption>{html.escape(name)}</figcaption></figure>'


_CSS = """body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}td.k{text-align:left}
tr.total td{font-weight:bold}figure{display:inline-block;margin:1em}pre{background:#f6f6f6;padding:.5em}"""


def _html_table(header: Sequence[str], body: Sequence[Sequence[str]], key_columns: int) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = []
    for row in body:
        cls = ' class="total"' if row and row[0] == "TOTAL" else ""
        cells = "".join(f'<td class="k">{html.escape(c)}</td>' if i < key_columns else f"<td>{html.escape(c)}</td>" for i, c in enumerate(row))
        rows.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _page(title: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"


def render_html(report: Report, plots: Mapping[str, bytes] | None = None) -> str:
    """A self-contained page: the table, notes, skipped rows and the PNG plots inline."""
    plots = report_plots(report) if plots is None else plots
    header, body = _rows(report)
    keys = len(report.params.group_by) or 1
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    skipped = "".join(f"<li>{html.escape(s.source)} line {s.line_no}: {html.escape(s.reason)}</li>" for s in report.skipped)
    parts = [
        f"<h1>{html.escape(_title(report))}</h1>", _html_table(header, body, keys),
        f"<h2>Notes</h2><ul>{notes}</ul>",
        f"<h2>Skipped sacct rows</h2><ul>{skipped or '<li>none</li>'}</ul>",
        "<h2>Plots</h2>", *(_img(name, png) for name, png in plots.items()),
    ]
    return _page(_title(report), "".join(parts))


def render_report(report: Report, fmt: str) -> str:
    renderers: dict[str, Callable[[Report], str]] = {
        "table": render_table, "csv": render_csv, "json": render_json, "html": render_html,
    }
    return renderers[fmt](report)


# -- one job --------------------------------------------------------------------------

def sparkline(values: Sequence[float | None], lo: float, hi: float, width: int = 48) -> str:
    """Values resampled to `width` cells of ▁..█ (a blank where nothing is known)."""
    if not values:
        return ""
    cells = []
    step = len(values) / min(width, len(values))
    for i in range(min(width, len(values))):
        chunk = [v for v in values[int(i * step):max(int((i + 1) * step), int(i * step) + 1)] if v is not None]
        if not chunk:
            cells.append(" ")
            continue
        level = (sum(chunk) / len(chunk) - lo) / (hi - lo) if hi > lo else 0.0
        cells.append(_SPARK[min(len(_SPARK) - 1, max(0, int(level * len(_SPARK))))])
    return "".join(cells)


def _segment_rows(view: JobView, tz: tzinfo | None) -> list[list[str]]:
    return [[r.job_id, r.state, r.partition, r.node_list or "-", r.alloc_tres or "-", _time(r.submit_ts, tz),
             _time(r.start_ts, tz), _time(r.end_ts, tz) if r.end_ts else ("running" if r.start_ts else "-"),
             fmt_duration(r.queue_wait_s)] for r in view.segments]


_SEGMENT_HEADER = ["job", "state", "partition", "nodes", "AllocTRES", "submit", "start", "end", "wait"]
_ACTION_HEADER = ["time", "verdict", "action", "state", "dry run", "GPUs", "GPU-h recovered", "detail"]


def _action_rows(actions: Sequence[ActionEvent], tz: tzinfo | None) -> list[list[str]]:
    return [[_time(a.ts, tz), a.verdict, a.action, a.state, "yes" if a.dry_run else "no",
             f"{a.gpus_before if a.gpus_before is not None else '-'}->{a.gpus_after if a.gpus_after is not None else '-'}",
             "-" if a.gpu_hours_recovered is None else f"{a.gpu_hours_recovered:.2f}", a.detail[:60]] for a in actions]


def _job_head(view: JobView) -> list[str]:
    first: JobRecord | None = view.segments[-1] if view.segments else None
    used = "no samples" if view.gpu_hours_used is None else f"{view.gpu_hours_used:.3f}"
    eff = "-" if view.efficiency is None else f"{100 * view.efficiency:.0f}%"
    lines = [f"Job {view.job_id}"]
    if first is not None:
        lines += [f"user/account: {first.user}/{first.account}  partition: {first.partition}  qos: {first.qos}",
                  f"name: {printable(first.name)}  AIGC class: {first.aigc_class}  state: {first.state}",
                  f"run segments: {len(view.segments)} (requeues: {max(0, len(view.segments) - 1)})"]
    else:
        lines.append("no sacct record for this job")
    lines.append(f"allocation: {view.gpus:g} GPU(s) of type {view.gpu_type}; GPU-hours allocated {view.gpu_hours_allocated:.3f}, used {used}, efficiency {eff}")
    return lines


def render_job_text(view: JobView, tz: tzinfo | None = None) -> str:
    lines = _job_head(view) + ["", text_table(_SEGMENT_HEADER, _segment_rows(view, tz)), ""]
    if not view.series:
        lines.append("GPU samples: none recorded for this job (utilization unknown)")
    for use in view.series:
        s = use.series
        total = use.memory_total_mib or s.peak_memory_mib or 1.0
        util = [p.sm_util_pct for p in s.samples]
        mem = [p.memory_used_mib for p in s.samples]
        mean = "-" if use.mean_util_pct is None else f"{use.mean_util_pct:.0f}%"
        peak = "-" if s.peak_memory_mib is None else f"{s.peak_memory_mib:.0f}/{total:.0f} MiB"
        lines.append(f"{s.node} GPU{s.gpu_index}: util mean {mean}  {sparkline(util, 0, 100)}")
        lines.append(f"{' ' * len(s.node)}       mem peak {peak}  {sparkline(mem, 0, total)}")
    lines += ["", "slurm-aigc verdicts and actions:"]
    lines.append(text_table(_ACTION_HEADER, _action_rows(view.actions, tz)) if view.actions else "  none")
    return "\n".join(lines) + "\n"


def job_plot(view: JobView, tz: tzinfo | None = None) -> bytes:
    """Per-GPU utilization and memory over time as one PNG (two stacked panels)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, (top, bottom) = pyplot.subplots(2, 1, figsize=(8.0, 5.0), dpi=100, sharex=True)
    try:
        for s in (use.series for use in view.series):
            times = [datetime.fromtimestamp(p.ts, tz) for p in s.samples]
            label = f"{s.node}/{s.gpu_index}"
            top.plot(times, [_nan(p.sm_util_pct) for p in s.samples], label=label)
            bottom.plot(times, [_nan(p.memory_used_mib) for p in s.samples], label=label)
        top.set_ylabel("SM util %")
        top.set_ylim(0, 105)
        bottom.set_ylabel("memory used MiB")
        totals = [s.memory_total_mib for s in view.series if s.memory_total_mib]
        bottom.set_ylim(0, max(totals) if totals else None)
        top.set_title(f"Job {view.job_id}: per-GPU utilization and memory")
        if view.series:
            top.legend(fontsize="small")
        fig.autofmt_xdate()
        return _png_bytes(fig)
    finally:
        pyplot.close(fig)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def render_job_html(view: JobView, tz: tzinfo | None = None) -> str:
    head = "".join(f"<p>{html.escape(line)}</p>" for line in _job_head(view)[1:])
    parts = [f"<h1>Job {html.escape(view.job_id)}</h1>", head,
             _html_table(_SEGMENT_HEADER, _segment_rows(view, tz), len(_SEGMENT_HEADER)),
             _img("per_gpu.png", job_plot(view, tz)) if view.series else "<p>No GPU samples for this job.</p>",
             "<h2>Verdicts and actions</h2>",
             _html_table(_ACTION_HEADER, _action_rows(view.actions, tz), len(_ACTION_HEADER)) if view.actions else "<p>none</p>"]
    return _page(f"Job {view.job_id}", "".join(parts))


def job_dict(view: JobView, tz: tzinfo | None = None) -> dict[str, Any]:
    return {
        "job_id": view.job_id, "gpus": view.gpus, "gpu_type": view.gpu_type,
        "gpu_hours_allocated": view.gpu_hours_allocated, "gpu_hours_used": view.gpu_hours_used,
        "efficiency": view.efficiency,
        "segments": [{"job_id": r.job_id, "state": r.state, "user": r.user, "account": r.account,
                      "partition": r.partition, "class": r.aigc_class, "alloc_tres": r.alloc_tres,
                      "node_list": r.node_list, "submit_ts": r.submit_ts, "start_ts": r.start_ts,
                      "end_ts": r.end_ts, "queue_wait_s": r.queue_wait_s} for r in view.segments],
        "gpus_series": [_series_dict(use) for use in view.series],
        "actions": [asdict(a) for a in view.actions],
        "skipped": [_skipped_dict(s) for s in view.skipped],
    }


def _series_dict(use: GpuUse) -> dict[str, Any]:
    s = use.series
    return {"node": s.node, "gpu_index": s.gpu_index, "mean_util_pct": use.mean_util_pct,
            "peak_memory_mib": s.peak_memory_mib, "memory_total_mib": use.memory_total_mib,
            "points": [[p.ts, p.sm_util_pct, p.memory_used_mib] for p in s.samples]}


def render_job(view: JobView, fmt: str, tz: tzinfo | None = None) -> str:
    if fmt == "json":
        return json.dumps(job_dict(view, tz), indent=2) + "\n"
    if fmt == "html":
        return render_job_html(view, tz)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["node", "gpu_index", "ts", "sm_util_pct", "memory_used_mib"])
        for s in (use.series for use in view.series):
            for p in s.samples:
                util, mem = p.sm_util_pct, p.memory_used_mib
                writer.writerow([s.node, s.gpu_index, f"{p.ts:.3f}", "" if util is None else util, "" if mem is None else mem])
        return out.getvalue()
    return render_job_text(view, tz)
