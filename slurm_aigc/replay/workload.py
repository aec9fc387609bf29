"""The workload file: one timed AIGC job per CSV row, what `slurm-aigc replay --workload` runs.

Format (documented in docs/replay.md): optional leading `#` comment lines (`# key: value`
metadata such as the generator's seed and compression factor), then a header row with
exactly the columns of `COLUMNS`, then one job a row. Reading is strict: every problem is a
`WorkloadError` naming the file, the line and the column. Pure: text in, text out; the file
itself is read and written by `slurm_aigc.replay.workload_files`.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_aigc.errors import AigcError
from slurm_aigc.profiles import Phase, ProfileError, format_phases, parse_phases, total_seconds
from slurm_aigc.tags import TAG_PREFIX, tag_pairs
from slurm_aigc.textfmt import short_number
from slurm_aigc.validation import parse_size_gib

FORMAT_VERSION = "1"
_VERSION_KEY = "slurm-aigc workload"

CLASSES = ("train", "finetune", "infer", "imagegen", "videogen", "audio", "batch", "interactive", "unknown")

COLUMNS = (
    "name",
    "submit_offset_s",
    "class",
    "gpus",
    "vram_gib_per_gpu",
    "duration_s",
    "time_limit_s",
    "profile",
    "requeue_profile",
    "gpus_used",
    "mem_used_gib_per_gpu",
    "util_pct",
    "tags",
    "share",
    "nvlink",
    "model",
    "user",
    "requeue",
    "source",
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_YES_NO = ("yes", "no")
# The duration column restates the profile's length; rounding to 0.1 s when written is allowed.
_DURATION_TOLERANCE_S = 0.5
# Upper bounds no replayable row comes near; a bigger value is a typo or a damaged file.
MAX_SECONDS = 366 * 86400  # submit offsets, durations, time limits: a year
MAX_GPUS = 4096  # GPUs of one job
MAX_VRAM_GIB = 1024.0  # VRAM of one GPU
_MAX_DIGITS = 18  # longer digit strings are out of range anyway (and int() refuses > 4300 digits)


class WorkloadError(AigcError):
    """A workload file or row is invalid: names the file, the line, the column and the problem."""

    exit_code = 2

    def __init__(self, source: str, line: int | None, column: str | None, problem: str) -> None:
        self.source = source
        self.line = line
        self.column = column
        self.problem = problem
        where = source
        if line is not None:
            where += f": line {line}"
        if column:
            where += f": column {column}"
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload; column meanings are in docs/replay.md."""

    name: str
    submit_offset_s: float
    job_class: str
    gpus: int
    vram_gib_per_gpu: float
    duration_s: float
    time_limit_s: int
    profile: tuple[Phase, ...]
    requeue_profile: tuple[Phase, ...] = ()
    gpus_used: int = 0  # 0 reads as "all of `gpus`"
    mem_used_gib_per_gpu: float = 0.0
    util_pct: float = 0.0
    tags: str = ""
    share: str = ""
    nvlink: str = ""
    model: str = ""
    user: str = ""
    requeue: bool = True
    source: str = ""

    @property
    def effective_gpus_used(self) -> int:
        return self.gpus_used or self.gpus


