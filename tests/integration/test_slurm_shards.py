"""What Slurm itself does with gres/shard beside whole-GPU jobs, on the version the cluster runs.

slurm-aigc puts shard jobs and whole-GPU jobs on the same nodes, and counts on Slurm never to
give a GPU whole while a shard job still holds part of it. Slurm 22.05.8 (Debian 12) breaks
that once one of two shard jobs on a GPU ends: the GPU is then given whole to the next job
while the other shard job still runs on it (found tracing the whole-GPU out-of-memory failures
of the backlogged replays, docs/benchmarks.md). 24.11.5 (Debian 13) keeps the GPU until the
last shard job ends. The first test is an expected failure on 22.05, strictly: a 22.05 build
that fixes it fails the run, so the note in docs/hook.md gets revisited. The second shows the
mitigation on 22.05: the controller requeues the shard job (reclaim/gpuconflict.py), once the
two fill the GPU's memory, or at once when the whole-GPU job asked `share=no`.
"""

from __future__ import annotations

from typing import Any

import pytest

from slurm_aigc.policy.install import install_hook
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.reclaim.store import ActionRow
from slurm_aigc.tags import trusted_share_no
from tests.conftest import SLURM_AIGC_BIN
from tests.integration.helpers import allocated_gpu_indices, submit, wait_for, wait_job_state
from tests.integration.test_memguard import MEMGUARD_POLICY
from tests.integration.test_reclaim import Reclaim, finished, reclaim, running

pytestmark = pytest.mark.cluster
__all__ = ["reclaim"]  # the fixture, used by name

SLEEP = "sleep 120\n"


def shard_jobs_left(cluster: Any, jobs: list[str], script: str = SLEEP, *requeue: str,
                    user: str | None = "aigc-alice", sharing: int = 2) -> tuple[str, str, list[str], list[int]]:
    """A t4 node with every GPU taken whole but one, which `sharing` shard jobs running `script`
    share (8 shards each for two, 5 for three); then the last of those ends. Returns (node,
    whole-GPU gres, the shard jobs left, the GPU indices they hold)."""
    node = next(n for n in cluster.local.shape().nodes if n.gpu.gres_type == "t4")
    gres = f"gpu:{node.gpu.gres_type}:1"
    for _ in range(node.gpu_count - 1):
        jobs.append(submit(cluster, SLEEP, f"--gres={gres}", f"--nodelist={node.name}"))
        wait_job_state(cluster, jobs[-1], "RUNNING", timeout_s=60)
    shards = node.shards_per_gpu // sharing
    shard_jobs = [submit(cluster, script, f"--gres=shard:{shards}", f"--nodelist={node.name}", *requeue, user=user)
                  for _ in range(sharing)]
    jobs.extend(shard_jobs)
    for job_id in shard_jobs:
        wait_job_state(cluster, job_id, "RUNNING", timeout_s=60)
    shared = allocated_gpu_indices(cluster, shard_jobs[0])
    assert all(allocated_gpu_indices(cluster, job_id) == shared for job_id in shard_jobs)
    cluster.slurm.cancel(shard_jobs[-1])
    wait_for(lambda: (gone := cluster.slurm.job(shard_jobs[-1])) is None or gone.state not in ("RUNNING", "COMPLETING"),
             60, "the cancelled shard job to end")
    return node.name, gres, shard_jobs[:-1], shared


@pytest.mark.parametrize("sharing", [2, 3])
def test_a_gpu_still_holding_a_shard_job_is_never_given_whole(cluster: Any, jobs: list[str], sharing: int,
                                                               request: pytest.FixtureRequest) -> None:
    # Three sharing: 22.05 gives the GPU whole beside the two left, which is why the hook lets at
    # most two share a GPU there (fewest_shards in job_submit_lua/aigc_hook.lua).
    if cluster.slurm.version()[:2] == (22, 5):
        request.applymarker(pytest.mark.xfail(strict=True, raises=AssertionError, reason="Slurm 22.05 gives a GPU whole once one of its "
                                              "shard jobs ends (docs/hook.md)"))
    node, gres, (shard_job, *_), shared = shard_jobs_left(cluster, jobs, sharing=sharing)
    newcomer = submit(cluster, SLEEP, f"--gres={gres}", f"--nodelist={node}")
    jobs.append(newcomer)
    # The node has no free GPU: Slurm must try the job and leave it pending for Resources.
    info = wait_for(lambda: decided(cluster, newcomer), 60, f"the scheduler to decide on job {newcomer}")
    assert info.state == "PENDING", (
        f"job {newcomer} got GPU(s) {allocated_gpu_indices(cluster, newcomer)} while shard job {shard_job} "
        f"still holds GPU {shared}")


