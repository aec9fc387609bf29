"""A site's own job history -> a workload file: `slurm-aigc replay --from-sacct --since ...`.

Input: allocation records from `sacct -X -D` (read by `slurm_aigc.report.sacct`) and, where
the agents ran, the jobs' `job_gpu_samples` (read by `slurm_aigc.report.samples`). Output: one
workload row per finished GPU job, so the what-if ("what would this policy have done to last
week?") replays the site's real mix. What sacct cannot tell is a documented parameter of
`FromSacctParams`; every job left out is reported with the reason, never dropped silently.
Where no agent ran, Slurm 23.02+'s own `gres/gpuutil`/`gres/gpumem` accounting (NVML
autodetection on) stands in for the samples' utilization and memory (22.05 has neither).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from slurm_aigc.profiles import Phase
from slurm_aigc.profiles import total_seconds as profile_seconds
from slurm_aigc.replay.workload import (
    CLASSES,
    Workload,
    WorkloadJob,
    format_tags,
    parse_tags,
)
from slurm_aigc.report.records import SampleSlice
from slurm_aigc.report.sacct import JobRecord
from slurm_aigc.units import MIB_PER_GIB
from slurm_aigc.validation import parse_size_gib


@dataclass(frozen=True)
class FromSacctParams:
    """Assumptions for what sacct does not record (docs/replay.md, "From sacct")."""

    compression: float = 1.0  # divide submit offsets and durations, like the trace generator
    max_jobs: int = 0  # 0: all
    busy_util_pct: float = 20.0  # a sample at or above this is busy, below is idle
    default_vram_gib: float = 16.0  # per-GPU VRAM when neither a tag, shards nor samples tell
    vram_headroom: float = 1.1  # VRAM need = peak memory used x this, when only samples tell
    default_util_pct: float = 80.0  # busy utilization when there are no samples
    time_limit_factor: float = 1.5  # time limit = duration x this, rounded up to whole minutes
    shards_per_gib: float = 1.0  # the local cluster's convention: one shard = 1 GiB of VRAM


@dataclass(frozen=True)
class Omitted:
    """A sacct job not turned into a workload row, and why."""

    job_id: str
    reason: str


def workload_from_sacct(
    records: Iterable[JobRecord],
    slices: Iterable[SampleSlice],
    params: FromSacctParams = FromSacctParams(),
    meta: Mapping[str, str] | None = None,
) -> tuple[Workload, list[Omitted]]:
    """Records (several per requeued job) and samples -> (workload, jobs left out).

    Raises ValueError for a compression that is not a finite number > 0 or a negative max_jobs.
    """
    _check_params(params)
    by_job = _group(records)
    samples = _samples_by_job(slices)
    omitted: list[Omitted] = []
    drafts: list[tuple[float, WorkloadJob]] = []
    for job_id, runs in by_job.items():
        reason = _unusable(runs)
        if reason:
            omitted.append(Omitted(job_id, reason))
            continue
        drafts.append((_first_submit(runs), _job(job_id, runs, samples.get(job_id, []), params)))
    if not drafts:
        return Workload((), dict(meta or {})), omitted
    drafts.sort(key=lambda item: (item[0], item[1].name))
    if params.max_jobs:
        omitted.extend(Omitted(j.name.removeprefix("sacct-"), "over --max-jobs") for _, j in drafts[params.max_jobs :])
        drafts = drafts[: params.max_jobs]
    origin = drafts[0][0]
    jobs = tuple(_offset(job, (submit - origin) / params.compression) for submit, job in drafts)
    info = {"generator": "slurm-aigc replay --from-sacct", "compression": f"{params.compression:g}", **(meta or {})}
    return Workload(jobs, info), omitted


def _check_params(params: FromSacctParams) -> None:
    """The CLI's option types refuse these first (`--compression`, `--max-jobs`); this guards other callers."""
    if not (params.compression > 0 and math.isfinite(params.compression)):
        raise ValueError(f"compression must be a finite number > 0, got {params.compression!r}")
    if params.max_jobs < 0:
        raise ValueError(f"max_jobs must be >= 0 (0: all), got {params.max_jobs}")


