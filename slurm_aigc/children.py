"""Daemons a run starts as child processes (the replay, benchmarks): output to a log, stopped together.

One place for the start and the stop, so every caller gives its daemons the same chance to
finish their tick on SIGTERM (docs/daemons.md) before SIGKILL.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


def spawn_logged(argv: Sequence[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start `argv` with stdout and stderr appended to `log` (the parent keeps no handle open)."""
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=dict(env))


def stop_all(processes: Iterable[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """SIGTERM every one still running, then wait for each; SIGKILL one still alive `timeout_s` later.

    All get SIGTERM first, so the waits overlap: stopping N daemons takes one timeout at most, not N.
    """
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.terminate()
    for process in running:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
