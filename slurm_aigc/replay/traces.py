"""Readers of the public GPU traces: typed `TraceJob` rows plus every malformed row reported.

One function per trace (layouts in each trace's README under ../shared/traces/):
- `read_openb`: Alibaba cluster-trace-gpu-v2023 `openb_pod_list_*.csv` (FGD, ATC'23);
- `read_genai`: Alibaba cluster-trace-v2026-GenAI `lora_request_trace.csv` (SD/LoRA serving);
- `read_philly`: Pollux's per-job Philly extract `philly.csv` (ATC'19 trace, OSDI'21 artifact).

A malformed row becomes a `SkippedRow(line, reason)` and reading goes on; only a file that
cannot be read or lacks required columns raises `TraceError`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from slurm_aigc.errors import AigcError
from slurm_aigc.replay.tracejobs import SkippedRow as SkippedRow  # the records, re-exported
from slurm_aigc.replay.tracejobs import TraceJob as TraceJob
from slurm_aigc.replay.tracejobs import TraceRead as TraceRead

TRACES = ("alibaba-2023", "genai-2026", "philly")

# File a trace reader opens when given the trace's folder instead of a file.
DEFAULT_FILES = {
    "alibaba-2023": Path("alibaba-gpu-v2023") / "openb_pod_list_default.csv",
    "genai-2026": Path("alibaba-v2026-genai") / "lora_request_trace.csv",
    "philly": Path("philly-2017") / "pollux_philly_jobs.csv",
}

OPENB_COLUMNS = ("name", "num_gpu", "gpu_milli", "qos", "pod_phase", "creation_time", "deletion_time")
GENAI_COLUMNS = (
    "gmt_create",
    "predict_type",
    "predict_status",
    "exec_time_seconds",
    "num_images_per_prompt",
    "num_inference_steps",
    "checkpoint_model_version_id",
    "num_lora",
)
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
OPENB_MAX_GPUS = 8  # the openb nodes have at most 8 GPUs (README); more is a damaged row


class TraceError(AigcError):
    """A trace file cannot be read at all (missing, unreadable, wrong columns)."""

    exit_code = 2


class _RowError(ValueError):
    """One row is malformed; the reader turns it into a SkippedRow."""


def read_trace(trace: str, path: Path) -> TraceRead:
    """Read `trace` (one of TRACES) from a file, or from its default file under a folder."""
    readers: dict[str, Callable[[Path], TraceRead]] = {
        "alibaba-2023": read_openb,
        "genai-2026": read_genai,
        "philly": read_philly,
    }
    if trace not in readers:
        raise TraceError(f"unknown trace {trace!r}; use one of {', '.join(TRACES)}")
    return readers[trace](resolve_trace_file(trace, path))


def resolve_trace_file(trace: str, path: Path) -> Path:
    """A file path as is; a folder: its trace subfolder's default file, or the file inside it."""
    if not path.is_dir():
        return path
    default = DEFAULT_FILES[trace]
    for candidate in (path / default, path / default.name):
        if candidate.is_file():
            return candidate
    raise TraceError(f"{path}: no {default} (or {default.name}) inside")


# ---------------------------------------------------------------- openb


def read_openb(path: Path) -> TraceRead:
    """Read an openb pod list (`name,...,num_gpu,gpu_milli,...,creation_time,deletion_time,...`)."""
    return _read_csv(path, "alibaba-2023", OPENB_COLUMNS, _openb_row)


def _openb_row(row: Mapping[str, str], line: int) -> TraceJob:
    gpus = _int(row, "num_gpu", 0, OPENB_MAX_GPUS)
    milli = _int(row, "gpu_milli", 0, 1000)
    created = _float(row, "creation_time", 0.0)
    deleted = _float(row, "deletion_time", 0.0)
    if deleted < created:
        raise _RowError(f"deletion_time {deleted:g} before creation_time {created:g}")
    if gpus == 1 and milli == 0:
        raise _RowError("num_gpu 1 with gpu_milli 0")
    fraction = milli / 1000 if gpus == 1 and milli < 1000 else 1.0
    return TraceJob(
        source="alibaba-2023",
        line=line,
        job_id=_text(row, "name"),
        arrival_s=created,
        duration_s=deleted - created,
        gpus=gpus,
        gpu_fraction=fraction,
        qos=row["qos"].strip(),
        status=row["pod_phase"].strip(),
    )


# ---------------------------------------------------------------- genai


def read_genai(path: Path) -> TraceRead:
    """Read the GenAI request trace (`gmt_create,predict_type,...,exec_time_seconds,...`)."""
    return _read_csv(path, "genai-2026", GENAI_COLUMNS, _genai_row)


def _genai_row(row: Mapping[str, str], line: int) -> TraceJob:
    model = _text(row, "checkpoint_model_version_id")
    return TraceJob(
        source="genai-2026",
        line=line,
        job_id=f"req-{line}",
        arrival_s=_timestamp(row, "gmt_create"),
        duration_s=_float(row, "exec_time_seconds", 0.0),
        gpus=1,
        status=_text(row, "predict_status"),
        group=row.get("groupId", "").strip(),
        model=model,
        request_type=_text(row, "predict_type"),
        images=_optional_count(row, "num_images_per_prompt", default=1),
        steps=_optional_count(row, "num_inference_steps", default=0),
        loras=_optional_count(row, "num_lora", default=0),
    )


