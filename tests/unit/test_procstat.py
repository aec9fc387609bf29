"""`/proc/<pid>/stat`: the one parser, against the names a process may give itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_aigc.telemetry.attribution import job_from_ancestry
from slurm_aigc.telemetry.procfs import ProcFs
from slurm_aigc.telemetry.procstat import parent_pid_of, start_ticks_of, stat_fields


def stat_line(pid: int, comm: str, ppid: int = 1, start: int = 4242) -> str:
    """A stat line as the kernel prints it: fields 3..21, then starttime (22) and two more."""
    middle = ["S", str(ppid)] + ["0"] * 17
    return f"{pid} ({comm}) {' '.join(middle)} {start} 9 10\n"


@pytest.mark.parametrize("comm", ["python3", "a b", "x) R 9 9 (y", ") S 1 2 3", "((()))", "a)\nb", ""])
def test_hostile_command_names_do_not_shift_the_fields(comm: str) -> None:
    line = stat_line(5, comm, ppid=77, start=4242)
    assert stat_fields(line)[0] == comm
    assert (parent_pid_of(line), start_ticks_of(line)) == (77, 4242)


def test_short_or_missing_text_is_unknown() -> None:
    assert start_ticks_of("5 (x) S 1") is None and start_ticks_of(None) is None
    assert parent_pid_of("5 (x)") is None and start_ticks_of("5 (x) S 1 " + "z " * 30) is None


class FakeProc:
    """The ProcView `job_from_ancestry` reads, over stat lines written by the test."""

    def __init__(self, stats: dict[int, str]) -> None:
        self.stats = stats

    def stat(self, pid: int) -> str | None:
        return self.stats.get(pid)

    def status(self, pid: int) -> str | None:
        return "Uid:\t0\t0\t0\t0\n" if pid == 10 else "Uid:\t1001\t1001\t1001\t1001\n"

    def cmdline(self, pid: int) -> str | None:
        return "slurmstepd: [321.batch]\0" if pid == 10 else "x\0"


def test_ancestry_walks_past_a_process_named_like_a_stat_line() -> None:
    proc = FakeProc({30: stat_line(30, "slurmstepd) S 1 (z", ppid=20), 20: stat_line(20, "bash", ppid=10),
                     10: stat_line(10, "slurmstepd", ppid=1)})
    assert job_from_ancestry(proc, 30) == "321"


def test_a_real_process_keeps_its_start_time_when_it_renames_itself() -> None:
    """The procfs boundary feeds the parser: a child renames itself to a hostile name (/proc/self/comm)."""
    hostile = "x) R 9 9 (y"
    rename = f"import sys; sys.stdin.readline(); open('/proc/self/comm', 'w').write({hostile!r}); sys.stdin.readline()"
    child = subprocess.Popen([sys.executable, "-c", rename], stdin=subprocess.PIPE, text=True)
    proc = ProcFs(Path("/proc"))
    try:
        before = proc.start_ticks(child.pid)
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + 10.0
        while stat_fields(proc.stat(child.pid) or "")[0] != hostile:
            assert time.monotonic() < deadline, proc.stat(child.pid)
            time.sleep(0.01)
        assert before is not None and proc.start_ticks(child.pid) == before
        assert parent_pid_of(proc.stat(child.pid) or "") == os.getpid()
    finally:
        child.kill()
        child.wait()


def test_a_vanished_pid_has_no_start_time() -> None:
    assert ProcFs(Path("/proc")).start_ticks(2**22 + 12345) is None
    own = ProcFs(Path("/proc")).start_ticks(os.getpid())
    assert own is not None and own == ProcFs(Path("/proc")).start_ticks(os.getpid())
