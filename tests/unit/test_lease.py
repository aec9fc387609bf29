"""Leases: one controller process runs each part, on every database (slurm_aigc/lease.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from slurm_aigc.cli import reclaim as cli
from slurm_aigc.db import Lease, open_database, transaction
from slurm_aigc.errors import DatabaseError
from slurm_aigc.lease import LEARNER, PUBLISHER, RECLAIM, Leases, only_while_held
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.controller import Controller
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.slurm import CommandResult, Runner, SlurmCli
from slurm_aigc.telemetry.learnpublish import with_learner
from tests.fakes.slurm import FakeJob, FakeSlurm
from tests.unit.test_reclaim_controller import CONFIG, START, Clock, add_samples

LEASE_S = 60.0


def pair(url: str, now: Clock | None = None) -> tuple[Leases, Leases]:
    factory = open_database(url)
    return (Leases(factory, LEASE_S, name="ctl-a", clock=now), Leases(factory, LEASE_S, name="ctl-b", clock=now))


def test_one_process_holds_a_part_the_other_stands_by_until_it_is_released(db_url: str) -> None:
    """On the database's own clock (SQLite, MariaDB, PostgreSQL)."""
    a, b = pair(db_url)
    assert a.hold(RECLAIM) and a.hold(RECLAIM)  # taken, then renewed
    assert not b.hold(RECLAIM)
    assert "held by ctl-a" in b.why_not(RECLAIM)
    holder = a.holder(RECLAIM)
    assert holder is not None and holder.name == "ctl-a" and 0 < holder.expires_in_s <= LEASE_S
    a.release()
    assert b.hold(RECLAIM) and not a.hold(RECLAIM)