def _group(records: Iterable[JobRecord]) -> dict[str, list[JobRecord]]:
    by_job: dict[str, list[JobRecord]] = {}
    for record in records:
        by_job.setdefault(record.job_id_raw, []).append(record)
    for runs in by_job.values():
        runs.sort(key=lambda r: (r.submit_ts or 0.0, r.start_ts or 0.0))
    return by_job


def _samples_by_job(slices: Iterable[SampleSlice]) -> dict[str, list[SampleSlice]]:
    by_job: dict[str, list[SampleSlice]] = {}
    for piece in slices:
        by_job.setdefault(piece.job_id, []).append(piece)
    return by_job


def _unusable(runs: Sequence[JobRecord]) -> str:
    last = runs[-1]
    if last.tres.gpus == 0 and last.tres.shards == 0:
        return "no GPUs or shards allocated"
    if last.start_ts is None or last.end_ts is None:
        return f"not finished (state {last.state})"
    if _elapsed(runs) <= 0:
        return "ran for 0 s"
    return ""


def _first_submit(runs: Sequence[JobRecord]) -> float:
    return min(r.submit_ts for r in runs if r.submit_ts is not None)


def _elapsed(runs: Sequence[JobRecord]) -> float:
    """Seconds of the job's last run: what a replay runs again (earlier runs were requeued)."""
    return float(runs[-1].elapsed_s)


def _job(job_id: str, runs: Sequence[JobRecord], samples: Sequence[SampleSlice], params: FromSacctParams) -> WorkloadJob:
    last = runs[-1]
    tags = _tags_of(last.comment)
    cls = tags.get("type", last.aigc_class)
    cls = cls if cls in CLASSES else "unknown"
    gpus = last.tres.gpus or 1  # a shard-only job holds part of one GPU
    share = "yes" if last.tres.gpus == 0 else tags.get("share", "")
    vram = _vram(last, tags, samples, params)
    elapsed = _elapsed(runs)
    profile = _scaled(_profile(last, samples, elapsed, params), params.compression)
    duration = profile_seconds(profile)
    pairs = {**tags, "type": cls, "vram": f"{vram:g}G"} if tags else {}
    if pairs and share:
        pairs["share"] = share
    return WorkloadJob(
        name=f"sacct-{job_id}",
        submit_offset_s=0.0,
        job_class=cls,
        gpus=gpus,
        vram_gib_per_gpu=vram,
        duration_s=duration,
        time_limit_s=max(60, 60 * math.ceil(duration * params.time_limit_factor / 60)),
        profile=profile,
        requeue_profile=profile,
        gpus_used=_gpus_used(samples, gpus, params),
        mem_used_gib_per_gpu=min(vram, round(_peak_mem_gib(samples) or _sacct_mem_gib(last), 1)),
        util_pct=round(_busy_util(samples, params, last), 1),
        tags=format_tags(pairs),
        share=share if share in ("yes", "no") else "",
        nvlink=tags.get("nvlink", "") if tags.get("nvlink") in ("yes", "no") else "",
        model=tags.get("model", ""),
        user=last.user,
        requeue=True,
        source=f"sacct:{job_id}",
    )


def _tags_of(comment: str) -> dict[str, str]:
    """The user's aigc: tag; a malformed one reads as no tag (the hook would have said so)."""
    try:
        return parse_tags(comment)
    except ValueError:
        return {}


def _vram(record: JobRecord, tags: Mapping[str, str], samples: Sequence[SampleSlice], params: FromSacctParams) -> float:
    """Declared `vram=` tag, else shards held (1 GiB each here), else peak use with headroom."""
    if "vram" in tags:
        try:
            return float(math.ceil(parse_size_gib(tags["vram"])))
        except ValueError:
            pass
    if record.tres.gpus == 0 and record.tres.shards:
        return float(math.ceil(record.tres.shards / params.shards_per_gib))
    peak = _peak_mem_gib(samples) or _sacct_mem_gib(record)
    if peak > 0:
        return float(math.ceil(peak * params.vram_headroom))
    return params.default_vram_gib


def _peak_mem_gib(samples: Sequence[SampleSlice]) -> float:
    return max((s.memory_used_mib or 0.0 for s in samples), default=0.0) / MIB_PER_GIB


