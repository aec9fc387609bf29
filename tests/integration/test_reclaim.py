"""Reclaim on the real local cluster with simulated GPUs.

Jobs run `slurm-aigc gpu-load --profile ...` (as root: job users cannot run the
repository's venv); a background `slurm-aigc agent --backend sim` per node feeds a
per-test SQLite database; `slurm-aigc controller --once --no-dry-run --job J` runs with
a test policy of tiny windows (seconds). `--job` keeps the controller off the other
jobs sharing this cluster. Requeued jobs start again after ~11 s (cred_expire=10).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_aigc.db import open_database
from slurm_aigc.errors import AigcError
from slurm_aigc.policy.install import install_hook
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.paths import find_policy, shipped_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.reclaim.actuator import Actuator, ActuatorCrash
from slurm_aigc.reclaim.config import load_reclaim_config
from slurm_aigc.reclaim.controller import Controller
from slurm_aigc.reclaim.jobs import gpu_count
from slurm_aigc.reclaim.ladder import PlannedAction
from slurm_aigc.reclaim.store import ActionRow, ReclaimStore
from tests.conftest import SLURM_AIGC_BIN, ClusterHandle
from tests.integration.helpers import TERMINAL_STATES, cancel_quietly, job_output, submit, wait_for, wait_job_state

pytestmark = pytest.mark.cluster

POLICY = """\
agent: {backend: sim, interval_s: 1, publish_features: false}
reclaim:
  dry_run: true
  poll_interval_s: 1
  gap_intervals: 4
  stale_intervals: 15
  cooldown_s: 3
  max_actions_per_tick: 10
  max_actions_per_job: 6
  exempt: {classes: [interactive]}
  defaults:
    grace_s: 3
    window_s: 5
    min_samples: 3
    low_power_pct: 35          # the simulated hung T4 draws ~27 % of its limit
    ladder:
      idle: [notify, requeue]
      memory_held: [notify, requeue]
      fake_busy: [notify]
      over_allocated: [notify, shrink]
"""


@dataclass
class Reclaim:
    """A test's database, policy and background agents, and how to run the controller."""

    cluster: ClusterHandle
    db_url: str
    policy: Path
    agents: dict[str, subprocess.Popen[bytes]]
    log_dir: Path

    def feed(self, node: str) -> None:
        """Start the simulated-GPU agent of `node` (once per node) writing to this test's DB."""
        if node in self.agents:
            return
        log = (self.log_dir / f"agent-{node}.log").open("wb")
        self.agents[node] = subprocess.Popen(
            [SLURM_AIGC_BIN, "agent", "--config", str(self.policy), "--backend", "sim", "--node", node,
             "--simgpu-dir", str(self.cluster.simgpu_dir), "--db", self.db_url, "--interval", "1"],
            stdout=log, stderr=subprocess.STDOUT,
        )

    def controller(self, *job_ids: str, dry_run: bool = False) -> str:
        argv = [SLURM_AIGC_BIN, "controller", "--config", str(self.policy), "--db", self.db_url, "--once",
                "--dry-run" if dry_run else "--no-dry-run", "--no-publisher"]
        for job_id in job_ids:
            argv += ["--job", job_id]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        return done.stdout + done.stderr

    def actions(self, job_id: str) -> list[ActionRow]:
        return ReclaimStore(open_database(self.db_url)).audit(job_id=job_id)

    def tick_until(self, job_ids: tuple[str, ...], done: Callable[[], bool], timeout_s: float, what: str,
                   dry_run: bool = False) -> None:
        outputs: list[str] = []

        def step() -> bool:
            outputs.append(self.controller(*job_ids, dry_run=dry_run))
            return done()

        try:
            wait_for(step, timeout_s, what, interval_s=0.5)
        except AssertionError as error:
            raise AssertionError(f"{error}; last controller output:\n{outputs[-1] if outputs else ''}") from None


