"""The controller tick against a fake Slurm and a real (temporary) SQLite database."""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select, text

from slurm_aigc.cli import reclaim as cli
from slurm_aigc.db import JobGpuSample, open_database, transaction
from slurm_aigc.errors import DatabaseError, SlurmCommandError
from slurm_aigc.reclaim.actuator import Actuator
from slurm_aigc.reclaim.config import ClassPolicy, ReclaimConfig
from slurm_aigc.reclaim.controller import (
    Controller,
    DerivedFacts,
    StaleSamplesError,
    batch_from_rows,
    id_gaps,
    windows_from_rows,
)
from slurm_aigc.reclaim.detect import JobMeta, batch_from_jobs
from slurm_aigc.reclaim.jobs import job_facts
from slurm_aigc.reclaim.ladder import PlannedAction
from slurm_aigc.reclaim.store import ReclaimStore, SampleRow
from slurm_aigc.slurm import CommandResult, NodeInfo, SlurmCli
from tests.fakes.slurm import FakeJob, FakeNode, FakeSlurm

START = datetime.fromisoformat("2026-01-01T00:00:00").timestamp()
POLICY = ClassPolicy(grace_s=10.0, window_s=60.0, min_samples=3)
CONFIG = ReclaimConfig(dry_run=False, poll_interval_s=10.0, cooldown_s=30.0, defaults=POLICY)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


def add_samples(url: str, job_id: str, gpus: int, until: float, util: float = 0.0, memory: float = 0.0,
                busy_gpus: int = 0, node: str = "a100-01", start: float = START) -> None:
    """Samples every 10 s from `start` to `until` (GPUs below `busy_gpus` at 97 %)."""
    with transaction(open_database(url)) as session:
        ts = start
        while ts <= until:
            for gpu in range(gpus):
                busy = gpu < busy_gpus
                session.add(JobGpuSample(ts=ts, node=node, job_id=job_id, gpu_index=gpu,
                                         sm_util_pct=97.0 if busy else util, memory_used_mib=memory,
                                         memory_total_mib=81920.0, power_draw_w=350.0 if busy else 60.0,
                                         power_limit_w=400.0, shared=False))
            ts += 10.0