def _sacct_mem_gib(record: JobRecord) -> float:
    """Per-GPU peak from Slurm's `gres/gpumem` (23.02+ with NVML autodetection), 0 when not recorded."""
    if record.sacct_gpu_mem_mib is None:
        return 0.0
    return record.sacct_gpu_mem_mib / max(record.tres.gpus, 1) / MIB_PER_GIB


def _busy_util(samples: Sequence[SampleSlice], params: FromSacctParams, record: JobRecord | None = None) -> float:
    """Mean of the busy samples; without agent samples Slurm's `gres/gpuutil` (23.02+), else the default."""
    busy = [s.sm_util_pct for s in samples if s.sm_util_pct is not None and s.sm_util_pct >= params.busy_util_pct]
    if busy:
        return min(100.0, sum(busy) / len(busy))
    if not samples and record is not None and record.sacct_gpu_util_pct is not None:
        return record.sacct_gpu_util_pct
    return params.default_util_pct


def _gpus_used(samples: Sequence[SampleSlice], gpus: int, params: FromSacctParams) -> int:
    """GPUs whose mean utilization reaches the busy threshold; 0 (= all) when all do or unknown."""
    per_gpu: dict[tuple[str, int], list[float]] = {}
    for s in samples:
        if s.sm_util_pct is not None:
            per_gpu.setdefault((s.node, s.gpu_index), []).append(s.sm_util_pct)
    if gpus < 2 or len(per_gpu) < gpus:
        return 0
    used = sum(1 for values in per_gpu.values() if sum(values) / len(values) >= params.busy_util_pct)
    return max(1, used) if used < gpus else 0


def _profile(record: JobRecord, samples: Sequence[SampleSlice], elapsed: float, params: FromSacctParams) -> list[Phase]:
    """Busy/idle stretches from the samples (most active GPU per poll), placed on the run's clock.

    Time before the first sample is loading, time after the last one continues the last
    stretch; without samples the job is assumed busy throughout.
    """
    start = record.start_ts or 0.0
    timeline = _busy_timeline(samples, params)
    if not timeline:
        return [Phase("busy", elapsed)]
    phases: list[Phase] = []
    _append(phases, "loading", timeline[0][0] - start)
    for index, (ts, busy) in enumerate(timeline):
        end = timeline[index + 1][0] if index + 1 < len(timeline) else start + elapsed
        # Idle before the first busy poll is model loading, not waste.
        kind = "busy" if busy else ("idle" if any(p.kind == "busy" for p in phases) else "loading")
        _append(phases, kind, end - ts)
    return _fit(phases, elapsed)


def _busy_timeline(samples: Sequence[SampleSlice], params: FromSacctParams) -> list[tuple[float, bool]]:
    by_ts: dict[float, float] = {}
    for s in samples:
        if s.sm_util_pct is not None:
            by_ts[s.ts] = max(by_ts.get(s.ts, 0.0), s.sm_util_pct)
    return [(ts, util >= params.busy_util_pct) for ts, util in sorted(by_ts.items())]


def _append(phases: list[Phase], kind: str, seconds: float) -> None:
    if seconds <= 0:
        return
    if phases and phases[-1].kind == kind:
        phases[-1] = Phase(kind, phases[-1].seconds + seconds)
    else:
        phases.append(Phase(kind, seconds))


def _fit(phases: list[Phase], elapsed: float) -> list[Phase]:
    """Scale phases so they add up to the elapsed time sacct recorded."""
    total = sum(p.seconds for p in phases)
    if total <= 0:
        return [Phase("busy", elapsed)]
    return [Phase(p.kind, p.seconds * elapsed / total) for p in phases]


def _scaled(phases: Sequence[Phase], compression: float) -> tuple[Phase, ...]:
    """Divide by the compression factor and round to whole seconds (at least 1)."""
    return tuple(Phase(p.kind, float(max(1, round(p.seconds / compression)))) for p in phases)


def _offset(job: WorkloadJob, offset_s: float) -> WorkloadJob:
    return replace(job, submit_offset_s=round(offset_s, 1))
