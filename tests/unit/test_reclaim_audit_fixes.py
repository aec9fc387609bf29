"""The controller's guards judge only trustworthy rows of a job's current run; a step that
provably did nothing is tried again; the shared-jobs set follows the running jobs."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from slurm_aigc.db import JobGpuSample, open_database, transaction
from slurm_aigc.reclaim.controller import Controller, StaleSamplesError
from slurm_aigc.reclaim.store import ReclaimStore
from slurm_aigc.slurm import SlurmCli
from tests.fakes.slurm import FakeJob, FakeSlurm

from . import test_reclaim_gpuconflict as conflicts
from . import test_reclaim_memguard as memguard
from .test_reclaim_controller import CONFIG, START, Clock, add_samples, make

GIB = 1024.0


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


def sample(url: str, job_id: str, ts: float, memory_gib: float, node: str = "t4-01", gpu: int = 3,
           shared: bool = False) -> None:
    with transaction(open_database(url)) as session:
        session.add(JobGpuSample(ts=ts, node=node, job_id=job_id, gpu_index=gpu, sm_util_pct=60.0,
                                 memory_used_mib=memory_gib * GIB, memory_total_mib=16 * GIB,
                                 power_draw_w=50.0, power_limit_w=70.0, shared=shared))


def test_the_memory_guard_does_not_judge_a_restarted_job_by_its_previous_run(db_url: str) -> None:
    fake = memguard.neighbours()
    memguard.add(db_url, "1", START + 80.0, 60.0)  # the previous run: 60 GiB on 20 shards until +80 s
    memguard.add(db_url, "2", START + 80.0, 18.0)
    job = fake.jobs["1"]
    job.restarts, job.start = 1, datetime.fromtimestamp(START + 90.0).isoformat()  # requeued, runs again
    memguard.add(db_url, "2", START + 95.0, 18.0, start=START + 90.0)
    controller, _ = memguard.make(db_url, fake, START + 95.0)  # this run has written no sample yet
    report = controller.tick()
    assert {v.job.job_id: v.verdict.kind for v in report.assessment.views}["1"] is None
    assert report.results == () and fake.mutations() == []


def test_the_conflict_guard_does_not_judge_a_restarted_job_by_its_previous_run(db_url: str) -> None:
    fake = conflicts.conflict()
    fake.jobs["11"].start = datetime.fromtimestamp(START + 35.0).isoformat()  # restarted at +35 s
    sample(db_url, "10", START + 40.0, 6.0, shared=True)
    sample(db_url, "11", START + 32.0, 12.0)  # its previous run's reading: 6 + 12 GiB of 16 would act
    controller = Controller(SlurmCli(runner=fake), ReclaimStore(open_database(db_url)), conflicts.CONFIG,
                            clock=Clock(START + 40.0))
    assert controller.tick().results == () and fake.jobs["10"].restarts == 0


def test_the_conflict_guard_ignores_rows_dated_ahead_of_the_clock(db_url: str) -> None:
    fake = conflicts.conflict()
    sample(db_url, "11", START + 3600.0, 12.0)  # written while t4-01's clock ran an hour ahead
    report = conflicts.make(db_url, fake, other_gib=4.0).tick()  # now: 6 + 4 of 16 GiB, they fit
    assert report.results == () and fake.jobs["10"].restarts == 0


def test_a_row_dated_ahead_does_not_turn_the_stale_guard_off(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    add_samples(db_url, "7", 1, START + 200.0)  # the agents stop writing at +200 s
    sample(db_url, "99", START + 86400.0, 0.0, node="other-01", gpu=0)  # a skewed host's row, a day ahead
    controller, _ = make(db_url, fake, START + 200.0 + CONFIG.stale_s + 600.0)
    with pytest.raises(StaleSamplesError):
        controller.tick()
    assert fake.mutations() == []


def test_a_requeue_that_failed_without_effect_is_tried_again_after_the_cooldown(db_url: str) -> None:
    fake = FakeSlurm(jobs={"7": FakeJob("7")})
    add_samples(db_url, "7", 1, START + 200.0)
    controller, clock = make(db_url, fake, START + 200.0)
    assert [r.action for r in controller.tick().results] == ["notify"]
    clock.now = START + 240.0
    add_samples(db_url, "7", 1, START + 240.0, start=START + 210.0)
    fake.fail["scontrol requeue"] = "slurm_requeue error: Socket timed out on send/recv operation"
    assert [(r.action, r.state) for r in controller.tick().results] == [("requeue", "failed")]
    del fake.fail["scontrol requeue"]
    clock.now = START + 250.0  # within the cool-down
    add_samples(db_url, "7", 1, START + 250.0, start=START + 250.0)
    assert controller.tick().results == ()
    clock.now = START + 300.0
    add_samples(db_url, "7", 1, START + 300.0, start=START + 260.0)
    [retry] = controller.tick().results
    assert (retry.observation_key, retry.state) == ("7/r0/idle/1:requeue#2", "done")
    assert fake.jobs["7"].restarts == 1


def test_the_shared_jobs_set_keeps_only_running_jobs(db_url: str) -> None:
    fake = memguard.neighbours()
    memguard.add(db_url, "1", START + 60.0, 5.0)
    controller, clock = memguard.make(db_url, fake, START + 60.0)
    controller.tick()
    assert "1" in controller._shared_jobs
    fake.jobs["1"].state = "COMPLETED"
    clock.now += 10.0
    memguard.add(db_url, "2", START + 70.0, 5.0)
    controller.tick()
    assert "1" not in controller._shared_jobs