# ---------------------------------------------------------------- philly


def read_philly(path: Path) -> TraceRead:
    """Read Pollux's Philly extract (`timestamp,duration,num_gpus,gpu_time,cluster`)."""
    return _read_csv(path, "philly", PHILLY_COLUMNS, _philly_row)


def _philly_row(row: Mapping[str, str], line: int) -> TraceJob:
    duration = _float(row, "duration", 0.0)
    gpus = _int(row, "num_gpus", 1, 4096)
    gpu_time = _float(row, "gpu_time", 0.0)
    # gpu_time = duration * num_gpus holds for every real row (README); a row where it
    # does not is damaged and we cannot tell which field is right.
    if not math.isclose(gpu_time, duration * gpus, rel_tol=1e-6, abs_tol=1.0):
        raise _RowError(f"gpu_time {gpu_time:g} != duration {duration:g} x num_gpus {gpus}")
    return TraceJob(
        source="philly",
        line=line,
        job_id=f"philly-{line}",
        arrival_s=_timestamp(row, "timestamp"),
        duration_s=duration,
        gpus=gpus,
        group=_text(row, "cluster"),
    )


# ---------------------------------------------------------------- shared parsing


def _read_csv(
    path: Path,
    source: str,
    required: Sequence[str],
    parse: Callable[[Mapping[str, str], int], TraceJob],
) -> TraceRead:
    jobs: list[TraceJob] = []
    skipped: list[SkippedRow] = []
    try:
        # utf-8-sig: a leading BOM (a CSV saved by Excel) is not part of the first column's name.
        with path.open(newline="", encoding="utf-8-sig") as handle:
            for line, row in _rows(handle, path, required):
                if isinstance(row, str):
                    skipped.append(SkippedRow(line, row))
                    continue
                try:
                    jobs.append(parse(row, line))
                except _RowError as error:
                    skipped.append(SkippedRow(line, str(error)))
    except UnicodeDecodeError as error:
        raise TraceError(f"{path}: cannot read {source} trace: {_undecodable(path)}") from error
    except (OSError, csv.Error) as error:
        raise TraceError(f"{path}: cannot read {source} trace: {error}") from error
    jobs.sort(key=lambda j: (j.arrival_s, j.line))
    return TraceRead(tuple(jobs), tuple(skipped))


def _undecodable(path: Path) -> str:
    """Where the first byte that is not UTF-8 sits ('line 7: byte 0xff at column 12 is not UTF-8').

    Decoding line by line is exact: a newline byte never occurs inside a UTF-8 sequence.
    """
    try:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    return f"line {number}: byte {raw[error.start]:#04x} at column {error.start + 1} is not UTF-8"
    except OSError as error:
        return str(error)
    return "not UTF-8 text"


def _rows(handle: object, path: Path, required: Sequence[str]) -> Iterator[tuple[int, Mapping[str, str] | str]]:
    """(file line, row) for each data row, or (line, reason) when its cell count is wrong."""
    reader = csv.reader(handle)  # type: ignore[arg-type]
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{path}: empty file, expected columns {','.join(required)}")
    names = [h.strip() for h in header]
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; got {','.join(names)}")
    for cells in reader:
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(names):
            yield reader.line_num, f"expected {len(names)} cells, got {len(cells)}"
            continue
        yield reader.line_num, dict(zip(names, cells))


def _text(row: Mapping[str, str], column: str) -> str:
    value = row[column].strip()
    if not value:
        raise _RowError(f"{column} is empty")
    return value


def _float(row: Mapping[str, str], column: str, minimum: float) -> float:
    raw = row[column].strip()
    try:
        value = float(raw)
    except ValueError:
        raise _RowError(f"{column} {raw!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise _RowError(f"{column} {raw!r} is not a number >= {minimum:g}")
    return value


def _int(row: Mapping[str, str], column: str, minimum: int, maximum: int) -> int:
    raw = row[column].strip()
    try:
        value = int(raw)
    except ValueError:
        raise _RowError(f"{column} {raw!r} is not an integer") from None
    if not minimum <= value <= maximum:
        raise _RowError(f"{column} {value} outside {minimum}..{maximum}")
    return value


def _optional_count(row: Mapping[str, str], column: str, default: int) -> int:
    """A count written as '4.0' (the genai trace's float columns); empty reads as `default`."""
    raw = row[column].strip()
    if not raw:
        return default
    value = _float(row, column, 0.0)
    if value != int(value):
        raise _RowError(f"{column} {raw!r} is not a whole count")
    return int(value)


def _timestamp(row: Mapping[str, str], column: str) -> float:
    """'2017-10-09 07:01:55' -> UNIX seconds; the traces' clocks are anonymized, so read as UTC."""
    raw = row[column].strip()
    try:
        parsed = datetime.strptime(raw, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise _RowError(f"{column} {raw!r} is not YYYY-MM-DD HH:MM:SS") from None
    return parsed.replace(tzinfo=UTC).timestamp()
