"""The replay runner's pure parts: what it submits and how it reads outcomes back."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_aigc.profiles import Phase
from slurm_aigc.replay import runner
from slurm_aigc.replay.metrics import UsageSample, backlog_figures, censored_wait_s, harmed_by, used_gpu_s
from slurm_aigc.replay.runner import (
    Backlog,
    RunSettings,
    fit_failures,
    hung_sm,
    hung_spans,
    job_script,
    largest_gpu_type,
    merge_retries,
    nominal_work_gpu_s,
    outcomes_from_records,
    pending_count,
    retry_args,
    sbatch_args,
    shares_a_gpu,
    simulated_memory_gib,
    user_for,
    work_end_s,
)
from slurm_aigc.replay.workload import Workload, WorkloadJob
from slurm_aigc.report.figures import DEFAULT_USEFUL_RULE
from slurm_aigc.report.sacct import JobRecord, parse_sacct_output
from tests.unit.sacct_json import DELIMITER, FIELDS, text_to_json


def job(**overrides: object) -> WorkloadJob:
    values: dict[str, object] = {
        "name": "j1", "submit_offset_s": 0.0, "job_class": "infer", "gpus": 4, "vram_gib_per_gpu": 20.0, "duration_s": 40.0,
        "time_limit_s": 90, "profile": (Phase("loading", 10), Phase("busy", 30)), "tags": "aigc:type=infer,vram=20G",
        "mem_used_gib_per_gpu": 12.0, "util_pct": 60.0,
    }
    values.update(overrides)
    return WorkloadJob(**values)  # type: ignore[arg-type]


def test_sbatch_args_ask_for_untyped_gpus_with_tags_time_and_requeue() -> None:
    args = sbatch_args(job())
    assert "--gres=gpu:4" in args
    assert "--time=2" in args  # 90 s rounds up to 2 minutes
    assert "--comment=aigc:type=infer,vram=20G" in args
    assert "--requeue" in args
    assert "--no-requeue" in sbatch_args(job(requeue=False))
    assert not any(a.startswith("--comment") for a in sbatch_args(job(tags="")))


def run_script(script: str, tmp_path: Path, **env: str) -> list[str]:
    """Run the batch script with a fake slurm-aigc that prints its argv."""
    fake = tmp_path / "slurm-aigc"
    fake.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    path = tmp_path / "job.sh"
    path.write_text(script.replace("/FAKE/slurm-aigc", str(fake)))
    result = subprocess.run(["bash", str(path)], capture_output=True, text=True, check=True,
                            env={"PATH": os.environ["PATH"], **env})
    return result.stdout.splitlines()


def test_script_plays_the_profile_then_the_requeue_profile_after_a_restart(tmp_path: Path) -> None:
    script = job_script(job(requeue_profile=(Phase("busy", 15),)), ["/FAKE/slurm-aigc"])
    first = run_script(script, tmp_path)
    assert first[:1] == ["gpu-load"]
    assert first[first.index("--profile-spec") + 1] == "loading:10,busy:30"
    assert first[first.index("--mem") + 1] == "12G"
    assert first[first.index("--seconds") + 1] == "40"
    assert "--work-conserving" in first  # a packed job runs longer rather than losing work
    again = run_script(script, tmp_path, SLURM_RESTART_COUNT="1")
    assert again[again.index("--profile-spec") + 1] == "busy:15"
    assert again[again.index("--seconds") + 1] == "15"


def test_requeued_job_without_a_requeue_profile_exits_at_once(tmp_path: Path) -> None:
    script = job_script(job(), ["/FAKE/slurm-aigc"])
    assert run_script(script, tmp_path)[:1] == ["gpu-load"]
    assert run_script(script, tmp_path, SLURM_RESTART_COUNT="2") == []


def test_over_allocated_job_loads_only_the_gpus_it_uses(tmp_path: Path) -> None:
    script = job_script(job(gpus=4, gpus_used=1), ["/FAKE/slurm-aigc"])
    argv = run_script(script, tmp_path, SLURM_JOB_GPUS="4,5,6,7")
    assert argv[argv.index("--gpus") + 1] == "4"


def test_users_outside_the_test_set_are_spread_over_it() -> None:
    users = ("aigc-alice", "aigc-bob")
    assert user_for(job(user="aigc-bob"), 0, users) == "aigc-bob"
    assert {user_for(job(user="someone"), i, users) for i in range(4)} == {"aigc-alice", "aigc-bob"}


def sacct_text(rows: list[dict[str, str]]) -> str:
    header = DELIMITER.join(FIELDS)
    lines = [DELIMITER.join(row.get(f, "") for f in FIELDS) for row in rows]
    return "\n".join([header, *lines]) + "\n"


def record(job_id: str, state: str, submit: str, start: str, end: str, tres: str, node: str = "a100-01") -> dict[str, str]:
    return {"JobID": job_id, "JobIDRaw": job_id, "JobName": "j", "User": "aigc-alice", "Account": "aigc",
            "Partition": "gpu", "QOS": "normal", "State": state, "Submit": submit, "Eligible": submit,
            "Start": start, "End": end, "AllocTRES": tres, "NodeList": node, "AdminComment": "",
            "Comment": "aigc:type=train", "ElapsedRaw": "10"}


def test_requeued_job_is_one_outcome_with_both_runs_allocated() -> None:
    text = sacct_text([
        record("7", "REQUEUED", "2026-01-01T00:00:00", "2026-01-01T00:00:10", "2026-01-01T00:01:10", "gres/gpu=2"),
        record("7", "COMPLETED", "2026-01-01T00:01:10", "2026-01-01T00:01:30", "2026-01-01T00:02:00", "gres/gpu=2"),
        record("8", "COMPLETED", "2026-01-01T00:00:05", "2026-01-01T00:00:05", "2026-01-01T00:00:45",
               "gres/shard=20", node="a100-02"),
    ])
    rows = [r for r in parse_sacct_output(text_to_json(text)) if isinstance(r, JobRecord)]
    assert len(rows) == 3
    outcomes = {o.job_id: o for o in outcomes_from_records(rows, {"7": "train"}, {"a100": 80})}
    seven = outcomes["7"]
    assert seven.requeues == 1 and seven.state == "COMPLETED" and seven.job_class == "train"
    assert seven.start_ts is not None and seven.submit_ts is not None
    assert seven.start_ts - seven.submit_ts == 10
    assert seven.allocated_gpu_s == 2 * 60 + 2 * 30
    eight = outcomes["8"]
    assert eight.gpus == 0.25  # 20 of an a100's 80 shards
    assert eight.allocated_gpu_s == 0.25 * 40


def test_a_hung_job_sharing_a_gpu_with_a_working_one_is_not_useful_work() -> None:
    # Job 7 (shards) works 20 s, then hangs at 100 % SM; its neighbour 8 works at 50 % all along,
    # so the GPU's power is the neighbour's and the fake-busy rule cannot see the hang.
    hangs = job(name="h", profile=(Phase("loading", 10), Phase("busy", 20), Phase("hung", 60)),
                requeue_profile=(Phase("busy", 20),))
    text = sacct_text([
        record("7", "REQUEUED", "2026-01-01T00:00:00", "2026-01-01T00:00:00", "2026-01-01T00:01:00", "gres/shard=40"),
        record("7", "COMPLETED", "2026-01-01T00:01:00", "2026-01-01T00:01:10", "2026-01-01T00:01:30", "gres/shard=40"),
        record("8", "COMPLETED", "2026-01-01T00:00:00", "2026-01-01T00:00:00", "2026-01-01T00:01:30", "gres/shard=40"),
    ])
    rows = [r for r in parse_sacct_output(text_to_json(text)) if isinstance(r, JobRecord)]
    start = min(r.start_ts for r in rows if r.start_ts is not None)
    spans = hung_spans(rows, {"7": hangs, "8": job(name="w")})
    assert spans == {"7": [(start + 30, start + 60)]}  # the run after the requeue plays no hang
    polls = [start + t for t in range(0, 90, 10)]
    shares = [(ts, "a100-01", 0, "7", 50.0 if start + 10 <= ts < start + 60 else 0.0) for ts in polls]
    shares += [(ts, "a100-01", 0, "8", 50.0) for ts in polls]
    hung = hung_sm(shares, spans)
    assert sorted(ts - start for ts, _, _ in hung) == [30, 40, 50]
    gpu = [UsageSample(ts, "a100-01", 0, 100.0 if start + 10 <= ts < start + 60 else 50.0, 300.0, 400.0,
                       hung.get((ts, "a100-01", 0), 0.0)) for ts in polls]
    useful = used_gpu_s(gpu, start, start + 90, useful=DEFAULT_USEFUL_RULE)
    assert useful == pytest.approx(10 * (0.5 + 1.0 + 1.0 + 0.5 + 0.5 + 0.5 + 0.5 + 0.5 + 0.5))
    assert used_gpu_s([replace(s, hung_pct=0.0) for s in gpu], start, start + 90, useful=DEFAULT_USEFUL_RULE) > useful


def test_a_job_that_ran_out_of_memory_is_resubmitted_on_the_largest_gpu_type() -> None:
    shape = SimpleNamespace(nodes=[SimpleNamespace(gpu=SimpleNamespace(gres_type=t, memory_gib=m)) for t, m in
                                   (("t4", 16), ("a100", 80), ("t4", 16), ("l40s", 48))])
    assert largest_gpu_type(shape) == "a100"
    assert largest_gpu_type(SimpleNamespace(nodes=[])) is None
    first, again = sbatch_args(job(gpus=2)), retry_args(job(gpus=2), "a100")
    assert "--gres=gpu:2" in first and "--gres=gpu:a100:2" in again
    assert [a for a in again if not a.startswith("--gres=")] == [a for a in first if not a.startswith("--gres=")]


def test_a_retry_is_one_outcome_that_waited_both_attempts_spells_in_the_queue() -> None:
    text = sacct_text([
        record("7", "FAILED", "2026-01-01T00:00:00", "2026-01-01T00:00:10", "2026-01-01T00:00:12", "gres/gpu=1", node="t4-01"),
        record("9", "COMPLETED", "2026-01-01T00:00:13", "2026-01-01T00:01:00", "2026-01-01T00:02:00", "gres/gpu=1"),
        record("8", "FAILED", "2026-01-01T00:00:00", "2026-01-01T00:00:01", "2026-01-01T00:00:02", "gres/shard=8", node="t4-02"),
        record("10", "COMPLETED", "2026-01-01T00:00:03", "2026-01-01T00:00:04", "2026-01-01T00:00:30", "gres/gpu=1"),
    ])
    rows = [r for r in parse_sacct_output(text_to_json(text)) if isinstance(r, JobRecord)]
    outcomes = merge_retries(outcomes_from_records(rows, {}, {"a100": 80, "t4": 16}), {"7": "9", "8": "10"})
    assert [o.job_id for o in outcomes] == ["7", "8"]
    seven, eight = outcomes
    assert seven.retried and seven.state == "COMPLETED" and seven.allocated_gpu_s == 2 + 60
    end = seven.submit_ts + 600
    assert censored_wait_s(seven, end) == 10 + 47  # both spells in the queue, not the failed run between
    assert not harmed_by(seven, end)
    assert eight.failed_shared and harmed_by(eight, end)  # a neighbour on its shared GPU took the memory
    figures = backlog_figures(outcomes, [], 8, seven.submit_ts, 600, 4)
    assert figures.jobs_retried == 2 and figures.completed == 2 and figures.jobs_harmed == 1


def test_run_figures_are_read_through_the_stores(tmp_path: Path) -> None:
    """The samples and reclaimed GPU-hours a run reports, from the stores' queries."""
    from slurm_aigc.db import ActionRecord, GpuSample, open_database, transaction
    from slurm_aigc.reclaim.store import ReclaimStore
    from slurm_aigc.telemetry.store import TelemetryStore

    factory = open_database(f"sqlite:///{tmp_path}/run.db")
    with transaction(factory) as session:
        session.add_all([
            GpuSample(ts=90.0, node="a100-01", gpu_index=0, sm_util_pct=10.0),  # before the run
            GpuSample(ts=100.0, node="a100-01", gpu_index=0, sm_util_pct=80.0),
            GpuSample(ts=100.0, node="a100-01", gpu_index=1, sm_util_pct=None),
            GpuSample(ts=101.0, node="a100-01", gpu_index=2, sm_util_pct=50.0, lost=True),
        ])
        session.add_all([
            ActionRecord(observation_key=key, ts_intent=100.0, job_id="7", verdict="idle", action="requeue",
                         state=state, dry_run=dry, gpu_hours_recovered=hours)
            for key, state, dry, hours in [("a", "done", False, 1.5), ("b", "done", True, 9.0),
                                           ("c", "failed", False, 9.0), ("d", "done", False, 0.25)]
        ])
    assert sorted(TelemetryStore(factory).gpu_utilization_since(100.0), key=lambda r: r[2]) == [
        (100.0, "a100-01", 0, 80.0), (100.0, "a100-01", 1, None)]
    assert ReclaimStore(factory).gpu_hours_recovered() == 1.75