def race(url: str, processes: int = 8) -> list[bool]:
    """`processes` controllers, each with its own engine, take the free reclaim part at once."""
    contenders = [Leases(open_database(url), LEASE_S, name=f"ctl-{n}") for n in range(processes)]
    start = threading.Barrier(processes)
    results: dict[int, bool] = {}

    def take(n: int) -> None:
        start.wait()
        results[n] = contenders[n].hold(RECLAIM)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(processes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return [results[n] for n in range(processes)]


def test_of_many_controllers_taking_a_free_part_at_once_exactly_one_gets_it(db_url: str) -> None:
    open_database(db_url)  # the schema first, as the unit's first start makes it
    assert sum(race(db_url)) == 1


def test_a_lease_not_renewed_for_its_length_passes_to_the_next_taker(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    now = Clock(1000.0)
    a, b = pair(f"sqlite:///{tmp_path / 'state.db'}", now)
    assert a.hold(RECLAIM)
    now.now += LEASE_S - 1
    assert not b.hold(RECLAIM)  # a has not renewed, but its lease still runs
    now.now += 2
    caplog.set_level(logging.WARNING)
    assert b.hold(RECLAIM)  # a died, or lost the database
    assert not a.hold(RECLAIM)
    assert "ctl-a: lost the reclaim lease to ctl-b" in caplog.text


def test_parts_are_leased_apart(tmp_path: Path) -> None:
    """A site may run reclaim (an Operator) and the publisher (an Administrator) in two processes."""
    a, b = pair(f"sqlite:///{tmp_path / 'state.db'}", Clock(1000.0))
    assert a.hold(RECLAIM) and b.hold(PUBLISHER)
    assert not b.hold(RECLAIM) and not a.hold(PUBLISHER)
    assert a.hold(LEARNER) and not b.hold(LEARNER)


def test_a_dry_run_controller_never_keeps_a_live_one_standing_by(tmp_path: Path) -> None:
    """An admin tries a policy with a dry-run daemon beside the live one: both run; two dry-run
    daemons take turns; a reload that goes live gives the dry-run lease back."""
    factory = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    now = Clock(1000.0)
    trial = Leases(factory, LEASE_S, name="trial", dry_run=True, clock=now)
    live = Leases(factory, LEASE_S, name="live", clock=now)
    other_trial = Leases(factory, LEASE_S, name="other-trial", dry_run=True, clock=now)
    assert trial.hold(RECLAIM) and live.hold(RECLAIM)
    assert not other_trial.hold(RECLAIM) and "dry-run reclaim lease is held by trial" in other_trial.why_not(RECLAIM)
    trial.set_dry_run(False)  # SIGHUP after reclaim.dry_run: false
    assert other_trial.hold(RECLAIM)
    assert not trial.hold(RECLAIM) and "the reclaim lease is held by live" in trial.why_not(RECLAIM)


def test_a_reload_switches_the_leases_mode_even_when_the_database_cannot_take_them_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A dry-run daemon goes live by SIGHUP while the database is briefly out of reach: it must
    not go on renewing its dry-run row and act live beside the live holder."""
    factory = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    now = Clock(1000.0)
    trial, live = Leases(factory, LEASE_S, name="trial", dry_run=True, clock=now), Leases(factory, LEASE_S, name="live", clock=now)
    assert trial.hold(RECLAIM) and live.hold(RECLAIM)

    def unreachable() -> None:
        raise DatabaseError("database error: (2013, 'Lost connection to MySQL server during query')")

    monkeypatch.setattr(trial, "release", unreachable)
    with caplog.at_level(logging.WARNING, logger="slurm_aigc.lease"):
        trial.set_dry_run(False)
    assert "could not give back the dry-run reclaim lease(s), which run out in 60 s" in caplog.text
    assert not trial.still_held(RECLAIM)
    assert not trial.hold(RECLAIM) and "the reclaim lease is held by live" in trial.why_not(RECLAIM)


def test_a_reload_takes_the_new_modes_leases_before_the_controller_changes_mode(tmp_path: Path) -> None:
    """`_reload`: were the controller switched first, a failure between the two steps would leave
    a live controller on its dry-run lease."""
    order: list[str] = []

    class Ctl:
        dry_run = True

        def set_config(self, config: ReclaimConfig, dry_run: bool) -> None:
            order.append(f"controller dry_run={dry_run}")

    class Recorder:
        def set_dry_run(self, dry_run: bool) -> None:
            order.append(f"leases dry_run={dry_run}")

    policy = tmp_path / "p.yaml"
    policy.write_text("reclaim:\n  dry_run: false\n")
    cli._reload(Ctl(), None, str(policy), None, Recorder())  # type: ignore[arg-type]
    assert order == ["leases dry_run=False", "controller dry_run=False"]


def test_still_held_renews_after_half_the_lease_and_gives_up_before_its_end(tmp_path: Path) -> None:
    now, mono = Clock(1000.0), Clock(0.0)
    factory = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    a = Leases(factory, LEASE_S, name="ctl-a", clock=now, monotonic=mono)
    b = Leases(factory, LEASE_S, name="ctl-b", clock=now)
    assert not a.still_held(RECLAIM)  # never held
    assert a.hold(RECLAIM)

    def expiry() -> float:
        with transaction(factory) as session:
            return float(session.scalar(select(Lease.expires_at).where(Lease.part == RECLAIM)))

    now.now, mono.now = 1020.0, 20.0
    assert a.still_held(RECLAIM) and expiry() == 1060.0  # under half: no round trip
    now.now, mono.now = 1040.0, 40.0
    assert a.still_held(RECLAIM) and expiry() == 1100.0  # renewed
    # A tick stuck 50 s (a slow action): 90 s since the renewal was asked is past the local deadline
    # (80 % of the lease), though the database would still renew it; acting stops before b may take over.
    now.now, mono.now = 1090.0, 90.0
    assert not a.still_held(RECLAIM)
    now.now = 1101.0
    assert b.hold(RECLAIM)


def test_a_renewal_that_finds_the_lease_taken_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The database's clock ran past the lease while a's own clock had not (a stalled host): the
    renewal inside the tick finds b holding it. One event, one warning."""
    now, mono = Clock(1000.0), Clock(0.0)
    factory = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    a = Leases(factory, LEASE_S, name="ctl-a", clock=now, monotonic=mono)
    b = Leases(factory, LEASE_S, name="ctl-b", clock=now)
    assert a.hold(RECLAIM)
    now.now = 1061.0
    assert b.hold(RECLAIM)
    mono.now = 40.0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="slurm_aigc.lease"):
        assert not a.still_held(RECLAIM)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ctl-a")]
    assert said == ["ctl-a: lost the reclaim lease to ctl-b: standing by"]


def test_a_lease_renewed_after_its_local_deadline_is_not_announced_as_taken(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A slow tick passed the local deadline, but no one took the row: the next tick renews it.
    "took the lease" would tell an admin reading the logs that the controllers changed hands."""
    now, mono = Clock(1000.0), Clock(0.0)
    a = Leases(open_database(f"sqlite:///{tmp_path / 'state.db'}"), LEASE_S, name="ctl-a", clock=now, monotonic=mono)
    assert a.hold(RECLAIM)
    now.now, mono.now = 1050.0, 50.0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="slurm_aigc.lease"):
        assert not a.still_held(RECLAIM)  # 50 s of 60 is past the local deadline
        assert a.hold(RECLAIM)  # the next tick: the row is still a's
    said = [r.getMessage() for r in caplog.records]
    assert said == ["ctl-a: the reclaim lease ran out during the tick: the rest waits for the next",
                    "ctl-a: renewed the reclaim lease after its local deadline: running it again"]
    assert a.still_held(RECLAIM)


def test_a_renewal_the_database_refuses_leaves_the_lease_held_to_its_local_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The deadline was set before the last renewal was asked, so it holds whatever a later renewal
    does: a database blip mid-tick must not abort the batch (or a shrink's wait) early, nor be
    retried on every check (an unreachable server is slow to answer)."""
    now, mono = Clock(1000.0), Clock(0.0)
    a = Leases(open_database(f"sqlite:///{tmp_path / 'state.db'}"), LEASE_S, name="ctl-a", clock=now, monotonic=mono)
    assert a.hold(RECLAIM)
    tries: list[str] = []

    def unreachable(part: str) -> None:
        tries.append(part)
        raise DatabaseError("database error: (2013, 'Lost connection to MySQL server during query')")

    monkeypatch.setattr(a, "_attempt", unreachable)
    with caplog.at_level(logging.WARNING, logger="slurm_aigc.lease"):
        mono.now = 31.0
        assert a.still_held(RECLAIM)
        mono.now = 47.0
        assert a.still_held(RECLAIM)
        assert tries == [RECLAIM]
        assert "ctl-a: could not renew the reclaim lease, acting on until 48 s after its last renewal" in caplog.text
        mono.now = 48.0
        assert not a.still_held(RECLAIM)
    monkeypatch.undo()
    now.now, mono.now = 1050.0, 50.0
    assert a.hold(RECLAIM)  # back: renewed, and a later failure is tried once again
    monkeypatch.setattr(a, "_attempt", unreachable)
    mono.now = 80.0
    assert a.still_held(RECLAIM) and tries == [RECLAIM, RECLAIM]


def test_a_renewal_that_fails_slowly_past_the_deadline_lets_the_lease_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A server that stops answering fails a query only at the read timeout (60 s), longer than the
    lease: by then a standby may hold it, so the deadline is judged again after the failure."""
    now, mono = Clock(1000.0), Clock(0.0)
    a = Leases(open_database(f"sqlite:///{tmp_path / 'state.db'}"), LEASE_S, name="ctl-a", clock=now, monotonic=mono)
    assert a.hold(RECLAIM)

    def hangs_then_fails(part: str) -> None:
        mono.now += 60.0
        raise DatabaseError("database error: (2013, 'Lost connection to MySQL server during query')")

    monkeypatch.setattr(a, "_attempt", hangs_then_fails)
    mono.now = 31.0
    with caplog.at_level(logging.WARNING, logger="slurm_aigc.lease"):
        assert not a.still_held(RECLAIM)  # asked at 31 s, failed at 91 s: past 48 s
    assert "the reclaim lease ran out during the tick" in caplog.text
    assert not a.still_held(RECLAIM)


def test_the_part_a_process_does_not_hold_is_not_run(tmp_path: Path) -> None:
    a, b = pair(f"sqlite:///{tmp_path / 'state.db'}", Clock(1000.0))
    ran: list[str] = []
    assert a.hold(PUBLISHER) and a.hold(LEARNER)
    publish = only_while_held(b, PUBLISHER, lambda _jobs, _nodes: ran.append("publisher"))
    with_learner(publish, only_while_held(b, LEARNER, lambda: ran.append("learner")))(None, None)
    assert ran == []
    a.release()
    with_learner(publish, only_while_held(b, LEARNER, lambda: ran.append("learner")))(None, None)
    assert ran == ["publisher", "learner"]
    assert only_while_held(None, RECLAIM, lambda: "ran")() == "ran"


def controller(url: str, runner: Runner, leases: Leases) -> tuple[Controller, Clock]:
    clock = Clock(START + 200.0)
    store = ReclaimStore(open_database(url))
    return Controller(SlurmCli(runner=runner), store, CONFIG, clock=clock, leases=leases), clock


def test_two_controllers_on_one_database_act_once_and_the_standby_takes_over(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = FakeSlurm(jobs={"7": FakeJob("7", gpus=1)})
    add_samples(url, "7", 1, START + 200.0)
    a, b = pair(url)
    first, _ = controller(url, fake, a)
    second, clock = controller(url, fake, b)
    assert [(r.action, r.state) for r in first.tick().results] == [("notify", "done")]
    listings = len(fake.calls)
    standby = second.tick()
    assert standby.standby.startswith("the reclaim lease is held by ctl-a") and standby.results == ()
    assert len(fake.calls) == listings  # a standby asks slurmctld nothing
    a.release()  # the first stops (SIGTERM)
    clock.now += CONFIG.cooldown_s
    add_samples(url, "7", 1, START + 200.0 + CONFIG.cooldown_s)
    assert [(r.action, r.state) for r in second.tick().results] == [("requeue", "done")]
    assert fake.jobs["7"].restarts == 1


def test_a_batch_stops_acting_once_the_lease_ran_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = FakeSlurm(jobs={str(i): FakeJob(str(i), gpus=1) for i in (7, 8, 9)})
    for job in fake.jobs:
        add_samples(url, job, 1, START + 200.0)
    mono = Clock(0.0)
    leases = Leases(open_database(url), LEASE_S, name="ctl-a", clock=Clock(1000.0), monotonic=mono)

    def slow(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        if "update" in argv:  # a notify that takes 50 s (a slow notify command, slurmctld busy)
            mono.now += 50.0
        return fake(argv, timeout_s, stdin)

    ctl, _ = controller(url, slow, leases)
    results = ctl.tick().results
    # 0 s: acts; 50 s: past 80 % of the lease since it was asked, renewing may be too late: stops.
    assert [r.state for r in results] == ["done"]
    assert "the reclaim lease ran out during the tick" in caplog.text


def test_a_live_one_off_run_refuses_while_another_controller_holds_reclaim(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    now = datetime.now().timestamp()
    add_samples(url, "7", 1, now, start=now - 200.0)
    policy = tmp_path / "policy.yaml"
    policy.write_text("reclaim:\n  poll_interval_s: 10\n  defaults: {grace_s: 10, window_s: 60, min_samples: 3}\n")
    monkeypatch.setattr(cli, "SlurmCli", lambda: SlurmCli(runner=fake))
    daemon = Leases(open_database(url), LEASE_S, name="daemon-on-host-1")
    assert daemon.hold(RECLAIM)
    runner = CliRunner()
    argv = ["--config", str(policy), "--db", url, "--once", "--no-publisher"]
    refused = runner.invoke(cli.controller, [*argv, "--no-dry-run"])
    assert refused.exit_code == 1
    assert "not run: the reclaim lease is held by daemon-on-host-1" in refused.output
    assert fake.mutations() == []
    dry = runner.invoke(cli.controller, argv + ["--dry-run"])  # changes nothing: takes no lease
    assert dry.exit_code == 0 and "dry-run: would notify job 7" in dry.output
    daemon.release()
    live = runner.invoke(cli.controller, [*argv, "--no-dry-run"])
    assert live.exit_code == 0, live.output
    assert [m[1] for m in fake.mutations()][:1] == ["update"]
    taken = Leases(open_database(url), LEASE_S, name="next")
    assert taken.hold(RECLAIM)  # the one-off run gave the lease back when it ended


def test_a_lease_not_given_back_at_exit_leaves_the_runs_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = FakeSlurm(jobs={})
    monkeypatch.setattr(cli, "SlurmCli", lambda: SlurmCli(runner=fake))

    def unreachable(self: Leases) -> None:
        raise DatabaseError("database error: (2013, 'Lost connection to MySQL server during query')")

    monkeypatch.setattr(Leases, "release", unreachable)
    policy = tmp_path / "policy.yaml"
    policy.write_text("reclaim:\n  poll_interval_s: 10\n")
    result = CliRunner().invoke(cli.controller, ["--config", str(policy), "--db", url, "--once", "--no-publisher",
                                                 "--no-dry-run"])
    assert result.exit_code == 0, (result.output, result.exception)  # the tick ran: 0, not the release's error
    assert "0 running GPU job(s)" in result.output or "no GPU jobs" in result.output


def test_retention_runs_only_while_this_process_holds_reclaim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked after the tick: a tick that ran out of its lease midway (a slow slurmctld) leaves
    retention to the process that holds it by then (here another controller took it)."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setattr(cli, "SlurmCli", lambda: SlurmCli(runner=FakeSlurm(jobs={})))
    ran: list[str] = []
    monkeypatch.setattr(cli, "_retention", lambda config_file, db_url: lambda: ran.append("retention"))
    other = Leases(open_database(url), LEASE_S, name="other-host")
    original_tick = Controller.tick

    def tick(self: Controller) -> Any:
        report = original_tick(self)
        ran.append("tick")
        if len(ran) > 2:  # the second tick outlasted its lease, and the other host took it
            assert self._leases is not None
            self._leases._renewed_at = {key: asked - 3600.0 for key, asked in self._leases._renewed_at.items()}
            with transaction(open_database(url)) as session:
                session.execute(update(Lease).values(expires_at=0.0))
            assert other.hold(RECLAIM)
        return report

    class TwoTicks:
        def __init__(self, tick: Any, *_args: Any, **_kwargs: Any) -> None:
            self.tick, self.stop_requested = tick, False

        def run(self, once: bool) -> int:
            self.tick()
            self.tick()
            return 0

    monkeypatch.setattr(Controller, "tick", tick)
    monkeypatch.setattr("slurm_aigc.daemonloop.DaemonLoop", TwoTicks)
    policy = tmp_path / "policy.yaml"
    policy.write_text("reclaim:\n  poll_interval_s: 10\n")
    result = CliRunner().invoke(cli.controller, ["--config", str(policy), "--db", url, "--no-publisher", "--no-dry-run"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert ran == ["tick", "retention", "tick"]


def test_the_lease_lasts_at_least_three_ticks(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("reclaim:\n  lease_intervals: 2\n")
    with pytest.raises(Exception, match="reclaim.lease_intervals"):
        load_policy(policy, hook_sections=False)
    assert ReclaimConfig().lease_s() == 60.0 and ReclaimConfig().lease_s(2.0) == 12.0
