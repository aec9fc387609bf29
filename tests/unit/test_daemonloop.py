"""DaemonLoop: ticks, stop/reload signals, backoff after errors; fake time, then real signals once."""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_aigc.daemonloop import Backoff, DaemonLoop, TickOutcome
from slurm_aigc.telemetry.config import parse_agent_section
from slurm_aigc.validation import Node

REPO = Path(__file__).resolve().parents[2]


class FakeTime:
    """A clock plus a waiter: a wait returns a queued signal at once, else a scripted one, else times out."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []
        self.script: list[tuple[float, int]] = []  # (at time, signal) delivered during waits

    def clock(self) -> float:
        return self.now

    def wait(self, signals: queue.SimpleQueue[int], timeout_s: float) -> int | None:
        self.waits.append(round(timeout_s, 6))
        if not signals.empty():
            return signals.get_nowait()
        if self.script and self.script[0][0] <= self.now + timeout_s:
            at, signum = self.script.pop(0)
            self.now = at
            return signum
        self.now += timeout_s
        return None


def no_signals(_enqueue: Callable[[int], None]) -> Callable[[], None]:
    return lambda: None


def make_loop(tick: Callable[[], None], fake: FakeTime, **kwargs: object) -> DaemonLoop:
    return DaemonLoop(tick, 10.0, clock=fake.clock, wait=fake.wait, install_signals=no_signals,
                      rand=lambda: 0.0, **kwargs)  # type: ignore[arg-type]


def test_once_runs_one_tick_and_reports_its_outcome() -> None:
    fake, ticks = FakeTime(), []
    assert make_loop(lambda: ticks.append(1), fake).run(once=True) == 0
    assert ticks == [1] and fake.waits == []

    def boom() -> None:
        raise RuntimeError("nvml went away")

    assert make_loop(boom, fake).run(once=True) == 1


def test_ticks_every_interval_until_sigterm_and_finishes_the_tick() -> None:
    fake = FakeTime()
    events: list[str] = []
    loop: DaemonLoop

    def tick() -> None:
        events.append(f"start@{fake.now:g}")
        if len(events) == 5:  # the third tick: SIGTERM arrives in the middle of it
            loop.enqueue(signal.SIGTERM)
        events.append("end")

    loop = make_loop(tick, fake)
    assert loop.run() == 0
    assert events == ["start@0", "end", "start@10", "end", "start@20", "end"]
    assert loop.ticks == 3


def test_a_stop_signal_is_visible_to_the_tick_it_arrives_in_and_sighup_is_not_a_stop() -> None:
    fake = FakeTime()
    seen: list[bool] = []
    loop: DaemonLoop

    def tick() -> None:
        loop.enqueue(signal.SIGHUP)
        seen.append(loop.stop_requested)
        loop.enqueue(signal.SIGTERM)  # the controller's actuator reads this between its actions
        seen.append(loop.stop_requested)

    loop = make_loop(tick, fake, reload=lambda: None)
    assert loop.run() == 0 and seen == [False, True]


def test_sigint_stops_too() -> None:
    fake = FakeTime()
    fake.script = [(3.0, signal.SIGINT)]
    loop = make_loop(lambda: None, fake)
    assert loop.run() == 0 and loop.ticks == 1 and fake.now == 3.0


def test_sighup_reloads_and_the_wait_continues_to_the_same_deadline() -> None:
    fake = FakeTime()
    fake.script = [(4.0, signal.SIGHUP), (35.0, signal.SIGTERM)]
    reloads: list[float] = []
    ticks: list[float] = []
    loop = make_loop(lambda: ticks.append(fake.now), fake, reload=lambda: reloads.append(fake.now))
    assert loop.run() == 0
    assert reloads == [4.0]
    assert ticks == [0.0, 10.0, 20.0, 30.0]  # the reload did not shift the tick schedule
    assert fake.waits[:2] == [10.0, 6.0]


def test_invalid_config_on_sighup_keeps_the_old_one_and_logs_why(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeTime()
    fake.script = [(1.0, signal.SIGHUP), (50.0, signal.SIGTERM)]
    config = {"agent": parse_agent_section(Node("x.yaml", "agent", {"interval_s": 10}))}
    old = config["agent"]

    def reload() -> None:  # parse first, swap only on success: what the daemons' callbacks do
        config["agent"] = parse_agent_section(Node("x.yaml", "agent", {"interval_s": "soon"}))

    ticks: list[float] = []
    with caplog.at_level(logging.ERROR):
        assert make_loop(lambda: ticks.append(fake.now), fake, reload=reload).run() == 0
    assert config["agent"] is old
    assert "keeping the old one" in caplog.text and "expected a number" in caplog.text
    assert len(ticks) >= 2  # still ticking after the rejected reload


def test_failing_ticks_back_off_exponentially_then_resume_the_interval() -> None:
    fake = FakeTime()
    outcomes: list[TickOutcome] = []
    calls = 0
    loop: DaemonLoop

    def tick() -> None:
        nonlocal calls
        calls += 1
        if calls <= 4:
            raise OSError("database locked")
        if calls == 6:
            loop.stop()

    loop = make_loop(tick, fake, backoff=Backoff(initial_s=1.0, multiplier=2.0, max_s=4.0), on_tick=outcomes.append)
    assert loop.run() == 0
    # rand() == 0: half of min(cap, 1 * 2**(n-1)) -> 0.5, 1, 2, 2 (capped), then the interval.
    assert fake.waits[:5] == [0.5, 1.0, 2.0, 2.0, 10.0]
    assert [o.ok for o in outcomes] == [False, False, False, False, True, True]
    assert [o.consecutive_failures for o in outcomes] == [1, 2, 3, 4, 0, 0]


def test_backoff_jitter_stays_between_half_and_full_delay_and_is_capped() -> None:
    backoff = Backoff(initial_s=1.0, multiplier=2.0, max_s=30.0)
    for failures in range(1, 200):
        ceiling = min(30.0, 2.0 ** (failures - 1))
        for rand in (0.0, 0.37, 0.999):
            delay = backoff.delay_s(failures, rand)
            assert ceiling / 2 <= delay <= ceiling


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        DaemonLoop(lambda: None, 0)


CHILD = textwrap.dedent("""
    import sys, time
    from slurm_aigc.daemonloop import DaemonLoop

    def say(text):
        print(text, flush=True)

    def tick():
        say("tick-start")
        time.sleep(0.3)  # work in progress when SIGTERM arrives
        say("tick-end")

    sys.exit(DaemonLoop(tick, 0.2, reload=lambda: say("reloaded")).run())
""")


def read_until(proc: subprocess.Popen[str], wanted: str, timeout_s: float = 20.0) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline().strip()
        lines.append(line)
        if line == wanted:
            return lines
    raise AssertionError(f"no {wanted!r} within {timeout_s} s; got {lines}")


def test_real_signals_reload_then_finish_the_tick_and_exit_zero() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env)
    try:
        read_until(proc, "tick-end")
        proc.send_signal(signal.SIGHUP)
        read_until(proc, "reloaded")
        read_until(proc, "tick-start")
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert rest.split()[0] == "tick-end"  # the interrupted tick ran to its end
        assert "tick-start" not in rest  # and no new one began
    finally:
        if proc.poll() is None:
            proc.kill()
