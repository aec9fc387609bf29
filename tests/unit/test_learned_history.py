"""How the learner reads the history: load on slurmdbd and the database, and the memory it holds
(review of issue 14.4, defect 4). Behaviours, not timings.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields, replace
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import open_database
from slurm_aigc.errors import SlurmCommandError
from slurm_aigc.report.records import SampleSlice
from slurm_aigc.report.samples import SampleStore
from slurm_aigc.telemetry.learned import LearnedJob, parse_table
from slurm_aigc.telemetry.learnpublish import ENDED_STATES, WINDOW_S, LearnedPublisher
from tests.unit.test_learnpublish import NOW, FakeSacct, add_samples, iso, learner, option

DAY = 86400.0
WINDOWS_IN_14_DAYS = int(14 * DAY / WINDOW_S)


@pytest.fixture
def db(tmp_path: Path) -> sessionmaker[Session]:
    return open_database(f"sqlite:///{tmp_path / 'state.db'}")


class CountingSamples(SampleStore):
    """The samples store, remembering the job ids each read asked for."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        super().__init__(factory)
        self.asked: list[str] = []

    def job_slices(self, since_ts: float, until_ts: float, job_ids: Sequence[str] = ()) -> Iterator[SampleSlice]:
        self.asked.extend(job_ids)
        return super().job_slices(since_ts, until_ts, job_ids)


def five_jobs(sacct: FakeSacct, db: sessionmaker[Session], end: float = NOW - 7 * DAY) -> None:
    for i in range(5):
        sacct.add(100 + i, f"sd-gen-{i}", end=end)
        add_samples(db, 100 + i, 6000.0, 40.0, end=end)


def test_a_reload_keeps_the_read_position_unless_max_age_days_grows(tmp_path: Path, db: sessionmaker[Session]) -> None:
    sacct = FakeSacct()
    five_jobs(sacct, db)
    sacct.add(300, "old-run-1", end=NOW - 20 * DAY)
    clock = [NOW]
    run = learner(tmp_path, sacct, db, clock)
    assert len(run.tick() or []) == 1 and len(sacct.calls) == WINDOWS_IN_14_DAYS
    sacct.calls.clear()
    clock[0] += 600
    run.set_config(replace(run.config, min_jobs=3, file=str(tmp_path / "new.txt")), run.classes)  # SIGHUP
    assert len(run.tick() or []) == 1
    assert len(sacct.calls) == 1  # only since the last read: no 14 days again
    assert (tmp_path / "new.txt").exists()  # a new file is written at once, though the table is the same
    sacct.calls.clear()
    run.set_config(replace(run.config, max_age_days=30), run.classes)  # the cache starts 14 days back: read more
    run.tick()
    assert option(sacct.calls[0], "--starttime") < option(sacct.calls[-1], "--starttime")
    assert len(sacct.calls) > WINDOWS_IN_14_DAYS and "300" in run.held_jobs


def test_a_job_read_again_in_the_overlap_is_new_only_once(tmp_path: Path, db: sessionmaker[Session]) -> None:
    sacct = FakeSacct()
    five_jobs(sacct, db, end=NOW - 600)  # ended 10 minutes ago: inside the next read's overlap
    clock = [NOW]
    samples = CountingSamples(db)
    run = LearnedPublisher(sacct, samples, learner(tmp_path, sacct, db, clock).config, clock=lambda: clock[0],
                           uids={"aigc-alice": 1001}.get)
    run.tick()
    assert sorted(samples.asked) == [str(100 + i) for i in range(5)]
    samples.asked.clear()
    for step in range(1, 4):
        clock[0] = NOW + 600 * step
        assert len(run.tick() or []) == 1
    assert samples.asked == []  # re-read by sacct each time, never new again: no samples read again
    sacct.rows[0]["End"] = iso(NOW + 1800)  # job 100 was requeued and its next run ended
    clock[0] = NOW + 3000
    run.tick()
    assert samples.asked == ["100"]  # a requeued job that ended again (later) is new again


