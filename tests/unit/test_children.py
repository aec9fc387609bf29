"""Daemons started and stopped as child processes (slurm_aigc.children): logs, SIGTERM, then SIGKILL."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from slurm_aigc.children import spawn_logged, stop_all

# Prints a line once its SIGTERM handler is set, then waits; `ignore` makes it outlive SIGTERM.
CHILD = """
import signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
print("to stderr", file=sys.stderr, flush=True)
time.sleep(120)
"""


def wait_for(path: Path, text: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"{path} never showed {text!r}"
        time.sleep(0.02)  # polling the log for the condition, with a deadline


def test_spawn_logs_both_streams_and_stop_terminates_then_kills(tmp_path: Path) -> None:
    polite, stubborn = tmp_path / "polite.log", tmp_path / "stubborn.log"
    procs = [spawn_logged([sys.executable, "-c", CHILD, mode], log, os.environ)
             for mode, log in (("polite", polite), ("ignore", stubborn))]
    for log in (polite, stubborn):
        wait_for(log, "to stderr")
    assert polite.read_text().splitlines()[0] == "ready"
    began = time.monotonic()
    stop_all(procs, timeout_s=1.0)
    assert [p.returncode for p in procs] == [-signal.SIGTERM, -signal.SIGKILL]
    assert time.monotonic() - began < 10  # the stubborn one was killed after its timeout, not left


def test_stop_skips_processes_that_already_ended(tmp_path: Path) -> None:
    done = spawn_logged([sys.executable, "-c", "print('bye')"], tmp_path / "done.log", os.environ)
    done.wait(timeout=20)
    stop_all([done], timeout_s=1.0)
    assert done.returncode == 0 and (tmp_path / "done.log").read_text() == "bye\n"