def make(url: str, fake: FakeSlurm, now: float, config: ReclaimConfig = CONFIG, **kw: object) -> tuple[Controller, Clock]:
    clock = Clock(now)
    store = ReclaimStore(open_database(url))
    return Controller(SlurmCli(runner=fake), store, config, clock=clock, **kw), clock  # type: ignore[arg-type]


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5"])  # squeue --json / scontrol --json show job
def test_idle_job_notified_then_requeued_once(db_url: str, version: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7", gpus=1)}, version=version)
    add_samples(db_url, "7", 1, START + 200.0)
    controller, clock = make(db_url, fake, START + 200.0)
    first = controller.tick()
    assert [(r.action, r.state) for r in first.results] == [("notify", "done")]
    assert "aigc-reclaim: job 7 idle" in fake.jobs["7"].admin_comment
    clock.now += 10.0
    add_samples(db_url, "7", 1, START + 210.0)
    assert controller.tick().results == ()  # cool-down
    clock.now += 30.0
    add_samples(db_url, "7", 1, START + 240.0)
    second = controller.tick()
    assert [(r.action, r.state) for r in second.results] == [("requeue", "done")]
    assert fake.jobs["7"].restarts == 1
    assert [r.observation_key for r in ReclaimStore(open_database(db_url)).audit()] == ["7/r0/idle/0:notify", "7/r0/idle/1:requeue"]


def test_busy_and_exempt_and_no_requeue_jobs(db_url: str) -> None:
    fake = FakeSlurm(jobs={
        "1": FakeJob("1"),
        "2": FakeJob("2", admin_comment="aigc_class=interactive"),
        "3": FakeJob("3", requeue=False),
    })
    add_samples(db_url, "1", 1, START + 200.0, busy_gpus=1)
    add_samples(db_url, "2", 1, START + 200.0)
    add_samples(db_url, "3", 1, START + 200.0)
    controller, clock = make(db_url, fake, START + 200.0)
    report = controller.tick()
    assert [(r.job_id, r.action) for r in report.results] == [("3", "notify")]
    views = {v.job.job_id: v for v in report.assessment.views}
    assert views["1"].verdict.reason == "in use"
    assert views["2"].verdict.kind == "idle" and "exempt: class interactive" in views["2"].plan.reason  # type: ignore[union-attr]
    clock.now += 100.0
    add_samples(db_url, "3", 1, START + 300.0)
    add_samples(db_url, "2", 1, START + 300.0)
    assert controller.tick().results == ()
    assert not any(c[1] in {"requeue", "requeuehold"} for c in fake.mutations())


def test_over_allocated_job_is_shrunk(db_url: str) -> None:
    fake = FakeSlurm(jobs={"5": FakeJob("5", gpus=4)})
    add_samples(db_url, "5", 4, START + 200.0, busy_gpus=1)
    controller, clock = make(db_url, fake, START + 200.0)
    assert [r.action for r in controller.tick().results] == ["notify"]
    clock.now += 40.0
    add_samples(db_url, "5", 4, START + 240.0, busy_gpus=1)
    [shrink] = controller.tick().results
    assert (shrink.action, shrink.state) == ("shrink", "done")
    assert fake.jobs["5"].gpus == 1


def test_a_requeued_job_starts_a_new_run_with_a_new_grace(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    add_samples(db_url, "7", 1, START + 200.0)
    controller, clock = make(db_url, fake, START + 200.0)
    assert controller.tick().results[0].action == "notify"
    # Requeued by someone else; it runs again from START + 300 s on the same GPU.
    fake.jobs["7"].restarts, fake.jobs["7"].start = 1, "2026-01-01T00:05:00"
    add_samples(db_url, "7", 1, START + 305.0, start=START + 300.0)
    clock.now = START + 305.0
    report = controller.tick()
    [view] = report.assessment.views
    assert report.results == ()
    assert "grace" in view.verdict.reason  # the old run's idle stretch does not carry over
    add_samples(db_url, "7", 1, START + 380.0, start=START + 310.0)
    clock.now = START + 380.0
    [result] = controller.tick().results
    assert (result.observation_key, result.state) == ("7/r1/idle/0:notify", "done")


def test_stale_samples_mean_no_action(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    add_samples(db_url, "7", 1, START + 200.0)
    controller, _ = make(db_url, fake, START + 200.0 + CONFIG.stale_s + 1.0)
    with pytest.raises(StaleSamplesError):
        controller.tick()
    assert fake.mutations() == []


def test_slurmctld_down_fails_the_tick_but_publisher_still_runs(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")}, down=True)
    published: list[bool] = []
    controller, _ = make(db_url, fake, START + 200.0, publisher_tick=lambda jobs, _nodes: published.append(jobs is None))
    with pytest.raises(SlurmCommandError):
        controller.tick()
    assert published == [True]  # no listing to hand on: the publisher lists the jobs itself


def test_database_down_means_no_action(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    add_samples(db_url, "7", 1, START + 200.0)
    controller, _ = make(db_url, fake, START + 200.0)
    factory = open_database(db_url)
    with factory() as session:
        session.execute(text("DROP TABLE actions"))
        session.commit()
    with pytest.raises(DatabaseError):
        controller.tick()
    assert fake.mutations() == []


def test_dry_run_override_changes_nothing(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    add_samples(db_url, "7", 1, START + 200.0)
    controller, _ = make(db_url, fake, START + 200.0, dry_run=True)
    [result] = controller.tick().results
    assert (result.action, result.state, result.dry_run) == ("notify", "skipped", True)
    assert fake.mutations() == []


def test_a_reload_switches_dry_run_as_the_policy_now_says_unless_the_command_line_set_it(
        db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    now = datetime.now().timestamp()
    add_samples(db_url, "7", 1, now, start=now - 200.0)
    monkeypatch.setattr(cli, "SlurmCli", lambda: SlurmCli(runner=fake))
    policy = tmp_path / "policy.yaml"
    body = "reclaim:\n  dry_run: {}\n  poll_interval_s: 10\n  defaults: {{grace_s: 10, window_s: 60, min_samples: 3}}\n"
    policy.write_text(body.format("true"))
    ctl, hooks, _leases = cli._controller(str(policy), db_url, None, True)
    assert [(r.action, r.state) for r in ctl.tick().results] == [("notify", "skipped")]
    assert hooks is not None and ctl.dry_run and ctl.tick().results == ()
    policy.write_text(body.format("false"))  # the admin goes live, then `systemctl reload`
    cli._reload(ctl, hooks, str(policy), None)
    assert not ctl.dry_run and not hooks.tick.__self__._dry_run  # type: ignore[attr-defined]
    assert [(r.action, r.state) for r in ctl.tick().results] == [("notify", "done")]
    assert "aigc-reclaim: job 7 idle" in fake.jobs["7"].admin_comment
    policy.write_text(body.format("true"))  # and back: nothing more is changed in Slurm
    cli._reload(ctl, hooks, str(policy), None)
    before = fake.mutations()
    assert ctl.dry_run and ctl.tick().results == () and fake.mutations() == before
    policy.write_text(body.format("false"))
    cli._reload(ctl, hooks, str(policy), True)  # started with --dry-run: that still wins
    assert ctl.dry_run and hooks.tick.__self__._dry_run  # type: ignore[attr-defined]


def test_reconcile_runs_before_the_first_action(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    add_samples(db_url, "7", 1, START + 200.0)
    controller, _ = make(db_url, fake, START + 200.0)
    store = ReclaimStore(open_database(db_url))
    from slurm_aigc.reclaim.ladder import PlannedAction
    store.record_intent(PlannedAction("7/r0/idle/0:notify", "7", "u", "a", "train", "idle", "notify", 0, False, 0, 1, 1,
                                      None, "m"), {"restarts_before": 0}, START + 100.0)
    report = controller.tick()
    assert [(r.action, r.state) for r in report.reconciled] == [("notify", "failed")]
    assert report.results == ()  # next step (requeue) waits for the cool-down after the reconciled notify


def test_cli_idle_list_and_audit(db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7"), "8": FakeJob("8")})
    now = datetime.now().timestamp()
    policy = tmp_path / "policy.yaml"
    policy.write_text("reclaim:\n  poll_interval_s: 10\n  defaults: {grace_s: 10, window_s: 60, min_samples: 3}\n")
    add_samples(db_url, "7", 1, now, start=now - 200.0)
    add_samples(db_url, "8", 1, now, busy_gpus=1, start=now - 200.0)
    monkeypatch.setattr(cli, "SlurmCli", lambda: SlurmCli(runner=fake))
    monkeypatch.setenv("SLURM_AIGC_CONFIG", str(policy))
    runner = CliRunner()
    listed = runner.invoke(cli.idle, ["list", "--db", db_url, "--json"])
    assert listed.exit_code == 0, listed.output
    [entry] = json.loads(listed.output)
    assert (entry["job_id"], entry["verdict"], entry["next"]["action"]) == ("7", "idle", "notify")
    assert entry["evidence"][0]["max_util_pct"] == 0.0
    explained = runner.invoke(cli.idle, ["explain", "8", "--db", db_url])
    assert "verdict: none — in use" in explained.output
    table = runner.invoke(cli.idle, ["list", "--db", db_url])
    assert "would notify now" in table.output  # the shipped default is dry-run
    ran = runner.invoke(cli.controller, ["--db", db_url, "--once", "--no-publisher"])
    assert ran.exit_code == 0, ran.output
    assert "dry-run: would notify job 7" in ran.output
    assert fake.mutations() == []
    audited = runner.invoke(cli.audit, ["--db", db_url, "--format", "json", "--job", "7", "--since", "1h"])
    [row] = json.loads(audited.output)
    assert (row["action"], row["state"], row["dry_run"]) == ("notify", "skipped", True)
    assert runner.invoke(cli.audit, ["--db", db_url, "--action", "requeue"]).output.strip() == "no actions recorded"
    running = SlurmCli(runner=fake).job("7")
    assert running is not None
    fake.jobs["7"].state = "COMPLETED"  # ends between the tick's read and the action
    Actuator(SlurmCli(runner=fake), ReclaimStore(open_database(db_url)), CONFIG).apply(
        PlannedAction("7/r0/idle/1:requeue", "7", "u", "a", "train", "idle", "requeue", 1, False, 0, 1, 0, None, "m"), running)
    trail = runner.invoke(cli.audit, ["--db", db_url, "--action", "requeue"]).output
    assert "skipped" in trail and "job is COMPLETED now, no longer RUNNING" in trail


def test_dry_run_leaves_a_half_done_shrink_alone(db_url: str) -> None:
    # A live controller died after `requeuehold`: the job is held. A dry-run start must not finish it.
    fake = FakeSlurm(jobs={"7": FakeJob("7", gpus=4, state="PENDING", reason="job_requeued_in_held_state",
                                        priority=0, restarts=1)})
    add_samples(db_url, "8", 1, START + 200.0)
    store = ReclaimStore(open_database(db_url))
    store.record_intent(PlannedAction("7/r0/over_allocated/1:shrink", "7", "u", "a", "train", "over_allocated", "shrink",
                                      1, False, 0, 4, 1, None, "m"), {"restarts_before": 0}, START + 100.0)
    controller, _ = make(db_url, fake, START + 200.0, dry_run=True)
    [report] = controller.tick().reconciled
    assert report.dry_run and "would finish the shrink" in report.detail["result"]
    assert fake.mutations() == []
    assert [r.state for r in store.audit()] == ["intent"]
    live, _ = make(db_url, fake, START + 200.0)
    [settled] = live.tick().reconciled
    assert settled.state == "done" and (fake.jobs["7"].gpus, fake.jobs["7"].priority) == (1, 100)


def test_a_tick_lists_the_jobs_once_and_hands_every_job_to_the_publisher(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7"), "8": FakeJob("8", state="PENDING"), "9": FakeJob("9")})
    add_samples(db_url, "7", 1, START + 200.0, busy_gpus=1)
    handed: list[list[str]] = []
    controller, clock = make(db_url, fake, START + 200.0, only_jobs=frozenset({"7"}),
                             publisher_tick=lambda jobs, _nodes: handed.append(sorted(j.job_id for j in jobs or [])))
    controller.tick()
    clock.now += 10.0
    controller.tick()
    assert handed == [["7", "8", "9"]] * 2  # the whole listing, not reclaim's filtered view
    assert fake.calls.count(["squeue", "--json"]) == 2


class CountingStore(ReclaimStore):
    """Counts the sample rows each read returns (a tick's database cost)."""

    fetched = 0

    def _samples(self, *args: Any, **kw: Any) -> list[SampleRow]:
        rows = super()._samples(*args, **kw)
        self.fetched += len(rows)
        return rows


def hold_back_the_last_gpu1_row(db_url: str) -> int:
    """The GPU 1 row of job 7's last poll (START + 200) still in flight: taken out, and a row with a
    higher id committed; returns the id it will commit with (`commit_late_row`)."""
    with transaction(open_database(db_url)) as session:
        late = session.scalars(select(JobGpuSample).where(JobGpuSample.ts == START + 200.0,
                                                          JobGpuSample.gpu_index == 1)).one()
        late_id = late.id
        session.delete(late)
        session.add(JobGpuSample(id=late_id + 100, ts=START + 200.0, node="a100-01", job_id="7", gpu_index=0,
                                 sm_util_pct=97.0, power_draw_w=350.0, power_limit_w=400.0, shared=False))
    return late_id


def commit_late_row(db_url: str, late_id: int) -> None:
    with transaction(open_database(db_url)) as session:
        session.add(JobGpuSample(id=late_id, ts=START + 200.0, node="a100-01", job_id="7", gpu_index=1,
                                 sm_util_pct=97.0, power_draw_w=350.0, power_limit_w=400.0, shared=False))


@pytest.mark.parametrize("max_gaps", [Controller.MAX_ID_GAPS, 0])  # the gaps' ids, or every id back to ID_OVERLAP
def test_a_row_committed_after_a_newer_one_was_read_is_still_judged_and_read_rows_are_not_read_again(
        db_url: str, max_gaps: int) -> None:
    # On a server database ids are taken at insert: row N+1 can be read before row N commits.
    fake = FakeSlurm(jobs={"7": FakeJob("7", gpus=2)})
    add_samples(db_url, "7", 2, START + 200.0, busy_gpus=2)
    late_id = hold_back_the_last_gpu1_row(db_url)
    store = CountingStore(open_database(db_url))
    clock = Clock(START + 200.0)
    controller = Controller(SlurmCli(runner=fake), store, CONFIG, clock=clock)
    controller.MAX_ID_GAPS = max_gaps
    controller.tick()
    assert controller._tracker.last_ts()[("7", "a100-01", 1)] == START + 190.0
    first = store.fetched
    commit_late_row(db_url, late_id)  # it commits now, with its lower id
    clock.now += 10.0
    controller.tick()
    assert controller._tracker.last_ts()[("7", "a100-01", 1)] == START + 200.0
    assert store.fetched - first == 1  # the late row only: rows read before are not fetched again
    clock.now += 10.0
    controller.tick()
    assert store.fetched - first == 1


def test_a_late_row_whose_read_fails_is_read_at_the_next_tick(tmp_path: Path) -> None:
    # The late ids were marked seen before their rows were read: a read that timed out left
    # them below the watermark and outside every later gap query, never judged.
    db_url = f"sqlite:///{tmp_path / 'state.db'}"
    fake = FakeSlurm(jobs={"7": FakeJob("7", gpus=2)})
    add_samples(db_url, "7", 2, START + 200.0, busy_gpus=2)
    late_id = hold_back_the_last_gpu1_row(db_url)

    class FailingOnce(ReclaimStore):
        fail = True

        def samples_by_id(self, ids: Any) -> Any:
            if self.fail:
                self.fail = False
                raise DatabaseError("Lost connection to server during query")
            return super().samples_by_id(ids)

    clock = Clock(START + 200.0)
    controller = Controller(SlurmCli(runner=fake), FailingOnce(open_database(db_url)), CONFIG, clock=clock)
    controller.tick()
    commit_late_row(db_url, late_id)
    clock.now += 10.0
    with pytest.raises(DatabaseError):
        controller.tick()
    clock.now += 10.0
    controller.tick()
    assert controller._tracker.last_ts()[("7", "a100-01", 1)] == START + 200.0


def test_only_jobs_with_a_finding_have_their_action_history_read(db_url: str) -> None:
    fake = FakeSlurm(jobs={"1": FakeJob("1"), "2": FakeJob("2")})
    add_samples(db_url, "1", 1, START + 200.0, busy_gpus=1)
    add_samples(db_url, "2", 1, START + 200.0)
    asked: list[list[str]] = []

    class HistorySpy(ReclaimStore):
        def history(self, job_ids: Any) -> Any:
            ids = sorted(job_ids)
            asked.append(ids)
            return super().history(ids)

    controller = Controller(SlurmCli(runner=fake), HistorySpy(open_database(db_url)), CONFIG, clock=Clock(START + 200.0))
    report = controller.tick()
    assert [(r.job_id, r.action) for r in report.results] == [("2", "notify")]
    assert asked == [["2"]]  # the busy job's plan needs no history


SHARD_CONFIG = ReclaimConfig(dry_run=False, poll_interval_s=10.0, cooldown_s=30.0, defaults=POLICY,
                             shards_per_gpu={"a100": 80}, gib_per_shard={"a100": 1.0})


def node_listings(fake: FakeSlurm) -> int:
    return fake.calls.count(["sinfo", "--json"])


def test_the_node_inventory_is_kept_between_ticks_and_refreshed_rarely(db_url: str) -> None:
    fake = FakeSlurm([FakeNode("a100-01", gres="gpu:a100:1(S:0),shard:a100:80(S:0)")],
                     jobs={"1": FakeJob("1", shards=20, admin_comment="aigc_class=infer")})
    add_samples(db_url, "1", 1, START + 3000.0, busy_gpus=1, start=START + 200.0)  # past one refresh
    controller, clock = make(db_url, fake, START + 200.0, config=SHARD_CONFIG)
    for _ in range(3):
        controller.tick()
        clock.now += 10.0
    assert (fake.calls.count(["squeue", "--json"]), node_listings(fake)) == (3, 1)
    assert {v.job.job_id: v.facts.shard_gpus for v in controller.assess().views} == {"1": 0.25}
    assert node_listings(fake) == 1
    clock.now += Controller.NODE_REFRESH_S
    controller.tick()
    assert node_listings(fake) == 2  # old enough: re-read


def test_a_shard_job_on_an_unknown_node_rereads_the_nodes_once(db_url: str) -> None:
    fake = FakeSlurm([FakeNode("a100-01", gres="gpu:a100:1(S:0),shard:a100:80(S:0)")],
                     jobs={"1": FakeJob("1", shards=20, admin_comment="aigc_class=infer")})
    add_samples(db_url, "1", 1, START + 260.0, busy_gpus=1, start=START + 200.0)
    controller, clock = make(db_url, fake, START + 200.0, config=SHARD_CONFIG)
    controller.tick()
    fake.jobs["2"] = FakeJob("2", shards=10, node="a100-09", admin_comment="aigc_class=infer")  # not listed
    fake.nodes["a100-07"] = FakeNode("a100-07", gres="gpu:a100:1(S:0),shard:a100:80(S:0)")  # added, no job on it yet
    for _ in range(3):
        clock.now += 10.0
        controller.tick()
    assert node_listings(fake) == 2  # one for a100-09; still unlisted afterwards, it costs no more
    controller.set_config(SHARD_CONFIG)  # SIGHUP: an admin may have changed slurm.conf
    clock.now += 10.0
    controller.tick()
    assert node_listings(fake) == 3


def test_the_inventory_is_taken_from_the_publishers_newest_node_listing(db_url: str) -> None:
    fake = FakeSlurm([FakeNode("a100-01", gres="gpu:a100:1(S:0),shard:a100:80(S:0)")],
                     jobs={"1": FakeJob("1", shards=20, admin_comment="aigc_class=infer")})
    add_samples(db_url, "1", 1, START + 3000.0, busy_gpus=1, start=START + 200.0)
    publisher_listing: list[tuple[NodeInfo, ...] | None] = [None]
    controller, clock = make(db_url, fake, START + 200.0, config=SHARD_CONFIG, nodes_seen=lambda: publisher_listing[0])
    controller.tick()
    assert node_listings(fake) == 1  # no publisher cycle yet: its own listing
    for _ in range(2):
        clock.now += Controller.NODE_REFRESH_S
        publisher_listing[0] = tuple(SlurmCli(runner=fake).nodes())  # a publisher cycle
        controller.tick()
    assert node_listings(fake) == 3  # the publisher's two, none more
    fake.nodes["a100-01"].gres = "gpu:h100:1(S:0),shard:h100:80(S:0)"  # no h100 in the inventory
    publisher_listing[0] = tuple(SlurmCli(runner=fake).nodes())
    clock.now += 10.0
    assert {v.job.job_id: v.facts.shard_gpus for v in controller.assess().views} == {"1": 0.0}
    assert node_listings(fake) == 4


def test_the_daemon_wires_the_publishers_node_listing_into_reclaim(db_url: str) -> None:
    controller, hooks, _leases = cli._controller(None, db_url, True, True)
    assert hooks is not None and controller._nodes_seen is hooks.nodes_seen and hooks.nodes_seen() is None


def test_a_tick_that_lists_the_nodes_hands_that_listing_to_the_publisher_too(db_url: str) -> None:
    fake = FakeSlurm([FakeNode("a100-01", gres="gpu:a100:1(S:0),shard:a100:80(S:0)")],
                     jobs={"1": FakeJob("1", shards=20, admin_comment="aigc_class=infer")})
    add_samples(db_url, "1", 1, START + 260.0, busy_gpus=1, start=START + 200.0)
    handed: list[list[str] | None] = []
    controller, clock = make(db_url, fake, START + 200.0, config=SHARD_CONFIG,
                             publisher_tick=lambda _jobs, nodes: handed.append(None if nodes is None else [n.name for n in nodes]))
    controller.tick()
    clock.now += 10.0
    controller.tick()
    assert handed == [["a100-01"], None]  # first tick: reclaim's own listing; then kept, none made
    assert node_listings(fake) == 1


# Sample rows as the store returns them: sorted by job, node, GPU, time; readings may be missing.
_ROW = st.tuples(st.sampled_from(["7", "8", "9"]), st.sampled_from(["a100-01", "t4-01"]), st.integers(0, 2),
                 st.integers(0, 50), st.one_of(st.none(), st.floats(0, 100)), st.one_of(st.none(), st.floats(0, 8e4)))


@given(st.lists(_ROW, max_size=40))
def test_batch_from_rows_matches_the_per_sample_path(raw: list[tuple[str, str, int, int, float | None, float | None]]) -> None:
    rows = sorted((SampleRow(i, job, node, gpu, float(ts), util, memory, 100.0, None, False)
                   for i, (job, node, gpu, ts, util, memory) in enumerate(raw)),
                  key=lambda r: (r.job_id, r.node, r.gpu_index, r.ts))
    metas = {job: JobMeta(job, "train", 0.0, 2) for job in ("7", "9")}  # job 8's rows are not judged
    fast, slow = batch_from_rows(metas, rows), batch_from_jobs(windows_from_rows(metas, rows))
    assert (fast.metas, fast.series_node, fast.series_gpu) == (slow.metas, slow.series_node, slow.series_gpu)
    for name in ("job_offsets", "series_offsets", "ts", "util", "memory", "power", "power_limit"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)


def test_facts_and_metas_are_kept_for_unchanged_jobs_and_derived_again_for_changed_ones(db_url: str) -> None:
    """A tick keeps a job's facts while Slurm's record of it is unchanged; a changed record (an
    admin's opt-out stamp) is derived again, and every tick's facts equal fresh ones."""
    fake = FakeSlurm(jobs={"7": FakeJob("7", gpus=1), "8": FakeJob("8", gpus=1, node="a100-02")})
    add_samples(db_url, "7", 1, START + 200.0)
    add_samples(db_url, "8", 1, START + 200.0, node="a100-02")
    controller, clock = make(db_url, fake, START + 200.0, dry_run=True)
    first = {v.job.job_id: v for v in controller.tick().assessment.views}
    fake.jobs["7"].admin_comment = "aigc_class=infer aigc_reclaim=no"
    clock.now += 10.0
    second = {v.job.job_id: v for v in controller.tick().assessment.views}
    for view in [*first.values(), *second.values()]:
        assert view.facts == job_facts(view.job)
    assert first["7"].facts.job_class == "train" and not first["7"].facts.opt_out
    assert second["7"].facts.job_class == "infer" and second["7"].facts.opt_out
    assert second["8"].facts is first["8"].facts and second["8"].job is first["8"].job


def test_derived_facts_follow_new_shard_figures_and_a_job_without_start_time() -> None:
    shard = FakeJob("9", gpus=0, shards=20).info()
    unstarted = FakeJob("10").info(start_time=None)
    derived = DerivedFacts()
    assert derived.facts([shard], {"a100-01": 80})["9"].shard_gpus == 0.25
    assert derived.facts([shard], {"a100-01": 40})["9"].shard_gpus == 0.5
    facts = derived.facts([unstarted], {})
    assert derived.metas([unstarted], facts, 100.0, set())["10"].start_ts == 100.0
    assert derived.metas([unstarted], facts, 200.0, {"10"})["10"] == JobMeta("10", "train", 200.0, 1, True)


def test_tick_pauses_the_cyclic_collector_and_resumes_it_after_an_error(db_url: str) -> None:
    seen: list[bool] = []
    fake = FakeSlurm(down=True)
    controller = Controller(SlurmCli(runner=fake), ReclaimStore(open_database(db_url)), CONFIG,
                            publisher_tick=lambda jobs, nodes: seen.append(gc.isenabled()))
    assert gc.isenabled()
    with pytest.raises(SlurmCommandError):
        controller.tick()
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(SlurmCommandError):
            controller.tick()
        assert not gc.isenabled()  # paused by the caller: left paused
    finally:
        gc.enable()


def test_22_05_actions_share_one_recheck_listing_taken_after_the_ticks_and_skip_a_job_ended_since(db_url: str) -> None:
    """22.05 reads one job by listing every job: a tick's actions are re-checked against one listing
    taken right before them (not the tick's own, nor one per action); a job that ended after the
    tick's listing is not acted on."""
    fake = FakeSlurm(jobs={j: FakeJob(j, gpus=1, node=f"a100-0{j}") for j in ("7", "8", "9")}, version="22.05.8")
    for job_id in fake.jobs:
        add_samples(db_url, job_id, 1, START + 200.0, node=f"a100-0{job_id}")
    listings: list[int] = []

    def runner(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> CommandResult:
        answer = fake(argv, timeout_s, stdin)
        if list(argv) == ["squeue", "--json"]:
            listings.append(len(fake.calls))
            fake.jobs["8"].state = "COMPLETED"  # ends right after the tick's listing
        return answer

    controller = Controller(SlurmCli(runner=runner), ReclaimStore(open_database(db_url)), CONFIG, clock=Clock(START + 200.0))
    results = {r.job_id: r for r in controller.tick().results}
    assert {job_id: (r.action, r.state) for job_id, r in results.items()} == {
        "7": ("notify", "done"), "8": ("notify", "skipped"), "9": ("notify", "done")}
    assert results["8"].detail["skipped"] == "job is COMPLETED now, no longer RUNNING"
    assert not any("JobId=8" in call for call in fake.mutations()) and "aigc-reclaim" not in fake.jobs["8"].admin_comment
    assert len(listings) == 2  # the tick's and one re-check listing for its three actions


@given(st.sets(st.integers(-5, 60)), st.integers(-5, 30), st.integers(0, 40))
def test_id_gaps_are_the_maximal_ranges_of_the_ids_not_read(seen: set[int], low: int, span: int) -> None:
    gaps = id_gaps(seen, low, low + span)
    assert [i for a, b in gaps for i in range(a, b + 1)] == sorted(set(range(low + 1, low + span + 1)) - seen)
    assert all(b + 1 < a2 for (_, b), (a2, _) in zip(gaps, gaps[1:]))


def test_sample_ids_in_ranges_are_the_ids_there_since_the_time(db_url: str) -> None:
    add_samples(db_url, "7", 2, START + 90.0)  # ids 1-20, two a poll
    store = ReclaimStore(open_database(db_url))
    every = store.sample_ids(0, 20, START)
    assert every == set(range(1, 21))
    assert store.sample_ids_in([(2, 4), (9, 9), (15, 30)], START + 40.0) == {9} | set(range(15, 21))  # ids 9+: ts >= +40
    assert store.sample_ids_in([], START) == set()
