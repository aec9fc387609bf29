"""The shared daemon loop of `slurm-aigc agent` and `slurm-aigc controller`.

Modelled on gunicorn's arbiter: signal handlers only enqueue the signal number; the loop
runs one tick, then waits on that queue with the poll interval as timeout. So:

* SIGTERM/SIGINT arriving during a tick let the tick finish, then the loop returns 0; a tick
  that can be long reads `stop_requested` between its steps (the controller takes no further
  action of its batch);
* SIGHUP calls `reload`; a reload that raises keeps the old config (the callback swaps
  its config only after the new one parsed) and the reason is logged;
* an exception in a tick is logged and the tick is retried after an exponential backoff
  with jitter, capped; the daemon never exits because of it;
* `run(once=True)` runs one tick and returns 0 (1 when that tick failed), for admins.

Clock, waiting and signal installation are constructor arguments so unit tests run with
no real time and no real signals.
"""

from __future__ import annotations

import logging
import queue
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

LOG = logging.getLogger(__name__)

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
RELOAD_SIGNALS = frozenset({signal.SIGHUP})
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# Takes the loop's signal queue and a timeout; returns the next signal number, or None
# when the timeout passed without one.
Waiter = Callable[["queue.SimpleQueue[int]", float], "int | None"]
# Installs `enqueue` as the handler of HANDLED_SIGNALS and returns a function restoring the old ones.
SignalInstaller = Callable[[Callable[[int], None]], Callable[[], None]]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with "equal jitter" (half fixed, half random), capped.

    Failure n (1-based) waits between d/2 and d where d = min(max_s, initial_s * multiplier**(n-1)).
    """

    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 300.0

    def delay_s(self, failures: int, rand: float) -> float:
        """The wait after `failures` consecutive failed ticks; `rand` is uniform in [0, 1)."""
        exponent = min(max(failures - 1, 0), 64)  # 2**64 already exceeds every sane cap
        ceiling = min(self.max_s, self.initial_s * self.multiplier**exponent)
        return ceiling / 2 + rand * ceiling / 2


@dataclass(frozen=True)
class TickOutcome:
    """What one tick did, handed to the `on_tick` observer (metrics)."""

    duration_s: float
    ok: bool
    consecutive_failures: int


def install_signal_handlers(enqueue: Callable[[int], None]) -> Callable[[], None]:
    """Make SIGTERM/SIGINT/SIGHUP only enqueue their number; return a restorer."""
    if threading.current_thread() is not threading.main_thread():
        LOG.warning("not in the main thread: signals are not handled by this loop")
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, lambda signum, _frame: enqueue(signum))

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def wait_on_queue(signals: queue.SimpleQueue[int], timeout_s: float) -> int | None:
    """Block until a signal is enqueued or `timeout_s` passes (a signal interrupts the wait)."""
    try:
        return signals.get(timeout=timeout_s)
    except queue.Empty:
        return None


class DaemonLoop:
    """Run `tick` every `interval_s` until SIGTERM/SIGINT; see the module docstring."""

    def __init__(
        self,
        tick: Callable[[], None],
        interval_s: float,
        reload: Callable[[], None] | None = None,
        *,
        name: str = "slurm-aigc",
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.monotonic,
        wait: Waiter | None = None,
        install_signals: SignalInstaller = install_signal_handlers,
        rand: Callable[[], float] = random.random,
        on_tick: Callable[[TickOutcome], None] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._tick = tick
        self.interval_s = interval_s
        self._reload = reload
        self._name = name
        self._backoff = backoff
        self._clock = clock
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._wait: Waiter = wait or wait_on_queue
        self._install_signals = install_signals
        self._rand = rand
        self._on_tick = on_tick
        self.failures = 0
        self.ticks = 0
        self._stop_requested = False

    def enqueue(self, signum: int) -> None:
        """What a signal handler does, and all it does (a flag and a queue put are signal-safe)."""
        if signum in STOP_SIGNALS:
            self._stop_requested = True
        self._signals.put(signum)

    @property
    def stop_requested(self) -> bool:
        """A stop signal came: a tick may end early between its steps (the controller's actions)."""
        return self._stop_requested

    def stop(self) -> None:
        """Ask the loop to finish its current tick and return (as SIGTERM would)."""
        self.enqueue(signal.SIGTERM)

    def run(self, once: bool = False) -> int:
        """Loop until a stop signal; return the process exit status."""
        restore = self._install_signals(self.enqueue)
        try:
            return self._run(once)
        finally:
            restore()

    def _run(self, once: bool) -> int:
        LOG.info("%s: started (interval %.1f s%s)", self._name, self.interval_s, ", once" if once else "")
        while True:
            ok = self._tick_safely()
            if once:
                return 0 if ok else 1
            delay_s = self.interval_s if ok else self._backoff.delay_s(self.failures, self._rand())
            if not ok:
                LOG.warning("%s: tick failed %d time(s) in a row; retrying in %.1f s", self._name, self.failures, delay_s)
            if self._wait_for_signals(delay_s):
                LOG.info("%s: stopping after %d tick(s)", self._name, self.ticks)
                return 0

    def _tick_safely(self) -> bool:
        started = self._clock()
        try:
            self._tick()
            ok = True
            self.failures = 0
        except Exception:  # a daemon logs every tick error and carries on
            self.failures += 1
            ok = False
            LOG.exception("%s: tick failed", self._name)
        self.ticks += 1
        if self._on_tick is not None:
            self._on_tick(TickOutcome(self._clock() - started, ok, self.failures))
        return ok

    def _wait_for_signals(self, delay_s: float) -> bool:
        """Wait `delay_s`, serving SIGHUPs meanwhile; True when a stop signal came."""
        deadline = self._clock() + delay_s
        while (remaining := deadline - self._clock()) > 0:
            signum = self._wait(self._signals, remaining)
            if signum is None:
                return False
            if signum in STOP_SIGNALS:
                LOG.info("%s: got %s", self._name, signal.Signals(signum).name)
                return True
            if signum in RELOAD_SIGNALS:
                self._reload_safely()
        return False

    def _reload_safely(self) -> None:
        if self._reload is None:
            LOG.info("%s: SIGHUP: nothing to reload", self._name)
            return
        try:
            self._reload()
        except Exception as error:  # noqa: BLE001 - an invalid new config must not end the daemon
            LOG.error("%s: SIGHUP: new config rejected, keeping the old one: %s", self._name, error)
        else:
            LOG.info("%s: SIGHUP: config reloaded", self._name)