# ---------------------------------------------------------------- backlogged mode (issue 14.1)

@dataclass(frozen=True)
class Listed:
    job_id: str
    state: str


def test_pending_count_reads_only_our_pending_jobs_from_one_listing() -> None:
    listing = [Listed("1", "PENDING"), Listed("2", "RUNNING"), Listed("3", "PENDING"), Listed("9", "PENDING"),
               Listed("4", "COMPLETED"), Listed("5", "PENDING (Resources)")]
    assert pending_count(listing, {"1", "2", "3", "4", "5"}) == 3  # 9 is someone else's
    assert pending_count([], {"1"}) == 0


def test_backlog_tops_up_to_k_until_the_window_or_the_stream_ends() -> None:
    backlog = Backlog(size=4, duration_s=60.0, start_ts=1000.0)
    assert backlog.to_submit(1000.0, pending=0, remaining=100) == 4
    assert backlog.to_submit(1010.0, pending=3, remaining=100) == 1
    assert backlog.to_submit(1010.0, pending=6, remaining=100) == 0  # requeued jobs may push it over K
    assert backlog.to_submit(1020.0, pending=0, remaining=2) == 2  # the stream runs out
    assert backlog.to_submit(1060.0, pending=0, remaining=100) == 0 and backlog.over(1060.0)
    with pytest.raises(ValueError):
        Backlog(size=0, duration_s=60.0, start_ts=0.0)
    with pytest.raises(ValueError):
        Backlog(size=2, duration_s=0.0, start_ts=0.0)