@pytest.fixture
def reclaim(cluster: ClusterHandle) -> Iterator[Reclaim]:
    # Not pytest's tmp_path: concurrent pytest sessions on this host prune each other's
    # numbered basetemp dirs, which would delete the database under a running test.
    work = Path(tempfile.mkdtemp(prefix="slurm-aigc-reclaim-test-"))
    policy = work / "policy.yaml"
    policy.write_text(POLICY)
    env = Reclaim(cluster, f"sqlite:///{work / 'state.db'}", policy, {}, work)
    try:
        yield env
    finally:
        for process in env.agents.values():
            process.terminate()
        for process in env.agents.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(work, ignore_errors=True)


def cancel(cluster: ClusterHandle, *job_ids: str) -> None:
    """scancel, repeated until Slurm shows every job ended: a lost scancel must not leak a job."""
    def all_ended() -> bool:
        cancel_quietly(cluster, *job_ids)
        states = [(job := cluster.slurm.job(j)) and job.state.split()[0] for j in job_ids]
        return all(state in (None, "") or state in TERMINAL_STATES for state in states)

    wait_for(all_ended, 60, f"jobs {', '.join(job_ids)} to end", interval_s=1.0)


def load_job(cluster: ClusterHandle, profile: str, *sbatch_args: str, mem: str = "4G") -> str:
    script = f"{SLURM_AIGC_BIN} gpu-load --profile {profile} --mem {mem} --seconds 0\n"
    return submit(cluster, script, f"--job-name=reclaim-{profile}", *sbatch_args, user=None)


def running(reclaim: Reclaim, job_id: str) -> str:
    """Wait for the job to run, start its node's agent; return the node."""
    job = wait_job_state(reclaim.cluster, job_id, "RUNNING", timeout_s=90)
    reclaim.feed(job.node_list)
    return job.node_list


def finished(rows: list[ActionRow], action: str) -> list[ActionRow]:
    return [r for r in rows if r.action == action and r.state != "intent"]


def test_idle_job_is_notified_then_requeued_and_runs_again(reclaim: Reclaim) -> None:
    cluster = reclaim.cluster
    job_id = load_job(cluster, "idle", "--gres=gpu:1", "--requeue")
    try:
        running(reclaim, job_id)
        reclaim.tick_until((job_id,), lambda: bool(finished(reclaim.actions(job_id), "requeue")), 90,
                           f"job {job_id} to be requeued")
        rows = reclaim.actions(job_id)
        assert [(r.action, r.state) for r in rows] == [("notify", "done"), ("requeue", "done")]
        assert rows[0].verdict in {"idle", "memory_held"}
        assert rows[0].ts_outcome is not None
        assert rows[1].ts_intent - rows[0].ts_outcome >= 3.0  # the cool-down between the steps
        job = cluster.slurm.job(job_id)
        assert job is not None and "aigc-reclaim:" in job.admin_comment
        again = wait_job_state(cluster, job_id, "RUNNING", timeout_s=90)
        assert again.restarts == 1
    finally:
        cancel(cluster, job_id)


def test_over_allocated_job_is_shrunk_and_restarts_with_one_gpu(reclaim: Reclaim) -> None:
    cluster = reclaim.cluster
    job_id = load_job(cluster, "over-allocated", "--gres=gpu:4", "--requeue")
    try:
        running(reclaim, job_id)
        reclaim.tick_until((job_id,), lambda: bool(finished(reclaim.actions(job_id), "shrink")), 120,
                           f"job {job_id} to be shrunk")
        shrink = finished(reclaim.actions(job_id), "shrink")[0]
        assert (shrink.state, shrink.verdict, shrink.gpus_before, shrink.gpus_after) == ("done", "over_allocated", 4, 1), shrink.detail
        again = wait_job_state(cluster, job_id, "RUNNING", timeout_s=90)
        assert (again.restarts, gpu_count(again)) == (1, 1)
    finally:
        cancel(cluster, job_id)