@dataclass(frozen=True)
class Workload:
    """A whole workload: its jobs sorted by submit offset and its `# key: value` metadata."""

    jobs: tuple[WorkloadJob, ...]
    meta: Mapping[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- tags


def parse_tags(comment: str) -> dict[str, str]:
    """The `aigc:` tag of a workload row (`exp42 aigc:type=infer,vram=20G`) -> {key: value}; `{}` for none.

    Split by the hook's own grammar (`slurm_aigc.tags.tag_pairs`), then checked strictly: a
    second `aigc:`, a pair that is not key=value, an empty value or a repeated key raises
    ValueError, since the hook would ignore or drop it and the replayed job would not be
    what the row says.
    """
    if comment.count(TAG_PREFIX) > 1:
        raise ValueError("more than one aigc: tag")
    pairs: dict[str, str] = {}
    for key, value in tag_pairs(comment):
        if not value:
            raise ValueError(f"tag part {key!r} is not key=value")
        if key in pairs:
            raise ValueError(f"tag key {key!r} repeated")
        pairs[key] = value
    return pairs


def format_tags(pairs: Mapping[str, str]) -> str:
    """{key: value} -> 'aigc:type=infer,vram=8G' (insertion order kept); '' for none."""
    if not pairs:
        return ""
    return TAG_PREFIX + ",".join(f"{k}={v}" for k, v in pairs.items())


# ---------------------------------------------------------------- reading


def parse_workload(text: str, source: str = "<workload>") -> Workload:
    """Parse and validate workload CSV text; raises WorkloadError naming `source`, line and column.

    Files are read by `slurm_aigc.replay.workload_files.read_workload` (this module does no I/O).
    """
    lines = text.splitlines(keepends=True)
    meta, first = _read_meta(lines)
    version = meta.pop(_VERSION_KEY, FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise WorkloadError(source, 1, None, f"workload format version {version!r} unsupported; this slurm-aigc reads {FORMAT_VERSION!r}")
    reader = csv.reader(lines[first:])
    rows = _csv_rows(reader, source, first)
    header = next(rows, None)
    if header is None:
        raise WorkloadError(source, first + 1, None, "no header row")
    _check_header(header, source, first + 1)
    jobs: list[WorkloadJob] = []
    names: dict[str, int] = {}
    for row in rows:
        if not row or all(not cell.strip() for cell in row):
            continue
        line = first + reader.line_num
        job = _parse_row(row, source, line)
        if job.name in names:
            raise WorkloadError(source, line, "name", f"duplicate name {job.name!r} (first on line {names[job.name]})")
        names[job.name] = line
        jobs.append(job)
    if not jobs:
        raise WorkloadError(source, None, None, "no jobs")
    jobs.sort(key=lambda j: j.submit_offset_s)  # stable: file order breaks ties
    return Workload(tuple(jobs), meta)


def _csv_rows(reader: Any, source: str, first: int) -> Iterator[list[str]]:
    """The reader's rows; a csv.Error (e.g. a field over the csv module's 128 KiB) becomes a WorkloadError."""
    try:
        yield from reader
    except csv.Error as error:
        raise WorkloadError(source, first + reader.line_num, None, f"not readable as CSV: {error}") from error


def _read_meta(lines: Sequence[str]) -> tuple[dict[str, str], int]:
    meta: dict[str, str] = {}
    index = 0
    while index < len(lines) and lines[index].startswith("#"):
        key, sep, value = lines[index][1:].partition(":")
        if sep and key.strip():
            meta[key.strip()] = value.strip()
        index += 1
    return meta, index


def _check_header(header: Sequence[str], source: str, line: int) -> None:
    names = [h.strip() for h in header]
    missing = [c for c in COLUMNS if c not in names]
    unknown = [c for c in names if c not in COLUMNS]
    if missing or unknown or len(set(names)) != len(names):
        problem = []
        if missing:
            problem.append(f"missing column(s) {', '.join(missing)}")
        if unknown:
            problem.append(f"unknown column(s) {', '.join(unknown)}")
        if len(set(names)) != len(names):
            problem.append("repeated column(s)")
        raise WorkloadError(source, line, None, "; ".join(problem) + f"; expected: {','.join(COLUMNS)}")
    if tuple(names) != COLUMNS:
        raise WorkloadError(source, line, None, f"columns out of order; expected: {','.join(COLUMNS)}")


class _Row:
    """Typed access to one row's cells; every failure names the column."""

    def __init__(self, cells: Sequence[str], source: str, line: int) -> None:
        if len(cells) != len(COLUMNS):
            raise WorkloadError(source, line, None, f"expected {len(COLUMNS)} cells, got {len(cells)}")
        self.values = dict(zip(COLUMNS, (c.strip() for c in cells)))
        self.source = source
        self.line = line

    def error(self, column: str, problem: str) -> WorkloadError:
        return WorkloadError(self.source, self.line, column, problem)

    def text(self, column: str) -> str:
        return self.values[column]

    def number(
        self, column: str, *, minimum: float = 0.0, maximum: float = math.inf, strict: bool = False, default: float | None = None
    ) -> float:
        raw = self.values[column]
        if raw == "" and default is not None:
            return default
        value = _finite_float(raw)
        if value is None or not minimum <= value <= maximum or (strict and value == minimum):
            bound = f"> {_number(minimum)}" if strict else f">= {_number(minimum)}"
            bound += f" and <= {_number(maximum)}" if math.isfinite(maximum) else ""
            raise self.error(column, f"expected a number {bound}, got {raw!r}")
        return value

    def integer(self, column: str, *, minimum: int, maximum: int, default: int | None = None) -> int:
        raw = self.values[column]
        if raw == "" and default is not None:
            return default
        if not re.fullmatch(rf"\d{{1,{_MAX_DIGITS}}}", raw) or not minimum <= int(raw) <= maximum:
            raise self.error(column, f"expected an integer >= {minimum} and <= {maximum}, got {raw!r}")
        return int(raw)

    def choice(self, column: str, allowed: Sequence[str]) -> str:
        raw = self.values[column]
        if raw not in allowed:
            raise self.error(column, f"expected one of {', '.join(repr(a) for a in allowed)}, got {raw!r}")
        return raw

    def phases(self, column: str) -> tuple[Phase, ...]:
        try:
            return parse_phases(self.values[column], allow_repeat=False)[0]
        except ProfileError as error:
            raise self.error(column, str(error)) from error


def _parse_row(cells: Sequence[str], source: str, line: int) -> WorkloadJob:
    row = _Row(cells, source, line)
    name = row.text("name")
    if not _NAME_RE.match(name):
        raise row.error("name", f"expected letters, digits, '.', '_', '-' (at most 128), got {name!r}")
    gpus = row.integer("gpus", minimum=1, maximum=MAX_GPUS)
    job = WorkloadJob(
        name=name,
        submit_offset_s=row.number("submit_offset_s", maximum=MAX_SECONDS),
        job_class=row.choice("class", CLASSES),
        gpus=gpus,
        vram_gib_per_gpu=row.number("vram_gib_per_gpu", strict=True, maximum=MAX_VRAM_GIB),
        duration_s=row.number("duration_s", strict=True, maximum=MAX_SECONDS),
        time_limit_s=row.integer("time_limit_s", minimum=60, maximum=MAX_SECONDS),
        profile=row.phases("profile"),
        requeue_profile=row.phases("requeue_profile"),
        gpus_used=row.integer("gpus_used", minimum=0, maximum=MAX_GPUS, default=0),
        mem_used_gib_per_gpu=row.number("mem_used_gib_per_gpu", maximum=MAX_VRAM_GIB, default=0.0),
        util_pct=row.number("util_pct", default=0.0),
        tags=row.text("tags"),
        share=row.choice("share", ("", *_YES_NO)),
        nvlink=row.choice("nvlink", ("", *_YES_NO)),
        model=row.text("model"),
        user=row.text("user"),
        requeue=row.choice("requeue", _YES_NO) == "yes",
        source=row.text("source"),
    )
    _check_job(job, row)
    return job


def _check_job(job: WorkloadJob, row: _Row) -> None:
    """Cross-column rules: each names the column that breaks it."""
    if not job.profile:
        raise row.error("profile", "empty profile; a job needs at least one phase")
    if abs(total_seconds(job.profile) - job.duration_s) > _DURATION_TOLERANCE_S:
        raise row.error("duration_s", f"{_number(job.duration_s)} differs from the profile's {_number(total_seconds(job.profile))} s")
    if total_seconds(job.requeue_profile) > MAX_SECONDS:
        raise row.error("requeue_profile", f"lasts {_number(total_seconds(job.requeue_profile))} s, more than {MAX_SECONDS} s")
    if job.time_limit_s % 60:
        raise row.error("time_limit_s", f"Slurm time limits are whole minutes; {job.time_limit_s} is not a multiple of 60")
    hangs = any(p.kind == "hung" for p in job.profile)
    if not hangs and job.duration_s > job.time_limit_s:
        raise row.error("time_limit_s", f"{job.time_limit_s} s is shorter than the job's duration {_number(job.duration_s)} s")
    if job.gpus_used > job.gpus:
        raise row.error("gpus_used", f"{job.gpus_used} exceeds gpus {job.gpus}")
    if job.mem_used_gib_per_gpu > job.vram_gib_per_gpu:
        raise row.error("mem_used_gib_per_gpu", f"{_number(job.mem_used_gib_per_gpu)} exceeds vram_gib_per_gpu {_number(job.vram_gib_per_gpu)}")
    if job.util_pct > 100:
        raise row.error("util_pct", f"expected at most 100, got {_number(job.util_pct)}")
    _check_tags(job, row)


def _check_tags(job: WorkloadJob, row: _Row) -> None:
    try:
        pairs = parse_tags(job.tags)
    except ValueError as error:
        raise row.error("tags", str(error)) from error
    if job.tags and not pairs:
        raise row.error("tags", f"expected an aigc:key=value tag, got {job.tags!r}")
    if "type" in pairs and pairs["type"] != job.job_class:
        raise row.error("tags", f"type={pairs['type']} disagrees with class {job.job_class}")
    if "vram" in pairs:
        try:
            vram = parse_size_gib(pairs["vram"])
        except ValueError as error:
            raise row.error("tags", str(error)) from error
        if abs(vram - job.vram_gib_per_gpu) > 0.5:
            raise row.error("tags", f"vram={pairs['vram']} disagrees with vram_gib_per_gpu {_number(job.vram_gib_per_gpu)}")
    for key, column in (("share", job.share), ("nvlink", job.nvlink), ("model", job.model)):
        if key in pairs and column and pairs[key] != column:
            raise row.error("tags", f"{key}={pairs[key]} disagrees with column {key} {column!r}")


# ---------------------------------------------------------------- writing


def format_workload(workload: Workload) -> str:
    """Workload -> CSV text that `parse_workload` reads back to an equal Workload."""
    out = io.StringIO()
    out.write(f"# {_VERSION_KEY}: {FORMAT_VERSION}\n")
    for key, value in workload.meta.items():
        if key == _VERSION_KEY:
            continue
        clean = " ".join(str(value).split())
        out.write(f"# {key}: {clean}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for job in workload.jobs:
        writer.writerow(_cells(job))
    return out.getvalue()


def _cells(job: WorkloadJob) -> list[str]:
    return [
        job.name,
        _number(job.submit_offset_s),
        job.job_class,
        str(job.gpus),
        _number(job.vram_gib_per_gpu),
        _number(job.duration_s),
        str(job.time_limit_s),
        format_phases(job.profile),
        format_phases(job.requeue_profile),
        str(job.gpus_used),
        _number(job.mem_used_gib_per_gpu),
        _number(job.util_pct),
        job.tags,
        job.share,
        job.nvlink,
        job.model,
        job.user,
        "yes" if job.requeue else "no",
        job.source,
    ]


# ---------------------------------------------------------------- summary


@dataclass(frozen=True)
class ClassSummary:
    """Per-class figures `replay show` prints."""

    job_class: str
    jobs: int
    gpus_requested: int
    gpu_seconds_requested: float
    mean_duration_s: float
    shareable: int
    idle_tail: int
    hung: int
    over_allocated: int


def summarize(jobs: Iterable[WorkloadJob]) -> list[ClassSummary]:
    """Group jobs by class (sorted by class name) with counts of each usage pattern."""
    by_class: dict[str, list[WorkloadJob]] = {}
    for job in jobs:
        by_class.setdefault(job.job_class, []).append(job)
    return [_summary(name, group) for name, group in sorted(by_class.items())]


def _summary(name: str, group: Sequence[WorkloadJob]) -> ClassSummary:
    return ClassSummary(
        job_class=name,
        jobs=len(group),
        gpus_requested=sum(j.gpus for j in group),
        gpu_seconds_requested=sum(j.gpus * min(j.duration_s, j.time_limit_s) for j in group),
        mean_duration_s=sum(j.duration_s for j in group) / len(group),
        shareable=sum(1 for j in group if j.share == "yes"),
        idle_tail=sum(1 for j in group if j.profile[-1].kind == "idle"),
        hung=sum(1 for j in group if any(p.kind == "hung" for p in j.profile)),
        over_allocated=sum(1 for j in group if j.effective_gpus_used < j.gpus),
    )


def span_s(jobs: Sequence[WorkloadJob]) -> float:
    """Last submit offset plus that job's duration, capped by time limits: a lower bound on makespan."""
    return max((j.submit_offset_s + min(j.duration_s, j.time_limit_s) for j in jobs), default=0.0)


# ---------------------------------------------------------------- helpers


def _number(value: float) -> str:
    """30 not 30.0 (`short_number`); nan, inf and huge values as Python writes them, so a job holding
    one is written and then refused by the parse-back check with its line and column, not a traceback."""
    return short_number(value) if math.isfinite(value) and abs(value) < 1e15 else repr(value)


def _finite_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None