def test_a_gpu_asked_as_all_of_its_shards_is_kept_apart_on_every_release(cluster: Any, jobs: list[str]) -> None:
    """What Slurm keeps right where the defect above bites (measured on 22.05.8, 2026-12-06): a
    one-GPU job asking for the GPU as all of its shards waits while a shard job holds part of
    every free GPU (shards of one job are never split over GPUs), gets the GPU once that job
    ends, and a whole-GPU job is never given a GPU it holds. The ground for a mitigation of the
    defect on 22.05 (docs/hook.md): `rewrites.whole_as_shards`, the next test."""
    node, gres, (shard_job, *_), shared = shard_jobs_left(cluster, jobs)
    per_gpu = next(n for n in cluster.local.shape().nodes if n.name == node).shards_per_gpu
    newcomer = submit(cluster, SLEEP, f"--gres=shard:{per_gpu}", f"--nodelist={node}")
    jobs.append(newcomer)
    info = wait_for(lambda: decided(cluster, newcomer), 60, f"the scheduler to decide on job {newcomer}")
    assert info.state == "PENDING", f"job {newcomer} got {allocated_gpu_indices(cluster, newcomer)} beside {shard_job}"
    cluster.slurm.cancel(shard_job)
    wait_job_state(cluster, newcomer, "RUNNING", timeout_s=60)
    assert allocated_gpu_indices(cluster, newcomer) == shared
    whole = submit(cluster, SLEEP, f"--gres={gres}", f"--nodelist={node}")
    jobs.append(whole)
    info = wait_for(lambda: decided(cluster, whole), 60, f"the scheduler to decide on job {whole}")
    assert info.state == "PENDING", f"job {whole} got GPU {allocated_gpu_indices(cluster, whole)} held as shards"


def test_through_the_hook_a_whole_gpu_job_never_lands_beside_a_shard_job(cluster: Any, jobs: list[str]) -> None:
    """The hook rendered for the cluster's own Slurm, as `policy install` renders it: on 22.05
    `rewrites.whole_as_shards` asks for a 13 GiB fine-tune's t4 as all of its shards, which
    Slurm keeps off the GPU a shard job still holds (where `gpu:t4:1` got it, the expected
    failure above); 24.11 keeps the GPU by itself and the request stays `gpu:t4:1`."""
    node, gres, (shard_job, *_), shared = shard_jobs_left(cluster, jobs)
    version = cluster.slurm.version()
    install_hook(render_hook(load_policy(shipped_policy()), slurm_version=version), cluster.etc_dir)
    try:
        newcomer = submit(cluster, SLEEP, f"--gres={gres}", f"--nodelist={node}",
                          "--comment=aigc:type=finetune,vram=13G")
    finally:
        install_hook(render_hook(load_policy(shipped_policy())), cluster.etc_dir)
    jobs.append(newcomer)
    info = wait_for(lambda: decided(cluster, newcomer), 60, f"the scheduler to decide on job {newcomer}")
    per_gpu = next(n for n in cluster.local.shape().nodes if n.name == node).shards_per_gpu
    asked = f"shard:{per_gpu}" if version[:2] < (24, 11) else gres
    assert asked in info.tres_per_node, info.tres_per_node
    assert info.state == "PENDING", (
        f"job {newcomer} ({info.tres_per_node}) got GPU(s) {allocated_gpu_indices(cluster, newcomer)} while shard "
        f"job {shard_job} still holds GPU {shared}")
    cluster.slurm.cancel(shard_job)
    wait_job_state(cluster, newcomer, "RUNNING", timeout_s=60)
    assert allocated_gpu_indices(cluster, newcomer) == shared


def decided(cluster: Any, job_id: str) -> Any:
    """The job once Slurm has started it or left it pending for Resources, else None."""
    info = cluster.slurm.job(job_id)
    return info if info is not None and (info.state != "PENDING" or info.reason == "Resources") else None


def load(mem: str) -> str:
    """A job keeping `mem` of its GPU's memory, computing at 40 % (as root: see test_reclaim)."""
    return f"{SLURM_AIGC_BIN} gpu-load --profile busy --util 40 --mem {mem} --seconds 0\n"


