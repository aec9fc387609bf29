"""Hostile job names, comments and work directories on the real cluster (issue 12, items 1 and 7).

aigc-alice writes Slurm's own syntax into every field she controls (`JobId=<bob's job>`,
`UserId=aigc-bob(1002)`, `Account=vip`, `JobState=RUNNING`, `GRES=gpu:a100:8(IDX:0-7)`), with
spaces, newlines, `|`, the ASCII unit separator, unicode and the longest text Slurm takes, and
changes her running job's comment the same way. `SlurmCli.jobs()/job()/nodes()` and the
report's sacct reader must still return each job's true id, user, account, state and GRES.

What Slurm 22.05.8 (with our job_submit hook) accepts, measured on this cluster:

| field              | newline | `|`, 0x1F, unicode, `Key=value` | longest accepted |
|--------------------|---------|---------------------------------|------------------|
| `--job-name`       | yes     | yes                             | 1024 (1025: "parameter too long"); sacct keeps 255 bytes |
| `--comment`        | yes     | yes                             | 1024 (1500: "parameter too long") |
| `--chdir` (workdir)| yes     | yes                             | a path            |
| `scontrol update Comment=` by the owner, running job | yes | yes | as `--comment` |
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from slurm_aigc.errors import SlurmCommandError
from slurm_aigc.report.sacct import JobRecord, SacctQuery, SacctReader
from slurm_aigc.slurm import JobInfo
from slurm_aigc.telemetry.gres import gres_busy_gpus, job_gpu_indices
from tests.conftest import ClusterHandle
from tests.integration.helpers import OUTPUT_PREFIX, TERMINAL_STATES, cancel_quietly, wait_for, wait_job_state

pytestmark = pytest.mark.cluster

SPOOF = "x JobId={victim} UserId=aigc-bob(1002) Account=vip JobState=RUNNING GRES=gpu:a100:8(IDX:0-7)"
US = "\x1f"


def hostile(victim: str, tag: str) -> list[tuple[str, str]]:
    """(name, comment) pairs, each a different way of breaking out of a field or a row."""
    spoof = SPOOF.format(victim=victim)
    return [
        (f"{tag} {spoof}", spoof),
        (f"{tag}\nJobId={victim} UserId=aigc-bob(1002)", f"c\n{victim}|{victim}|forged|aigc-bob|vip\n{spoof}"),
        (f"{tag}|{US}|ßü—🚀", f"{US}{victim}{US}aigc-bob{US}vip{US}\n|x|ü"),
        (((tag + " " + spoof + " ") * 60)[:1024], ((spoof + "\n| ") * 60)[:1024]),  # Slurm's limit: 1024 each
    ]


@pytest.fixture
def workdir() -> Iterator[str]:
    """A work directory named like Slurm fields, with a newline, `|` and unicode, owned by aigc-alice."""
    path = Path(f"/tmp/aigc hostile {uuid.uuid4().hex[:6]} JobId=1 UserId=aigc-bob(1002)|\nü")
    path.mkdir()
    shutil.chown(path, "aigc-alice")
    yield str(path)
    shutil.rmtree(path, ignore_errors=True)


def sbatch_as(cluster: ClusterHandle, user: str, *args: str, script: str = "#!/bin/bash\nsleep 120\n") -> str:
    return cluster.slurm.submit([f"--output={OUTPUT_PREFIX}-%j.out", *args], script, user=user)


def fetch(cluster: ClusterHandle, job_id: str) -> JobInfo:
    def read() -> JobInfo | None:
        try:
            return cluster.slurm.job(job_id)
        except SlurmCommandError:
            return None  # slurmctld busy for a moment (other tests share it)
    return wait_for(read, 30, f"job {job_id} in slurmctld")


def test_hostile_text_never_changes_who_a_job_is(cluster: ClusterHandle, workdir: str) -> None:
    tag = f"hostile-{uuid.uuid4().hex[:6]}"
    since = (datetime.now() - timedelta(seconds=5)).replace(microsecond=0)
    victim = sbatch_as(cluster, "aigc-bob", "--chdir=/tmp", "--hold", "-J", f"{tag}-victim")
    pairs = hostile(victim, tag)
    a100 = cluster.nodes_of_type("a100")[0]
    jobs: dict[str, tuple[str, str, str]] = {}  # id -> (name, comment, workdir)
    try:
        running = sbatch_as(cluster, "aigc-alice", f"--chdir={workdir}", "--gres=gpu:1", f"--nodelist={a100}",
                            "-J", pairs[0][0], f"--comment={pairs[0][1]}")
        jobs[running] = (pairs[0][0], pairs[0][1], workdir)
        for name, comment in pairs[1:]:
            held = sbatch_as(cluster, "aigc-alice", f"--chdir={workdir}", "--hold", "-J", name, f"--comment={comment}")
            jobs[held] = (name, comment, workdir)
        wait_job_state(cluster, running, "RUNNING", timeout_s=90)
        # The owner may rewrite a running job's comment: the same text once more.
        update = ["runuser", "-u", "aigc-alice", "--", "scontrol", "update", f"JobId={running}", f"Comment={pairs[1][1]}"]
        result = subprocess.run(update, capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 0, result.stderr
        jobs[running] = (pairs[0][0], pairs[1][1], workdir)

        by_id = {job.job_id: job for job in cluster.slurm.jobs() if job.job_id in {*jobs, victim}}
        assert sorted(by_id) == sorted({*jobs, victim})
        bob = by_id[victim]
        assert (bob.user, bob.account, bob.state, bob.name) == ("aigc-bob", "aigc", "PENDING", f"{tag}-victim")
        for job_id, (name, comment, directory) in jobs.items():
            for job in (by_id[job_id], fetch(cluster, job_id)):
                assert (job.job_id, job.user, job.account, job.name) == (job_id, "aigc-alice", "aigc", name)
                assert job.work_dir == directory
                assert job.comment.startswith(comment), (job.comment, comment)  # the hook may append its tag
                assert job.state == ("RUNNING" if job_id == running else "PENDING")
        check_gres(cluster, fetch(cluster, running), a100)
        assert cluster.slurm.job_state(running) == "RUNNING" and cluster.slurm.job_state(victim) == "PENDING"
    finally:
        cancel_quietly(cluster, victim, *jobs)
    check_sacct(cluster, since, jobs, victim)


def check_gres(cluster: ClusterHandle, job: JobInfo, node: str) -> None:
    """One GPU on `node`, the index Slurm gave it, also in the node's GresUsed; not the spoofed 0-7."""
    indices = job_gpu_indices(job, node)
    assert len(indices) == 1 and [name for name, _ in job.gres_detail] == [node], job.gres_detail
    assert "gres/gpu=1" in job.alloc_tres.split(",") and job.node_list == node
    (info,) = cluster.slurm.nodes([node])
    assert indices <= gres_busy_gpus(info.gres_used)[1]