def test_only_jobs_that_ended_are_asked_for_window_by_window_of_their_end(tmp_path: Path,
                                                                         db: sessionmaker[Session]) -> None:
    sacct = FakeSacct()
    for i in range(5):  # long jobs: started 3 days before they ended, across many windows
        sacct.add(100 + i, f"sd-gen-{i}", end=NOW - DAY, start=NOW - 4 * DAY)
        add_samples(db, 100 + i, 6000.0, 40.0, end=NOW - DAY)
    sacct.add(200, "sd-gen-9", end=None)  # still running
    sacct.add(201, "sd-gen-8", end=None, state="PENDING")
    run = learner(tmp_path, sacct, db, [NOW])
    [entry] = run.tick() or []
    assert all(option(call, "--state") == ",".join(ENDED_STATES) for call in sacct.calls)
    assert entry.jobs == 5 and set(run.held_jobs) == {str(100 + i) for i in range(5)}
    assert ENDED_STATES == ("CD", "F", "TO", "OOM", "NF", "CA", "PR", "DL")  # sacct's names, 22.05 to 24.11


class FailingOnce(FakeSacct):
    """slurmdbd timing out once, on the `fail_at`-th call."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def run(self, tool: str, args: Sequence[str]) -> object:
        if len(self.calls) + 1 == self.fail_at:
            self.fail_at = 0
            self.calls.append(args)
            raise SlurmCommandError(["sacct", *args], None, "no answer within 30 s")
        return super().run(tool, args)


def test_a_window_that_fails_is_read_again_not_the_whole_range(tmp_path: Path, db: sessionmaker[Session]) -> None:
    sacct = FailingOnce(fail_at=10)
    five_jobs(sacct, db)
    run = learner(tmp_path, sacct, db, [NOW])
    with pytest.raises(SlurmCommandError):
        run.tick()
    failed = sacct.calls[-1]
    sacct.calls.clear()
    assert len(run.tick() or []) == 1
    assert sacct.calls[0] == failed and len(sacct.calls) == WINDOWS_IN_14_DAYS - 9  # from the failed window on


def test_in_the_loop_one_window_per_tick_and_the_table_only_once_read_up_to_now(tmp_path: Path,
                                                                              db: sessionmaker[Session]) -> None:
    sacct = FailingOnce(fail_at=3)
    five_jobs(sacct, db)
    clock, monotonic = [NOW], [0.0]
    run = LearnedPublisher(sacct, SampleStore(db), learner(tmp_path, sacct, db, clock).config, clock=lambda: clock[0],
                           monotonic=lambda: monotonic[0], uids={"aigc-alice": 1001}.get, windows_per_tick=1)
    table = tmp_path / "out" / "learned.txt"
    assert run.tick_when_due() is None and run.tick_when_due() is None and len(sacct.calls) == 2
    with pytest.raises(SlurmCommandError):
        run.tick_when_due()  # the third window fails ...
    assert run.tick_when_due() is None and len(sacct.calls) == 3  # ... and is retried after interval_s, not at once
    monotonic[0] += run.config.interval_s
    ticks = 0
    while not table.exists():
        assert ticks < WINDOWS_IN_14_DAYS
        run.tick_when_due()
        ticks += 1
    assert len(sacct.calls) == WINDOWS_IN_14_DAYS + 1  # each window once (the failed one twice)
    assert len(parse_table(table.read_bytes())) == 1
    assert run.tick_when_due() is None  # read up to now: back to once per interval_s


def test_the_cache_keeps_only_what_the_table_needs(tmp_path: Path, db: sessionmaker[Session]) -> None:
    sacct = FakeSacct()
    five_jobs(sacct, db)
    sacct.add(150, "x" * 1000 + "-0001", stamp="aigc_class=imagegen; " + "y" * 1000)
    sacct.add(151, "cpu-1", gpus="gres/gpu=0")
    sacct.add(152, "ghost-1", user="nobody-here")
    sacct.add(153, "root-1", user="root")
    clock = [NOW]
    run = LearnedPublisher(sacct, SampleStore(db), learner(tmp_path, sacct, db, clock).config, clock=lambda: clock[0],
                           uids={"aigc-alice": 1001, "root": 0}.get)
    run.tick()
    assert set(run.held_jobs) == {"100", "101", "102", "103", "104", "150"}  # learnable GPU jobs only
    held = run.held_jobs["150"]
    assert {f.name for f in fields(LearnedJob)} == {"uid", "user", "pattern", "stamped_class", "end_ts",
                                                    "peak_vram_mib", "sm_pct"}  # no name, no comment
    assert len(held.pattern) == 128 and held.stamped_class == "imagegen"
    assert held.pattern is run.held_jobs["150"].pattern and run.held_jobs["100"].pattern is run.held_jobs["101"].pattern
    clock[0] = NOW + 15 * DAY  # every job is now more than 14 days old
    run.tick()
    assert not run.held_jobs
