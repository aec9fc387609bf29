"""A short replay runs both ways on the real local cluster and produces every comparison figure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from slurm_aigc.localcluster.shape import shape_to_text
from tests.conftest import SLURM_AIGC_BIN, ClusterHandle

pytestmark = pytest.mark.cluster

FIGURES = ("makespan_s", "allocation_ratio", "effective_utilization", "mean_wait_s", "p95_wait_s", "waits",
           "jobs_per_hour", "gpu_hours_reclaimed", "jobs_harmed", "jobs_lost")


def test_short_replay_compare_completes_both_runs_with_every_figure(cluster: ClusterHandle, tmp_path: Path) -> None:
    shape = shape_to_text(cluster.local.shape())
    argv = [SLURM_AIGC_BIN, "replay", "compare", "--trace", "mix", "--minutes", "0.5", "--max-jobs", "8",
            "--set", "max_duration_s=30", "--set", "min_duration_s=15", "--shape", shape,
            "--out-dir", str(tmp_path), "--timeout", "420", "--json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=1000, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout.strip().splitlines()[-1])
    workload_jobs = document["jobs"]
    assert 1 <= workload_jobs <= 8
    for mode in ("stock", "aigc"):
        run = document[mode]
        assert all(figure in run for figure in FIGURES), sorted(run)
        assert run["jobs"] == workload_jobs
        assert run["jobs_lost"] == 0, f"{mode}: {run}"
        assert run["makespan_s"] > 0 and 0 < run["allocation_ratio"] <= 1
        assert run["effective_utilization"] > 0  # a shard job may use more of a GPU than its share
        assert run["capacity_gpus"] == cluster.local.shape().total_gpus
    assert set(document["ratios"]) >= {"effective_utilization", "mean_wait", "makespan"}
    assert Path(document["plot"]).stat().st_size > 10_000
    assert (tmp_path / "workload.csv").read_text().count("\n") >= workload_jobs
    assert (tmp_path / "aigc-policy.yaml").exists() and (tmp_path / "stock-logs").is_dir()


BACKLOG_FIGURES = ("useful_utilization", "effective_utilization", "work_completed_gpu_s", "completed", "submitted",
                   "mean_wait_s", "p95_wait_s", "waits", "shared_slowdown_median", "shared_slowdown_p95",
                   "shared_timeouts", "jobs_harmed", "gpu_hours_reclaimed", "stream_exhausted")


def test_short_backlogged_compare_keeps_the_backlog_and_reports_every_window_figure(cluster: ClusterHandle, tmp_path: Path) -> None:
    """Issue 14.1: both runs keep 4 jobs pending for 60 s from the same stream, then cancel the rest."""
    shape = shape_to_text(cluster.local.shape())
    argv = [SLURM_AIGC_BIN, "replay", "compare", "--trace", "mix", "--backlog", "4", "--duration-s", "60",
            "--max-jobs", "60", "--set", "max_duration_s=40", "--set", "min_duration_s=15", "--shape", shape,
            "--set", "imagegen.usage.hung=3",  # most image servers hang: fake-busy time the useful figure must leave out
            "--out-dir", str(tmp_path), "--json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "compression 60 (the workload's `# compression:` line)" in result.stderr
    document = json.loads(result.stdout.strip().splitlines()[-1])
    assert document["mode"] == "backlog" and document["backlog"] == 4 and document["duration_s"] == 60
    for mode in ("stock", "aigc"):
        run = document[mode]
        assert all(figure in run for figure in BACKLOG_FIGURES), sorted(run)
        # the backlog was kept: more jobs went in than the 4 of the first tick, and some finished in the window
        assert run["submitted"] > 4 and run["completed"] >= 1, f"{mode}: {run}"
        assert run["work_completed_gpu_s"] > 0 and 0 < run["useful_utilization"] <= run["effective_utilization"]
        assert run["duration_s"] == 60 and run["capacity_gpus"] == cluster.local.shape().total_gpus
        assert {w["job_class"] for w in run["waits"]}, run["waits"]
    # stock Slurm leaves hung jobs spinning (100 % SM at idle power): SM counts them, useful does not
    assert document["stock"]["useful_gpu_s"] < 0.95 * document["stock"]["used_gpu_s"], document["stock"]
    assert set(document["ratios"]) >= {"useful_utilization", "work_completed_gpu_s", "mean_wait_s"}
    leftovers = [job for job in cluster.slurm.jobs() if job.user.startswith("aigc-") and job.state.split()[0] in
                 ("PENDING", "RUNNING")]
    assert leftovers == [], "the replay cancels what is left at the end of the window"