def check_sacct(cluster: ClusterHandle, since: datetime, jobs: dict[str, tuple[str, str, str]], victim: str) -> None:
    """After the jobs ended: one record each, with the true user, account and text; nothing forged."""
    reader = SacctReader(cluster.slurm)
    query = SacctQuery(since=since, until=datetime.now() + timedelta(minutes=5), job_ids=(*jobs, victim))

    def ended() -> list[JobRecord] | None:
        rows = list(reader.rows(query))
        # Job ids restart after `cluster down --purge`: older jobs of the same id are not ours.
        records = [r for r in rows if isinstance(r, JobRecord) and (r.submit_ts or 0) >= since.timestamp()]
        done = all(isinstance(r, JobRecord) for r in rows) and {r.job_id for r in records} == {*jobs, victim}
        final = all(r.end_ts is not None and r.state in TERMINAL_STATES for r in records)
        # slurmdbd applies a job's start and end records asynchronously; on 22.05 with PrologFlags=Alloc
        # a job that started can read back as name `allocation` for a moment: wait for the final name.
        settled = all(r.name == jobs[r.job_id][0][:255] for r in records if r.job_id in jobs)
        return records if done and final and settled else None

    records = wait_for(ended, 60, "the cancelled jobs in sacct, with their true names")
    assert sorted(r.job_id for r in records) == sorted({*jobs, victim})  # no record added, none lost
    for record in records:
        want_user, want_name = ("aigc-bob", None) if record.job_id == victim else ("aigc-alice", jobs[record.job_id][0])
        assert (record.user, record.account, record.state) == (want_user, "aigc", "CANCELLED")
        if want_name is not None:
            # slurmdbd keeps 255 bytes of a job name (a `tinytext` column); the 1024-character one is ASCII.
            assert record.name == want_name[:255] and record.comment.startswith(jobs[record.job_id][1])
            assert record.tres.gpus in (0, 1)  # one GPU at most (held jobs never ran), never the spoofed 8
