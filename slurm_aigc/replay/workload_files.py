"""Workload files on disk: the replay package's file boundary for `workload.py`'s pure format."""

from __future__ import annotations

from pathlib import Path

from slurm_aigc.fsio import atomic_write_text
from slurm_aigc.replay.workload import Workload, WorkloadError, format_workload, parse_workload


def read_workload(path: Path) -> Workload:
    """Read and validate a workload CSV; raises WorkloadError naming the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a leading BOM (Excel, PowerShell) is not part of the header
    except (OSError, UnicodeDecodeError) as error:
        raise WorkloadError(str(path), None, None, f"cannot read: {error}") from error
    return parse_workload(text, str(path))


def write_workload(workload: Workload, path: Path) -> None:
    """Write a workload file atomically, validated by parsing it back first (a bad one is never written)."""
    text = format_workload(workload)
    parse_workload(text, str(path))
    try:
        atomic_write_text(path, text)
    except OSError as error:
        raise WorkloadError(str(path), None, None, f"cannot write: {error.strerror or error}") from error
