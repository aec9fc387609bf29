"""Helpers for integration tests: submit jobs and wait for conditions with deadlines."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from slurm_aigc.errors import SlurmCommandError
from slurm_aigc.policy.install import install_hook
from slurm_aigc.policy.loader import load_policy, parse_policy_text
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.slurm import JobInfo
from slurm_aigc.telemetry.gres import gres_indices

T = TypeVar("T")

# Job ids restart at 1 after `cluster down --purge`, and /tmp is sticky: an old job's output file
# of another user would make the new job's stdout unopenable. One prefix per test session.
OUTPUT_PREFIX = f"/tmp/slurm-aigc-test-{os.getpid()}-{int(time.time())}"

TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def submit(cluster: object, script_text: str, *sbatch_args: str, user: str | None = "aigc-alice") -> str:
    """sbatch SCRIPT (as `user`; None = root); output goes to OUTPUT_PREFIX-%j.out."""
    args = ["--chdir=/tmp", f"--output={OUTPUT_PREFIX}-%j.out", *sbatch_args]
    if not script_text.startswith("#!"):
        script_text = "#!/bin/bash\n" + script_text
    return cluster.slurm.submit(args, script_text, user=user)  # type: ignore[attr-defined, no-any-return]


def wait_for(predicate: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.5) -> T:
    """Poll `predicate` until it returns a truthy value; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def wait_job_state(cluster: object, job_id: str, states: Iterable[str] | str, timeout_s: float = 60) -> JobInfo:
    """Wait until the job's state (first word, e.g. RUNNING) is one of `states`."""
    wanted = {states} if isinstance(states, str) else set(states)

    def current() -> JobInfo | None:
        try:
            job = cluster.slurm.job(job_id)  # type: ignore[attr-defined]
        except SlurmCommandError:
            return None  # slurmctld busy for a moment (other tests share it): ask again
        return job if job is not None and job.state.split()[0] in wanted else None

    return wait_for(current, timeout_s, f"job {job_id} to reach {sorted(wanted)}")


def job_output(job_id: str) -> str:
    with open(f"{OUTPUT_PREFIX}-{job_id}.out") as handle:
        return handle.read()


def cancel_quietly(cluster: object, *job_ids: str) -> None:
    for job_id in job_ids:
        try:
            cluster.slurm.cancel(job_id)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - cleanup must not hide the test's own failure
            pass



def gpu_indices_of_job(job: JobInfo | None) -> list[int]:
    """GPU indices of a one-node job, from its `gres_detail` via the product's parser.

    Both detail forms: `gpu:a100:2(IDX:3-4)` and `shard:8(IDX:1)` (22.05), and the used/total
    pair per GPU that 24.05+ print for shards, `shard:8(8/16,0/16,0/16,0/16)`.
    """
    assert job is not None and len(job.gres_detail) == 1, f"not a one-node GPU job: {job}"
    indices = sorted(gres_indices(job.gres_detail[0][1]))
    assert indices, f"no GPU indices in {job.gres_detail}"
    return indices


def allocated_gpu_indices(cluster: object, job_id: str) -> list[int]:
    """`scontrol -d show job JOB` (as `SlurmCli.job` reads it): the GPU indices the job holds."""
    return gpu_indices_of_job(cluster.slurm.job(job_id))  # type: ignore[attr-defined]


@contextmanager
def hook_with_policy(cluster: Any, document: dict[str, Any], policy_file: Path) -> Iterator[Path]:
    """slurmctld's hook rendered from `document` (written to `policy_file`, yielded); the
    shipped policy's hook is installed again afterwards, so later tests see the default."""
    policy_file.write_text(yaml.safe_dump(document))
    install_hook(render_hook(parse_policy_text(policy_file.read_text(), str(policy_file))), cluster.etc_dir)
    try:
        yield policy_file
    finally:
        install_hook(render_hook(load_policy(shipped_policy())), cluster.etc_dir)
