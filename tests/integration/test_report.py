"""`slurm-aigc report` on the local cluster: the figures match what tagged jobs really did.

Each job script stamps its own start and end (`date +%s.%N`) around its workload, so the
truth is measured inside the job, not read back from Slurm. GPU-hours must agree within
one agent poll interval (10 s) per GPU.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from slurm_aigc.errors import SlurmCommandError
from slurm_aigc.report.sacct import aigc_class_of
from slurm_aigc.slurm import JobInfo
from tests.conftest import SLURM_AIGC_BIN, ClusterHandle
from tests.integration.helpers import (
    TERMINAL_STATES,
    cancel_quietly,
    job_output,
    submit,
    wait_for,
)

pytestmark = pytest.mark.cluster

POLL_INTERVAL_S = 10.0
SHARDS_PER_GPU = {"a100": 80, "t4": 16}
STAMP = 'echo "AIGC_T0=$(date +%s.%N)"\n{work}\necho "AIGC_T1=$(date +%s.%N)"\n'
GPU_WORK = f"{SLURM_AIGC_BIN} gpu-load --util 50 --mem 4G --seconds 20"
HTML_COPY = Path("/tmp/slurm-aigc-report-integration.html")


def measured_s(job_id: str) -> float:
    text = job_output(job_id)
    t0 = float(re.search(r"AIGC_T0=([\d.]+)", text).group(1))  # type: ignore[union-attr]
    t1 = float(re.search(r"AIGC_T1=([\d.]+)", text).group(1))  # type: ignore[union-attr]
    return t1 - t0


def wait_completed(cluster: ClusterHandle, job_id: str, timeout_s: float = 180) -> JobInfo:
    """Like helpers.wait_job_state(..., "COMPLETED"), riding out a slurmctld that other
    sessions restart (scontrol then fails for a moment with a socket error)."""

    def completed() -> JobInfo | None:
        try:
            job = cluster.slurm.job(job_id)
        except SlurmCommandError:
            return None
        if job is not None and job.state.split()[0] in TERMINAL_STATES - {"COMPLETED"}:
            raise AssertionError(f"job {job_id} ended {job.state}")
        return job if job is not None and job.state.split()[0] == "COMPLETED" else None

    return wait_for(completed, timeout_s, f"job {job_id} to complete")


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SLURM_AIGC_BIN, "report", *args], capture_output=True, text=True, timeout=120, check=False)


def gpus_of(gres: str, node: str) -> float:
    if gres.startswith("gpu:"):
        return float(gres.rsplit(":", 1)[1])
    if gres.startswith("shard:"):
        return int(gres.split(":")[1]) / SHARDS_PER_GPU[node.split("-")[0]]
    return 0.0


def test_report_figures_match_the_jobs(cluster: ClusterHandle, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    since = (datetime.now() - timedelta(seconds=5)).replace(microsecond=0)
    plan = [  # (name, gres, comment, workload)
        (f"rep-{tag}-train", "gpu:a100:2", "aigc:type=train", GPU_WORK),
        (f"rep-{tag}-infer", "gpu:t4:1", "aigc:type=infer", GPU_WORK),
        (f"rep-{tag}-shard", "shard:20", "aigc:type=infer,vram=20G", GPU_WORK),
        (f"rep-{tag}-cpu", "", "", "sleep 5"),
    ]
    ids: list[str] = []
    try:
        for name, gres, comment, work in plan:
            args = [f"--job-name={name}"] + ([f"--gres={gres}"] if gres else []) + ([f"--comment={comment}"] if comment else [])
            ids.append(submit(cluster, STAMP.format(work=work), *args, user=None))
        finished = [wait_completed(cluster, job_id) for job_id in ids]
    finally:
        cancel_quietly(cluster, *ids)

    truth_by_class: dict[str, float] = {}
    truth_by_type: dict[str, float] = {}
    gpus_total = 0.0
    for (name, gres, _, _), job_id, job in zip(plan, ids, finished, strict=True):
        seconds = measured_s(job_id)
        assert seconds >= (18 if gres else 4), f"{name}: workload ran only {seconds:.1f} s"
        gpus = gpus_of(gres, job.node_list)
        gpus_total += gpus
        cls = aigc_class_of(job.admin_comment)
        truth_by_class[cls] = truth_by_class.get(cls, 0.0) + gpus * seconds / 3600
        if gpus:
            gpu_type = job.node_list.split("-")[0]
            truth_by_type[gpu_type] = truth_by_type.get(gpu_type, 0.0) + gpus * seconds / 3600
    assert aigc_class_of(finished[0].admin_comment) == "train"  # the hook's stamp
    assert aigc_class_of(finished[1].admin_comment) == "infer"
    tolerance_h = POLL_INTERVAL_S * max(gpus_total, 1.0) / 3600

    db = f"sqlite:///{tmp_path}/state.db"
    common = ["--since", since.isoformat(), "--until", "now", "--name", ",".join(n for n, *_ in plan), "--db", db]

    def settled() -> dict[str, object] | None:
        # slurmdbd learns of job ends a moment after slurmctld: wait until sacct has them.
        result = report(*common, "--group-by", "class", "--format", "json")
        if result.returncode != 0 and "Connection" in result.stderr:
            return None  # slurmdbd restarted by another session: try again
        assert result.returncode == 0, result.stderr
        data: dict[str, object] = json.loads(result.stdout)
        total = data["total"]
        assert isinstance(total, dict)
        return data if total["jobs"] == len(plan) and total["running_jobs"] == 0 else None

    data = wait_for(settled, 60, "sacct to list every job as finished")
    groups = {g["group"]["class"]: g for g in data["groups"]}  # type: ignore[attr-defined]
    assert set(groups) == set(truth_by_class)
    for cls, truth_h in truth_by_class.items():
        assert groups[cls]["gpu_hours_allocated"] == pytest.approx(truth_h, abs=tolerance_h), cls
    assert data["skipped"] == []
    assert sum(g["jobs"] for g in groups.values()) == len(plan)
    assert groups["train"]["whole_gpu_jobs"] == 1 and groups["infer"]["shard_jobs"] == 1

    by_type = json.loads(report(*common, "-g", "gpu_type", "--format", "json").stdout)
    types = {g["group"]["gpu_type"]: g for g in by_type["groups"]}
    for gpu_type, truth_h in truth_by_type.items():
        assert types[gpu_type]["gpu_hours_allocated"] == pytest.approx(truth_h, abs=tolerance_h), gpu_type
    assert types["none"]["jobs"] == 1 and types["none"]["gpu_hours_allocated"] == 0.0

    table = report(*common, "-g", "class,user")
    assert table.returncode == 0 and "train" in table.stdout and "TOTAL" in table.stdout
    csv_out = report(*common, "-g", "class", "--format", "csv")
    assert csv_out.returncode == 0 and csv_out.stdout.splitlines()[0].startswith("class,jobs,")
    html_path = tmp_path / "report.html"
    html = report(*common, "-g", "class,gpu_type", "--format", "html", "--output", str(html_path))
    assert html.returncode == 0, html.stderr
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html_path.read_text())
    assert len(images) == 3 and all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    shutil.copy(html_path, HTML_COPY)  # for a look in a headless browser

    view = report("job", ids[0], "--format", "json", "--db", db)
    assert view.returncode == 0, view.stderr
    job_data = json.loads(view.stdout)
    assert job_data["gpu_type"] == "a100" and job_data["gpus"] == 2
    assert job_data["gpu_hours_allocated"] == pytest.approx(2 * measured_s(ids[0]) / 3600, abs=tolerance_h)


AGENT_YAML = """agent:
  backend: sim
  simgpu_dir: {simgpu}
  interval_s: {interval}
  publish_features: false