def test_nominal_work_counts_busy_phases_on_the_gpus_used_and_a_hung_jobs_rest() -> None:
    assert nominal_work_gpu_s(job()) == 4 * 30
    assert nominal_work_gpu_s(job(gpus_used=1)) == 30
    hung = job(profile=(Phase("loading", 10), Phase("busy", 20), Phase("hung", 150)),
               requeue_profile=(Phase("loading", 10), Phase("busy", 20)), duration_s=180.0, gpus=1)
    assert nominal_work_gpu_s(hung) == 40
    redo = job(gpus=1, requeue_profile=(Phase("loading", 10), Phase("busy", 30)))
    assert nominal_work_gpu_s(redo) == 30  # a requeued busy job redoes work, it does not add any


class FakeSlurm:
    """A Slurm whose jobs stay pending until `start` says otherwise; counts listings and submits."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.listings = 0
        self.submitted: list[tuple[float, str]] = []
        self.args: list[list[str]] = []
        self.running: set[str] = set()
        self.failing: set[str] = set()  # job names whose first attempt fails at its start

    def jobs(self) -> list[Listed]:
        self.listings += 1
        # each tick the oldest pending job starts: the cluster takes one job a second
        pending = [str(i + 1) for i in range(len(self.submitted)) if str(i + 1) not in self.running]
        if pending:
            self.running.add(pending[0])
        return [Listed(str(i + 1), self._state(i)) for i in range(len(self.submitted))]

    def _state(self, index: int) -> str:
        if str(index + 1) not in self.running:
            return "PENDING"
        name = self.submitted[index][1]
        first = next(i for i, (_, n) in enumerate(self.submitted) if n == name) == index
        return "FAILED" if first and name in self.failing else "RUNNING"

    def submit(self, args: list[str], script: str, *, user: str | None = None) -> str:
        self.submitted.append((self.clock[0], next(a for a in args if a.startswith("--job-name="))))
        self.args.append(args)
        return str(len(self.submitted))


def test_the_backlogged_loop_keeps_k_pending_with_one_listing_a_tick(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clock = [1000.0]
    fake_time = SimpleNamespace(time=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(runner, "time", fake_time)
    slurm = FakeSlurm(clock)
    cluster = SimpleNamespace(slurm=slurm, job_command=lambda: ["slurm-aigc"])
    workload = Workload(tuple(job(name=f"j{i:02d}") for i in range(30)))
    settings = RunSettings(mode="stock", policy=tmp_path / "p.yaml", out_dir=tmp_path, users=("u",), passthrough_hook="",
                           backlog=3, duration_s=10.0)
    run = runner.ReplayRun(workload, settings, cluster, lambda message: None)
    exhausted = run._submit_backlogged(Backlog(3, 10.0, 1000.0))
    assert not exhausted
    # 3 at once, then one a second as the fake cluster starts one a second; nothing at or after 1010.
    assert [name for _, name in slurm.submitted] == [f"--job-name=j{i:02d}" for i in range(len(slurm.submitted))]
    assert [ts for ts, _ in slurm.submitted[:3]] == [1000.0] * 3 and max(ts for ts, _ in slurm.submitted) < 1010.0
    assert len(slurm.submitted) == 3 + 9
    assert slurm.listings == 9  # one listing per tick (the first tick has nothing of ours to list), however many jobs
    short = Workload(tuple(job(name=f"k{i}") for i in range(2)))
    assert runner.ReplayRun(short, settings, SimpleNamespace(slurm=FakeSlurm(clock), job_command=lambda: ["x"]),
                            lambda message: None)._submit_backlogged(Backlog(3, 10.0, clock[0]))


def test_the_backlogged_loop_resubmits_a_failed_job_once_and_counts_it_pending(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clock = [1000.0]
    monkeypatch.setattr(runner, "time", SimpleNamespace(time=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s)))
    slurm = FakeSlurm(clock)
    slurm.failing = {"--job-name=j00"}
    shape = SimpleNamespace(nodes=[SimpleNamespace(gpu=SimpleNamespace(gres_type="a100", memory_gib=80))])
    cluster = SimpleNamespace(slurm=slurm, job_command=lambda: ["slurm-aigc"], shape=lambda: shape)
    settings = RunSettings(mode="stock", policy=tmp_path / "p.yaml", out_dir=tmp_path, users=("u",), passthrough_hook="",
                           backlog=1, duration_s=6.0)
    run = runner.ReplayRun(Workload(tuple(job(name=f"j{i:02d}", gpus=2) for i in range(30))), settings, cluster,
                           lambda message: None)
    run._submit_backlogged(Backlog(1, 6.0, 1000.0))
    names = [name for _, name in slurm.submitted]
    assert names.count("--job-name=j00") == 2  # the first attempt FAILED: resubmitted once, never again
    retry = [args for args in slurm.args if "--job-name=j00" in args][1]
    assert "--gres=gpu:a100:2" in retry
    assert run.retries == {"1": str(names.index("--job-name=j00", 1) + 1)}
    # the resubmission is pending work of ours: the stream waited for it before its next job
    assert names[:3] == ["--job-name=j00", "--job-name=j00", "--job-name=j01"]


def test_jobs_not_ended_at_the_open_loop_timeout_are_remembered_as_lost(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The cleanup's scancel then ends them CANCELLED: without the mark they were neither lost nor waited for.
    clock = [1000.0]
    monkeypatch.setattr(runner, "time", SimpleNamespace(time=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s)))
    slurm = FakeSlurm(clock)
    settings = RunSettings(mode="stock", policy=tmp_path / "p.yaml", out_dir=tmp_path, users=("u",), passthrough_hook="",
                           timeout_s=12.0)
    run = runner.ReplayRun(Workload(tuple(job(name=f"j{i}") for i in range(6))), settings,
                           SimpleNamespace(slurm=slurm, job_command=lambda: ["x"]), lambda message: None)
    for index, each in enumerate(run.workload.jobs):
        run._submit(index, each)
    assert set(run.submitted) == {str(i) for i in range(1, 7)}
    run._wait_all_ended(1000.0)  # the fake starts one job a listing and never ends any
    assert run.timed_out == {str(i) for i in range(1, 7)}


def test_a_given_database_is_used_as_it_is_not_a_fresh_one(tmp_path: Path) -> None:
    made: list[str] = []
    cluster = SimpleNamespace(slurm=None, job_command=lambda: ["x"], scratch_database=lambda name: made.append(name) or "scratch")
    settings = RunSettings(mode="aigc", policy=tmp_path / "p.yaml", out_dir=tmp_path, users=("u",), passthrough_hook="")
    assert runner.ReplayRun(Workload(()), settings, cluster, print)._fresh_database() == "scratch"
    assert made == ["replay_aigc"]
    kept = replace(settings, db="/etc/slurm-aigc/db/warm.url")
    assert runner.ReplayRun(Workload(()), kept, cluster, print)._fresh_database() == "/etc/slurm-aigc/db/warm.url"
    assert made == ["replay_aigc"]  # nothing recreated


def test_a_requeued_jobs_second_spell_in_the_queue_is_part_of_its_wait() -> None:
    # Both runs keep K jobs pending, a requeued one among them: its second spell was charged to no
    # job, and slurm-aigc (which requeues) read about 8 of 64 pending slots as waiting nobody.
    text = sacct_text([
        record("7", "REQUEUED", "2026-01-01T00:00:00", "2026-01-01T00:00:10", "2026-01-01T00:01:10", "gres/gpu=2"),
        record("7", "COMPLETED", "2026-01-01T00:01:10", "2026-01-01T00:01:30", "2026-01-01T00:02:00", "gres/gpu=2"),
        record("8", "REQUEUED", "2026-01-01T00:00:00", "2026-01-01T00:00:05", "2026-01-01T00:00:20", "gres/gpu=1"),
        record("8", "CANCELLED by 0", "2026-01-01T00:00:20", "", "2026-01-01T00:01:40", "gres/gpu=1"),
    ])
    rows = [r for r in parse_sacct_output(text_to_json(text)) if isinstance(r, JobRecord)]
    seven, eight = outcomes_from_records(rows, {}, {"a100": 80})
    end = seven.submit_ts + 100
    assert censored_wait_s(seven, end) == 10 + 20
    assert censored_wait_s(eight, end) == 5 + 80  # pending again from its requeue to the window's end


def test_a_whole_gpu_job_that_failed_where_its_memory_fits_was_harmed_by_a_neighbour() -> None:
    # Slurm 22.05 hands a GPU whole while a shard job still holds part of it: a job that fits an
    # a100 failing out of memory there lost it to sharing; the same job failing on a t4 did not.
    text = sacct_text([
        record("7", "FAILED", "2026-01-01T00:00:00", "2026-01-01T00:00:10", "2026-01-01T00:00:12", "gres/gpu=1", node="a100-01"),
        record("9", "COMPLETED", "2026-01-01T00:00:13", "2026-01-01T00:01:00", "2026-01-01T00:02:00", "gres/gpu=1"),
        record("8", "FAILED", "2026-01-01T00:00:00", "2026-01-01T00:00:01", "2026-01-01T00:00:02", "gres/gpu=1", node="t4-02"),
        record("10", "COMPLETED", "2026-01-01T00:00:03", "2026-01-01T00:00:04", "2026-01-01T00:00:30", "gres/gpu=1"),
    ])
    rows = [r for r in parse_sacct_output(text_to_json(text)) if isinstance(r, JobRecord)]
    retries = {"7": "9", "8": "10"}
    jobs = {job_id: job(gpus=1, mem_used_gib_per_gpu=30.0) for job_id in ("7", "8", "9", "10")}
    misfits = fit_failures(rows, retries, jobs, {"a100-01": 80.0, "t4-02": 16.0}, {"a100": 80, "t4": 16})
    assert misfits == {"7"}
    # Against what the simulated GPUs hold: a t4 has 15 GiB, so a 15.6 GiB job fails there alone.
    shape = SimpleNamespace(nodes=[SimpleNamespace(name="a100-01", gpu=SimpleNamespace(gres_type="a100")),
                                   SimpleNamespace(name="t4-02", gpu=SimpleNamespace(gres_type="t4"))])
    assert simulated_memory_gib(shape) == {"a100-01": 80.0, "t4-02": 15.0}
    alone = {job_id: job(gpus=1, mem_used_gib_per_gpu=15.6) for job_id in ("7", "8")}
    assert fit_failures(rows, retries, alone, simulated_memory_gib(shape), {"a100": 80, "t4": 16}) == {"7"}
    seven, eight = merge_retries(outcomes_from_records(rows, {}, {"a100": 80, "t4": 16}), retries, misfits)
    end = seven.submit_ts + 600
    assert harmed_by(seven, end) and not harmed_by(eight, end)


def test_a_gpu_asked_as_all_of_its_shards_is_a_whole_gpu_not_a_shared_one() -> None:
    # On Slurm 22.05 the hook asks for a whole GPU as all of its shards (rewrites.whole_as_shards):
    # such a job shares nothing, so it stays out of the shared jobs' slowdown, and one that failed
    # out of memory where its job fits lost that memory to a neighbour Slurm put there: harmed.
    text = sacct_text([
        record("7", "FAILED", "2026-01-01T00:00:00", "2026-01-01T00:00:10", "2026-01-01T00:00:12", "gres/shard=80", node="a100-01"),
        record("9", "COMPLETED", "2026-01-01T00:00:13", "2026-01-01T00:01:00", "2026-01-01T00:02:00", "gres/shard=80", node="a100-01"),
        record("8", "COMPLETED", "2026-01-01T00:00:00", "2026-01-01T00:00:01", "2026-01-01T00:01:02", "gres/shard=8", node="t4-02"),
        record("10", "COMPLETED", "2026-01-01T00:00:00", "2026-01-01T00:00:04", "2026-01-01T00:01:30", "gres/shard=16", node="t4-02"),
    ])
    rows = [r for r in parse_sacct_output(text_to_json(text)) if isinstance(r, JobRecord)]
    per_gpu = {"a100": 80, "t4": 16}
    shared = {o.job_id: o.shared for o in outcomes_from_records(rows, {}, per_gpu)}
    assert shared == {"7": False, "9": False, "8": True, "10": False}
    jobs = {job_id: job(gpus=1, mem_used_gib_per_gpu=30.0) for job_id in ("7", "9")}
    assert fit_failures(rows, {"7": "9"}, jobs, {"a100-01": 80.0}, per_gpu) == {"7"}
    eight = next(r for r in rows if r.job_id == "8")
    assert shares_a_gpu(eight.tres, per_gpu, eight.node_list)
    assert shares_a_gpu(eight.tres, {}, eight.node_list)  # an unknown type: shared, as any shard job was


def test_an_idle_tail_jobs_work_counts_once_its_busy_phases_are_past() -> None:
    tail = job(gpus=1, profile=(Phase("loading", 10), Phase("busy", 30), Phase("idle", 60)), requeue_profile=())
    assert work_end_s(tail) == 40 and work_end_s(job()) is None
    assert work_end_s(job(profile=(Phase("busy", 30), Phase("idle", 60)), requeue_profile=(Phase("busy", 30),))) is None