def test_interactive_and_no_requeue_jobs_are_never_requeued(reclaim: Reclaim) -> None:
    cluster = reclaim.cluster
    interactive = load_job(cluster, "idle", "--gres=gpu:1", "--comment=aigc:type=interactive")
    pinned = load_job(cluster, "idle", "--gres=gpu:1", "--no-requeue")
    try:
        running(reclaim, interactive)
        running(reclaim, pinned)
        # Notified, then past window + several cool-downs: the next step would have been a requeue.
        reclaim.tick_until((interactive, pinned), lambda: bool(finished(reclaim.actions(pinned), "notify")), 90,
                           f"job {pinned} to be notified")
        notified_at = reclaim.actions(pinned)[0].ts_outcome or 0.0
        reclaim.tick_until((interactive, pinned), lambda: time.time() > notified_at + 12, 60, "three cool-downs to pass")
        assert reclaim.actions(interactive) == []
        assert [r.action for r in reclaim.actions(pinned)] == ["notify"]
        for job_id in (interactive, pinned):
            job = cluster.slurm.job(job_id)
            assert job is not None and (job.state, job.restarts) == ("RUNNING", 0)
    finally:
        cancel(cluster, interactive, pinned)


def test_fake_busy_job_is_flagged(reclaim: Reclaim) -> None:
    cluster = reclaim.cluster
    job_id = load_job(cluster, "hung", "--gres=gpu:1")
    try:
        running(reclaim, job_id)
        reclaim.tick_until((job_id,), lambda: bool(finished(reclaim.actions(job_id), "notify")), 90,
                           f"job {job_id} to be flagged")
        [row] = reclaim.actions(job_id)
        assert (row.verdict, row.action, row.state) == ("fake_busy", "notify", "done")
        listed = subprocess.run([SLURM_AIGC_BIN, "idle", "list", "--config", str(reclaim.policy), "--db", reclaim.db_url,
                                 "--job", job_id], capture_output=True, text=True, timeout=60, check=True).stdout
        assert "fake_busy" in listed
    finally:
        cancel(cluster, job_id)


def test_controller_killed_between_intent_and_outcome_does_not_requeue_twice(reclaim: Reclaim) -> None:
    cluster = reclaim.cluster
    job_id = load_job(cluster, "idle", "--gres=gpu:1", "--requeue")
    try:
        running(reclaim, job_id)

        def requeue_then_die(plan: PlannedAction) -> None:
            if plan.action == "requeue":
                cluster.slurm.requeue(plan.job_id)  # the action ran ...
                raise ActuatorCrash("killed before the outcome was written")  # ... its outcome never recorded

        config = load_reclaim_config(reclaim.policy)
        store = ReclaimStore(open_database(reclaim.db_url))
        actuator = Actuator(cluster.slurm, store, config, after_intent=requeue_then_die)
        doomed = Controller(cluster.slurm, store, config, dry_run=False, actuator=actuator, only_jobs=frozenset({job_id}))

        def crashed() -> bool:
            try:
                doomed.tick()
            except ActuatorCrash:
                return True
            except AigcError:  # e.g. no samples yet before the agent's first poll
                return False
            return False

        wait_for(crashed, 90, f"the controller to crash while requeueing job {job_id}", interval_s=0.5)
        assert [(r.action, r.state) for r in reclaim.actions(job_id)] == [("notify", "done"), ("requeue", "intent")]
        # The restarted controller reconciles (restarts grew: done) and never requeues again.
        output = reclaim.controller(job_id)
        assert "done: requeue" in output, output
        for _ in range(5):
            reclaim.controller(job_id)
        rows = reclaim.actions(job_id)
        assert [(r.action, r.state) for r in rows] == [("notify", "done"), ("requeue", "done")]
        assert rows[1].detail.get("reconciled") is True
        job = cluster.slurm.job(job_id)
        assert job is not None and job.restarts == 1
    finally:
        cancel(cluster, job_id)