"""
AGENT_INTERVAL_S = 2.0


def test_used_gpu_hours_come_from_the_agents_samples(cluster: ClusterHandle, tmp_path: Path) -> None:
    """A job loading 2 GPUs at 50 % for 30 s used 0.5 x its GPU time, per the agent's samples."""
    node = next(n for n in cluster.nodes if n.startswith("t4"))
    db = f"sqlite:///{tmp_path}/state.db"
    config = tmp_path / "agent.yaml"
    config.write_text(AGENT_YAML.format(simgpu=cluster.simgpu_dir, interval=AGENT_INTERVAL_S))
    log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen([SLURM_AIGC_BIN, "agent", "--config", str(config), "--node", node, "--db", db],
                             stdout=log, stderr=subprocess.STDOUT)
    name = f"rep-{uuid.uuid4().hex[:8]}-load"
    since = (datetime.now() - timedelta(seconds=5)).replace(microsecond=0)
    job_id = ""
    try:
        wait_for(lambda: (tmp_path / "state.db").exists(), 30, "the agent to create its database")
        work = f"{SLURM_AIGC_BIN} gpu-load --util 50 --mem 4G --seconds 30"
        job_id = submit(cluster, STAMP.format(work=work), f"--job-name={name}", "--gres=gpu:t4:2", f"--nodelist={node}",
                        "--comment=aigc:type=train", user=None)
        wait_completed(cluster, job_id)
    finally:
        if job_id:
            cancel_quietly(cluster, job_id)
        agent.terminate()  # our own agent process, by its handle
        agent.wait(timeout=30)
        log.close()
    loaded_s = measured_s(job_id)
    assert loaded_s >= 28

    def settled() -> dict[str, object] | None:
        result = report("--since", since.isoformat(), "--until", "now", "--name", name, "--db", db, "--format", "json")
        if result.returncode != 0 and "Connection" in result.stderr:
            return None  # slurmdbd restarted by another session: try again
        assert result.returncode == 0, result.stderr
        total: dict[str, object] = json.loads(result.stdout)["total"]
        return total if total["jobs"] == 1 and total["running_jobs"] == 0 else None

    total = wait_for(settled, 60, "sacct to list the job as finished")
    tolerance_h = 2 * AGENT_INTERVAL_S * 2 / 3600
    assert total["gpu_hours_used"] == pytest.approx(0.5 * 2 * loaded_s / 3600, abs=tolerance_h)
    assert total["jobs_without_samples"] == 0
    assert 0.35 <= float(total["efficiency"]) <= 0.55  # type: ignore[arg-type]
    view = json.loads(report("job", job_id, "--format", "json", "--db", db).stdout)
    assert len(view["gpus_series"]) == 2
    assert all(45 <= s["mean_util_pct"] <= 55 for s in view["gpus_series"])