def given_whole_beside(reclaim: Reclaim, jobs: list[str], shard_mem: str, newcomer_script: str,
                       *newcomer_args: str, user: str | None, sharing: int = 2) -> tuple[str, str, list[str], str]:
    """Shard jobs each keeping `shard_mem` of a t4 GPU (`sharing` - 1 of them left) that Slurm
    22.05 then gives whole to a new job (skips elsewhere). Returns (node, whole-GPU gres, the
    shard jobs, the new job)."""
    cluster = reclaim.cluster
    if cluster.slurm.version()[:2] != (22, 5):
        pytest.skip(f"Slurm {cluster.slurm.version()} keeps the GPU until its last shard job ends: no conflict")
    reclaim.policy.write_text(MEMGUARD_POLICY)  # with the inventory: a t4's 16 GiB
    node, gres, left, shared = shard_jobs_left(cluster, jobs, load(shard_mem), "--requeue", user=None, sharing=sharing)
    newcomer = submit(cluster, newcomer_script, f"--gres={gres}", f"--nodelist={node}", *newcomer_args, user=user)
    jobs.append(newcomer)
    running(reclaim, newcomer)
    assert allocated_gpu_indices(cluster, newcomer) == shared, "the defect did not reproduce"
    return node, gres, left, newcomer


def requeued_for_the_conflict(reclaim: Reclaim, shard_job: str, newcomer: str, *more: str) -> ActionRow:
    """The controller requeues the shard job (and `more`) and leaves the whole-GPU job running;
    the shard job's audit row."""
    # Only the shard jobs in the controller's scope (`--job`); the conflict is read from the whole listing.
    shard_jobs = (shard_job, *more)
    reclaim.tick_until(shard_jobs, lambda: all(finished(reclaim.actions(j), "requeue") for j in shard_jobs), 60,
                       f"shard jobs {shard_jobs} to be requeued")
    for job_id in shard_jobs:
        rows = reclaim.actions(job_id)
        assert [(r.verdict, r.action, r.state) for r in rows] == [("gpu_conflict", "requeue", "done")], [r.detail for r in rows]
    kept = reclaim.cluster.slurm.job(newcomer)
    assert kept is not None and (kept.state, kept.restarts) == ("RUNNING", 0)
    return reclaim.actions(shard_job)[0]


def test_the_controller_requeues_the_shard_job_on_a_gpu_given_whole(reclaim: Reclaim, jobs: list[str]) -> None:
    """Where Slurm does give the GPU whole (22.05), the controller requeues the shard job once
    the two fill the GPU's memory (7 + 8 of 16 GiB, past the default 90 %), and leaves the
    whole-GPU job running; Slurm's accounting is then right again."""
    cluster = reclaim.cluster
    node, gres, (shard_job,), newcomer = given_whole_beside(reclaim, jobs, "7G", load("8G"), user=None)
    requeued_for_the_conflict(reclaim, shard_job, newcomer)
    assert wait_job_state(cluster, shard_job, ("PENDING", "RUNNING"), timeout_s=30).restarts == 1
    # The node is full again in Slurm's eyes: one more whole-GPU job waits for Resources.
    late = submit(cluster, SLEEP, f"--gres={gres}", f"--nodelist={node}")
    jobs.append(late)
    assert wait_for(lambda: decided(cluster, late), 60, f"the scheduler to decide on job {late}").state == "PENDING"


def test_a_whole_gpu_job_that_asked_share_no_gets_its_gpu_to_itself(reclaim: Reclaim, jobs: list[str]) -> None:
    """A shard job keeping 3 of 16 GiB is far under the 90 % rule, but the job Slurm gave the
    GPU whole asked `aigc:share=no`: the hook stamps that at submit, and the controller requeues
    the shard job without waiting for memory to run short."""
    install_hook(render_hook(load_policy(shipped_policy())), reclaim.cluster.etc_dir)  # the hook writes the stamp
    _, _, (shard_job,), newcomer = given_whole_beside(reclaim, jobs, "3G", SLEEP, "--comment=aigc:share=no",
                                                      user="aigc-alice")
    stamped = reclaim.cluster.slurm.job(newcomer)
    assert stamped is not None and trusted_share_no(stamped.admin_comment), stamped
    assert "asked share=no" in requeued_for_the_conflict(reclaim, shard_job, newcomer).detail["message"]


def test_two_shard_jobs_left_beside_a_gpu_given_whole_are_counted_together(reclaim: Reclaim, jobs: list[str]) -> None:
    """Three shard jobs shared a t4 and one ended: 22.05 gave the GPU whole beside the two left.
    Each of them fits beside the whole-GPU job (5 + 5 of 16 GiB), the three do not (15 GiB, past
    90 %): the controller counts every job on the GPU and requeues both shard jobs."""
    _, _, left, newcomer = given_whole_beside(reclaim, jobs, "5G", load("5G"), user=None, sharing=3)
    assert len(left) == 2
    row = requeued_for_the_conflict(reclaim, *left[:1], newcomer, *left[1:])
    assert "use 15.0 of its 16 GiB" in row.detail["message"], row.detail