def test_dry_run_changes_nothing_in_slurm(reclaim: Reclaim) -> None:
    cluster = reclaim.cluster
    job_id = load_job(cluster, "idle", "--gres=gpu:1", "--requeue")
    try:
        running(reclaim, job_id)
        before = cluster.slurm.job(job_id)
        assert before is not None
        reclaim.tick_until((job_id,), lambda: bool(finished(reclaim.actions(job_id), "requeue")), 90,
                           f"a dry-run requeue of job {job_id}", dry_run=True)
        rows = reclaim.actions(job_id)
        assert [(r.action, r.state, r.dry_run) for r in rows] == [("notify", "skipped", True), ("requeue", "skipped", True)]
        assert rows[1].detail["commands"] == [f"scontrol requeue Incomplete {job_id}"]
        after = cluster.slurm.job(job_id)
        assert after is not None
        assert (after.state, after.restarts, after.admin_comment) == ("RUNNING", 0, before.admin_comment)
    finally:
        cancel(cluster, job_id)


def plan_for(job_id: str, action: str, restarts: int = 0, gpus_before: int = 1, gpus_after: int = 0) -> PlannedAction:
    verdict = "over_allocated" if action == "shrink" else "idle"
    return PlannedAction(f"{job_id}/r{restarts}/{verdict}/1:{action}", job_id, "aigc-alice", "aigc", "train", verdict,
                         action, 1, False, restarts, gpus_before, gpus_after, None, f"aigc-reclaim: job {job_id} {verdict}")


def test_a_job_that_completes_between_decision_and_requeue_is_not_run_again(cluster: ClusterHandle) -> None:
    # `scontrol requeue` alone also requeues a COMPLETED job on 22.05: the job would run twice.
    work = Path(tempfile.mkdtemp(prefix="slurm-aigc-requeue-test-"))
    store = ReclaimStore(open_database(f"sqlite:///{work / 'state.db'}"))
    config = load_reclaim_config(find_policy())
    jobs = [submit(cluster, f"sleep {seconds}\n", "--gres=gpu:1", "--requeue") for seconds in (3, 15)]
    try:
        decided = [wait_job_state(cluster, job_id, "RUNNING", timeout_s=90) for job_id in jobs]

        def ends_now(plan: PlannedAction) -> None:  # after the re-read, right before `scontrol requeue`
            wait_job_state(cluster, plan.job_id, "COMPLETED", timeout_s=60)

        # 1. It ends after the tick read it, before the re-read: skipped, nothing run.
        wait_job_state(cluster, jobs[0], "COMPLETED", timeout_s=60)
        early = Actuator(cluster.slurm, store, config).apply(plan_for(jobs[0], "requeue"), decided[0])
        assert early.state == "skipped" and "no longer RUNNING" in early.detail["skipped"]
        # 2. It ends between the re-read and the requeue: `requeue Incomplete` leaves it alone.
        late = Actuator(cluster.slurm, store, config, after_intent=ends_now).apply(plan_for(jobs[1], "requeue"), decided[1])
        assert late.state == "skipped" and "had ended" in late.detail["skipped"], late.detail
        assert late.commands == (f"scontrol requeue Incomplete {jobs[1]}",)
        for job_id in jobs:
            job = cluster.slurm.job(job_id)
            assert job is not None and (job.state, job.restarts) == ("COMPLETED", 0)
        assert [r.state for r in store.audit()] == ["skipped", "skipped"]
    finally:
        cancel(cluster, *jobs)
        shutil.rmtree(work, ignore_errors=True)


def output_so_far(job_id: str) -> str:
    """The job's output file, or "" before slurmstepd has created it."""
    try:
        return job_output(job_id)
    except FileNotFoundError:
        return ""


