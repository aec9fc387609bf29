"""A site's sacct history (plus samples) -> workload rows; jobs left out say why."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_aigc.profiles import total_seconds as profile_seconds
from slurm_aigc.replay.from_sacct import FromSacctParams, workload_from_sacct
from slurm_aigc.replay.workload import format_workload, parse_workload
from slurm_aigc.report.records import SampleSlice
from slurm_aigc.report.sacct import JobRecord, parse_sacct_output
from tests.unit.sacct_json import DELIMITER, FIELDS, text_to_json


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def sacct_line(job_id: str, state: str, submit: str, start: str, end: str, tres: str, comment: str, elapsed: int,
               user: str = "aigc-alice") -> str:
    values = {
        "JobID": job_id, "JobIDRaw": job_id, "JobName": f"job{job_id}", "User": user, "Account": "aigc",
        "Partition": "gpu", "QOS": "normal", "State": state, "Submit": submit, "Eligible": submit, "Start": start,
        "End": end, "AllocTRES": tres, "NodeList": "a100-01", "AdminComment": "", "Comment": comment,
        "ElapsedRaw": str(elapsed),
    }
    return DELIMITER.join(values[f] for f in FIELDS)


def records(*lines: str) -> list[JobRecord]:
    text = "\n".join([DELIMITER.join(FIELDS), *lines]) + "\n"
    rows = list(parse_sacct_output(text_to_json(text), tz=UTC))
    assert all(isinstance(r, JobRecord) for r in rows)
    return rows  # type: ignore[return-value]


HISTORY = records(
    # a tagged 4-GPU training job
    sacct_line("10", "COMPLETED", "2026-12-01T10:00:00", "2026-12-01T10:00:30", "2026-12-01T10:10:30",
               "billing=4,cpu=4,gres/gpu=4,mem=16G,node=1", "exp1 aigc:type=train,vram=60G,nvlink=yes", 600),
    # a shard-only inference job with no tag
    sacct_line("11", "COMPLETED", "2026-12-01T10:02:00", "2026-12-01T10:02:00", "2026-12-01T10:05:00",
               "cpu=1,gres/shard=12,node=1", "", 180, user="aigc-bob"),
    # requeued once, then finished: two records
    sacct_line("12", "REQUEUED", "2026-12-01T10:01:00", "2026-12-01T10:01:10", "2026-12-01T10:02:10",
               "cpu=1,gres/gpu=1,node=1", "aigc:type=infer,vram=20G", 60),
    sacct_line("12", "COMPLETED", "2026-12-01T10:02:10", "2026-12-01T10:03:00", "2026-12-01T10:07:00",
               "cpu=1,gres/gpu=1,node=1", "aigc:type=infer,vram=20G", 240),
    # left out: no GPUs, still running, never ran
    sacct_line("13", "COMPLETED", "2026-12-01T10:03:00", "2026-12-01T10:03:00", "2026-12-01T10:04:00", "cpu=2,node=1", "", 60),
    sacct_line("14", "RUNNING", "2026-12-01T10:04:00", "2026-12-01T10:04:00", "Unknown", "cpu=1,gres/gpu=1,node=1", "", 100),
    sacct_line("15", "CANCELLED by 0", "2026-12-01T10:05:00", "2026-12-01T10:05:00", "2026-12-01T10:05:00",
               "cpu=1,gres/gpu=2,node=1", "", 0),
)


def gpu_series(job_id: str, gpu: int, start: str, utils: list[float], mem_mib: float = 8192.0, step: float = 60.0) -> list[SampleSlice]:
    t0 = ts(start)
    return [SampleSlice(job_id, "a100-01", gpu, t0 + i * step, step, u, mem_mib, 81920.0) for i, u in enumerate(utils)]


def test_jobs_without_samples_are_busy_throughout_and_keep_their_tags() -> None:
    workload, omitted = workload_from_sacct(HISTORY, [])
    assert {o.job_id: o.reason for o in omitted} == {
        "13": "no GPUs or shards allocated",
        "14": "not finished (state RUNNING)",
        "15": "ran for 0 s",
    }
    jobs = {j.name: j for j in workload.jobs}
    assert [j.name for j in workload.jobs] == ["sacct-10", "sacct-12", "sacct-11"]  # by first submit
    train = jobs["sacct-10"]
    assert (train.job_class, train.gpus, train.vram_gib_per_gpu, train.nvlink, train.submit_offset_s) == ("train", 4, 60.0, "yes", 0.0)
    assert [(p.kind, p.seconds) for p in train.profile] == [("busy", 600.0)]
    assert train.tags == "aigc:type=train,vram=60G,nvlink=yes"
    shard = jobs["sacct-11"]
    assert (shard.job_class, shard.gpus, shard.share, shard.vram_gib_per_gpu, shard.tags) == ("unknown", 1, "yes", 12.0, "")
    assert shard.submit_offset_s == 120.0
    requeued = jobs["sacct-12"]
    assert requeued.duration_s == 240.0  # its last run
    assert requeued.submit_offset_s == 60.0  # its first submit
    assert parse_workload(format_workload(workload)) == workload


def test_samples_shape_the_profile_vram_and_gpus_used() -> None:
    samples = (
        gpu_series("10", 0, "2026-12-01T10:01:30", [0, 90, 90, 90, 90, 0, 0, 0, 0], mem_mib=40960.0)
        + gpu_series("10", 1, "2026-12-01T10:01:30", [0, 0, 0, 0, 0, 0, 0, 0, 0])
        + gpu_series("10", 2, "2026-12-01T10:01:30", [0] * 9)
        + gpu_series("10", 3, "2026-12-01T10:01:30", [0] * 9)
        + gpu_series("11", 0, "2026-12-01T10:02:00", [50, 50, 50], mem_mib=6144.0)
    )
    workload, _ = workload_from_sacct(HISTORY, samples)
    jobs = {j.name: j for j in workload.jobs}
    train = jobs["sacct-10"]
    kinds = [p.kind for p in train.profile]
    assert kinds == ["loading", "busy", "idle"]
    # 60 s before the first sample + the first idle poll read as loading; 4 busy polls; the rest idle
    assert [p.seconds for p in train.profile] == [120.0, 240.0, 240.0]
    assert profile_seconds(train.profile) == 600.0
    assert train.gpus_used == 1  # one of four GPUs did the work
    assert train.util_pct == 90.0
    assert train.mem_used_gib_per_gpu == 40.0
    shard = jobs["sacct-11"]
    assert shard.mem_used_gib_per_gpu == 6.0 and shard.util_pct == 50.0


def test_untagged_whole_gpu_jobs_take_vram_from_samples_with_headroom() -> None:
    history = records(sacct_line("20", "COMPLETED", "2026-12-01T10:00:00", "2026-12-01T10:00:00", "2026-12-01T10:03:00",
                                 "cpu=1,gres/gpu=1,node=1", "", 180))
    workload, _ = workload_from_sacct(history, gpu_series("20", 0, "2026-12-01T10:00:00", [80, 80, 80], mem_mib=10240.0))
    assert workload.jobs[0].vram_gib_per_gpu == 11.0  # ceil(10 GiB x 1.1)
    bare, _ = workload_from_sacct(history, [])
    assert bare.jobs[0].vram_gib_per_gpu == FromSacctParams().default_vram_gib


def test_compression_and_max_jobs() -> None:
    workload, omitted = workload_from_sacct(HISTORY, [], FromSacctParams(compression=10.0, max_jobs=2))
    assert [j.name for j in workload.jobs] == ["sacct-10", "sacct-12"]
    assert workload.jobs[1].submit_offset_s == 6.0
    assert workload.jobs[0].duration_s == 60.0
    assert any(o.reason == "over --max-jobs" for o in omitted)
    assert workload.meta["compression"] == "10"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (FromSacctParams(max_jobs=-3), "max_jobs must be >= 0"),
        (FromSacctParams(compression=math.nan), "compression must be a finite number > 0"),
        (FromSacctParams(compression=math.inf), "compression must be a finite number > 0"),
        (FromSacctParams(compression=0.0), "compression must be a finite number > 0"),
    ],
)
def test_a_negative_max_jobs_or_bad_compression_is_refused(params: FromSacctParams, message: str) -> None:
    # max_jobs=-3 used to slice off the last 3 jobs; nan compression made nan offsets.
    with pytest.raises(ValueError, match=message):
        workload_from_sacct(HISTORY, [], params)


def test_no_usable_jobs_gives_an_empty_workload() -> None:
    workload, omitted = workload_from_sacct(HISTORY[4:5], [])
    assert workload.jobs == () and len(omitted) == 1


def test_slurm_gpuutil_and_gpumem_stand_in_for_missing_samples() -> None:
    """Slurm 23.02+ with NVML autodetection records gres/gpuutil and gres/gpumem per step."""
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "sacct" / "sacct-24.11-gpuutil.json"
    rows = [r for r in parse_sacct_output(fixture.read_text(encoding="utf-8")) if isinstance(r, JobRecord)]
    params = FromSacctParams(default_util_pct=80.0, default_vram_gib=16.0)
    workload, _ = workload_from_sacct(rows, [], params)
    by_name = {j.name: j for j in workload.jobs}
    two = by_name["sacct-301"]  # 150 % over 2 GPUs -> 75 %; 12 GiB peak over 2 GPUs -> 6 GiB each
    assert (two.util_pct, two.mem_used_gib_per_gpu, two.vram_gib_per_gpu) == (75.0, 6.0, 7.0)  # 6 x 1.1 headroom, rounded up
    assert by_name["sacct-302"].util_pct == 40.0
    none = by_name["sacct-303"]  # no gres/gpuutil recorded (22.05, or no NVML): the defaults
    assert (none.util_pct, none.vram_gib_per_gpu) == (80.0, 16.0)
    # Agent samples, where they exist, win over Slurm's figure.
    sample = SampleSlice(job_id="301", node="a100-01", gpu_index=0, ts=1796300100.0, duration_s=30.0,
                         sm_util_pct=50.0, memory_used_mib=1024.0, memory_total_mib=81920.0)
    sampled, _ = workload_from_sacct(rows, [sample], params)
    assert next(j for j in sampled.jobs if j.name == "sacct-301").util_pct == 50.0