@contextmanager
def slow_epilog(cluster: ClusterHandle, seconds: int) -> Iterator[None]:
    """Test-only: every job's epilog takes `seconds` longer (the cluster's own Epilog still runs after)."""
    conf = cluster.etc_dir / "slurm.conf"
    original = conf.read_text()
    previous = next((line.split("=", 1)[1] for line in original.splitlines() if line.startswith("Epilog=")), None)
    script = Path(tempfile.mkdtemp(prefix="slurm-aigc-epilog-")) / "slow-epilog.sh"
    script.write_text(f"#!/bin/sh\nsleep {seconds}\n" + (f'exec {shlex.quote(previous)} "$@"\n' if previous else "exit 0\n"))
    script.chmod(0o755)
    lines = [line for line in original.splitlines() if not line.startswith("Epilog=")]
    conf.write_text("\n".join([*lines, f"Epilog={script}"]) + "\n")
    try:
        cluster.slurm.reconfigure()
        config_now = cluster.slurm.show_config()
        # 22.05 prints `Epilog = X`; 24.11 allows several and prints `Epilog[0] = X`.
        epilog = config_now.get("Epilog", config_now.get("Epilog[0]"))
        assert epilog == str(script), epilog
        yield
    finally:
        conf.write_text(original)
        cluster.slurm.reconfigure()
        shutil.rmtree(script.parent, ignore_errors=True)


def test_a_shrink_held_through_a_slow_epilog_ends_released_even_after_a_controller_restart(cluster: ClusterHandle) -> None:
    work = Path(tempfile.mkdtemp(prefix="slurm-aigc-shrink-test-"))
    store = ReclaimStore(open_database(f"sqlite:///{work / 'state.db'}"))
    config = load_reclaim_config(find_policy())
    job_id = ""
    try:
        with slow_epilog(cluster, 20):
            job_id = submit(cluster, "sleep 600\n", "--gres=gpu:a100:4", "--requeue")
            before = wait_job_state(cluster, job_id, "RUNNING", timeout_s=90)
            first = Actuator(cluster.slurm, store, config, pending_wait_s=3.0)
            result = first.apply(plan_for(job_id, "shrink", gpus_before=4, gpus_after=1), before)
            assert result.state == "intent" and "not PENDING" in result.detail["open"], result.detail
            held = cluster.slurm.job(job_id)
            assert held is not None and held.state == "COMPLETING" and held.restarts == 1
            del first  # the controller stops here; a new one takes over from the record
            restarted = Actuator(cluster.slurm, store, config)

            def settled() -> bool:
                return any(r.state != "intent" for r in restarted.reconcile()) or store.audit()[0].state != "intent"

            wait_for(settled, 90, f"the held shrink of job {job_id} to be finished")
        [row] = store.audit()
        assert row.state == "done", row.detail
        assert row.detail["update"] == {"Gres": "gpu:a100:1"}
        again = wait_job_state(cluster, job_id, "RUNNING", timeout_s=90)
        assert (again.restarts, gpu_count(again)) == (1, 1)
    finally:
        if job_id:
            cancel(cluster, job_id)
        shutil.rmtree(work, ignore_errors=True)


def test_signal_reaches_only_a_job_that_declared_it_handles_it(cluster: ClusterHandle) -> None:
    # SIGUSR1's default action ends a batch script that does not trap it: that job must not get it.
    work = Path(tempfile.mkdtemp(prefix="slurm-aigc-signal-test-"))
    store = ReclaimStore(open_database(f"sqlite:///{work / 'state.db'}"))
    config = load_reclaim_config(find_policy())
    trapping = "trap 'echo aigc-got-usr1' USR1\necho aigc-trap-set\nwhile true; do sleep 1; done\n"
    # The shipped hook, as rendered now: it stamps the owner's `aigc:signal=` into the AdminComment.
    install_hook(render_hook(load_policy(shipped_policy())), cluster.etc_dir)
    untrapped = submit(cluster, "sleep 600\n", "--gres=gpu:1", "--comment=aigc_signal=B.USR1")  # user text: nothing
    declared = submit(cluster, trapping, "--gres=gpu:1", "--comment=aigc:signal=B.USR1")
    try:
        for job_id in (untrapped, declared):
            wait_job_state(cluster, job_id, "RUNNING", timeout_s=90)
        # RUNNING comes before the script runs (the Prolog first, on 24.11 asynchronously): signal once the trap is set.
        wait_for(lambda: "aigc-trap-set" in output_so_far(declared), 60, f"job {declared} to set its trap")
        stamped = cluster.slurm.job(declared)
        assert stamped is not None and "aigc_signal=B.USR1" in stamped.admin_comment
        actuator = Actuator(cluster.slurm, store, config)
        for job_id in (untrapped, declared):
            job = cluster.slurm.job(job_id)
            assert job is not None
            actuator.apply(plan_for(job_id, "signal"), job)
        rows = {r.job_id: r for r in store.audit()}
        assert rows[untrapped].state == "skipped" and "did not declare" in rows[untrapped].detail["skipped"]
        assert rows[declared].state == "done", rows[declared].detail
        wait_for(lambda: "aigc-got-usr1" in output_so_far(declared), 30, f"job {declared} to trap SIGUSR1")
        for job_id in (untrapped, declared):
            job = cluster.slurm.job(job_id)
            assert job is not None and job.state == "RUNNING", (job_id, job and job.state)
    finally:
        cancel(cluster, untrapped, declared)
        shutil.rmtree(work, ignore_errors=True)


def test_two_controller_daemons_on_the_server_database_act_once_and_the_standby_takes_over(
        cluster: ClusterHandle, cluster_db: str) -> None:
    """A standby on a second host: two `slurm-aigc controller` daemons against the cluster's MariaDB
    (the multi-host path). One takes the reclaim lease and acts; the other asks Slurm nothing and
    acts on nothing until the first stops, then takes over (docs/deploy.md, leases)."""
    work = Path(tempfile.mkdtemp(prefix="slurm-aigc-lease-test-"))
    policy = work / "policy.yaml"
    policy.write_text(POLICY)
    env = Reclaim(cluster, cluster_db, policy, {}, work)
    job_id = load_job(cluster, "idle", "--gres=gpu:1", "--requeue")
    daemons: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> Path:
        log = work / f"controller-{name}.log"
        daemons[name] = subprocess.Popen(
            [SLURM_AIGC_BIN, "controller", "--config", str(policy), "--db", cluster_db, "--interval", "1",
             "--no-dry-run", "--no-publisher", "--job", job_id], stdout=log.open("wb"), stderr=subprocess.STDOUT)
        return log

    def acted(log: Path, action: str) -> bool:
        return f"done: {action} job {job_id}" in log.read_text()

    try:
        running(env, job_id)
        first = start("first")
        wait_for(lambda: "took the reclaim lease" in first.read_text(), 60, "the first controller to take the lease")
        second = start("second")
        wait_for(lambda: "standing by: the reclaim lease is held by" in second.read_text(), 60,
                 "the second controller to stand by")
        wait_for(lambda: bool(finished(env.actions(job_id), "requeue")), 90, f"job {job_id} to be requeued")
        assert [(r.action, r.state) for r in env.actions(job_id)] == [("notify", "done"), ("requeue", "done")]
        assert acted(first, "notify") and acted(first, "requeue")
        assert not acted(second, "notify") and not acted(second, "requeue")
        daemons["first"].terminate()  # a clean stop gives the lease back
        assert daemons["first"].wait(timeout=60) == 0
        wait_for(lambda: "took the reclaim lease" in second.read_text(), 30, "the standby to take over")
        # The requeued job's next run is idle too: the standby now walks its ladder.
        wait_job_state(cluster, job_id, "RUNNING", timeout_s=90)
        wait_for(lambda: acted(second, "notify"), 90, "the standby to notify the job's next run")
        assert [r.observation_key.split("/")[1] for r in env.actions(job_id)].count("r1") >= 1
    finally:
        for process in daemons.values():
            process.terminate()
        for process in daemons.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        for process in env.agents.values():
            process.terminate()
            process.wait(timeout=15)
        cancel(cluster, job_id)
        shutil.rmtree(work, ignore_errors=True)
