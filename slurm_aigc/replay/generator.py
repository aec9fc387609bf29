"""Seeded conversion of trace rows into a timed AIGC job mix for the local cluster.

Every assumption is a field of `GeneratorParams` (documented in docs/replay.md); there
are no other constants. The same trace rows and the same params give the same workload.

How a workload is made, per trace source:
1. trace rows become drafts: arrival, duration, GPU count, VRAM share, class hints; the
   GenAI request trace is first grouped into serving sessions (one imagegen job per burst
   of requests for one checkpoint model);
2. a window of the trace starting at `window_start_s` (or a seeded row) is walked in arrival
   order; arrival offsets and durations are divided by `compression`, durations are
   clamped to [min_duration_s, max_duration_s], and offsets wrap onto the
   `arrival_window_s` replay window (later trace windows are stacked onto the same replay
   minutes) until the whole-GPU demand reaches `load_target` x `capacity_gpus` x
   `arrival_window_s` (times the source's share of the mix) or the job cap is hit;
3. each job draws a usage pattern (busy, bursty, idle tail, over-allocated, hung) from its
   class's `UsageMix`, because no trace file used records GPU utilization, and gets a profile, a time
   limit, VRAM, memory use, utilization, tags and a user.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_aigc.errors import AigcError
from slurm_aigc.profiles import Phase, total_seconds
from slurm_aigc.replay.tracejobs import TraceJob
from slurm_aigc.replay.workload import (
    MAX_GPUS,
    MAX_SECONDS,
    MAX_VRAM_GIB,
    Workload,
    WorkloadJob,
    format_tags,
)

USAGE_KINDS = ("busy", "bursty", "idle_tail", "over_allocated", "hung")
SOURCE_PREFIX = {"alibaba-2023": "openb", "genai-2026": "genai", "philly": "philly"}
MAX_COMPRESSION = 1_000_000  # trace seconds per replay second: 11.6 trace days a second is plenty
MAX_TIME_LIMIT_FACTOR = 100.0
MAX_LOAD_TARGET = 1_000_000
MAX_COUNT = 1_000_000  # capacity_gpus, max_jobs: far past any cluster, well short of float overflow


class GeneratorError(AigcError):
    """The generator cannot build a workload from what it was given (no usable rows, bad params)."""

    exit_code = 2


@dataclass(frozen=True)
class UsageMix:
    """Probabilities (weights, normalized) of each usage pattern for one class.

    The trace files used record allocations, not utilization, so these weights are this
    project's assumptions, not measured or cited figures: serving idles between and after
    request bursts, and a few training jobs hang or use fewer GPUs than they hold.
    docs/replay.md ("What the assumptions rest on") says what each one drives.
    """

    busy: float
    bursty: float
    idle_tail: float
    over_allocated: float
    hung: float

    def weights(self) -> tuple[float, ...]:
        return (self.busy, self.bursty, self.idle_tail, self.over_allocated, self.hung)


@dataclass(frozen=True)
class ClassParams:
    """Per-class assumptions: model loading time, utilization and VRAM ranges, usage mix."""

    loading_s: float
    util_pct_range: tuple[float, float]
    vram_gib_range: tuple[float, float]
    usage: UsageMix


@dataclass(frozen=True)
class GeneratorParams:
    """Every assumption the generator makes; docs/replay.md gives each one's basis (a source or "assumption")."""

    seed: int = 1
    # Time: trace seconds per replay second, for arrivals and durations alike.
    compression: float = 60.0
    arrival_window_s: float = 150.0
    window_start_s: float | None = None  # trace seconds after the first arrival; None: seeded row
    min_duration_s: float = 30.0
    max_duration_s: float = 150.0
    time_limit_factor: float = 1.5  # time limit = duration x this, rounded up to whole minutes
    # Load: whole-GPU demand over the arrival window relative to the cluster's GPUs.
    capacity_gpus: int = 24  # default local cluster: 2 x 8 a100 + 2 x 4 t4
    load_target: float = 2.0
    max_jobs: int = 150
    max_gpus_per_job: int = 8  # one node's GPUs: bigger trace jobs are capped
    mix_weights: tuple[tuple[str, float], ...] = (("alibaba-2023", 0.35), ("genai-2026", 0.30), ("philly", 0.35))
    # Who submits, and whether they tag.
    users: tuple[str, ...] = ("aigc-alice", "aigc-bob")
    untagged_fraction: float = 0.0
    infer_models: tuple[str, ...] = ("llama3-8b", "qwen2-7b", "mistral-7b", "phi3-mini")
    # VRAM.
    openb_share_vram_gib: float = 16.0  # VRAM one whole openb GPU share (gpu_milli 1000) stands for
    share_vram_max_gib: float = 20.0  # infer/imagegen jobs needing at most this declare share=yes
    imagegen_vram_gib_base: float = 6.0
    imagegen_vram_gib_per_lora: float = 0.5
    imagegen_vram_gib_per_image: float = 0.5
    mem_use_fraction_range: tuple[float, float] = (0.6, 0.95)  # memory used / declared VRAM
    # Trace mapping.
    genai_session_gap_s: float = 900.0  # trace seconds between requests that end a serving session
    philly_multi_gpu_class: str = "train"
    philly_single_gpu_class: str = "finetune"
    openb_whole_gpu_ls_class: str = "infer"  # openb LS pods holding whole GPUs
    openb_whole_gpu_other_class: str = "finetune"  # openb BE/Burstable/Guaranteed whole-GPU pods
    # Usage shapes.
    loading_fraction_max: float = 0.25  # loading never longer than this share of the duration
    min_work_s: float = 10.0
    burst_busy_s: float = 10.0  # bursty work: busy this long, then idle
    burst_idle_s: float = 10.0  # ... this long (shorter than any idle-detection window)
    idle_tail_s_range: tuple[float, float] = (60.0, 150.0)
    hung_busy_fraction: float = 0.5  # hung jobs hang after this share of their work
    hung_overrun_s: float = 60.0  # hung phase outlasts the time limit by this, so Slurm ends it
    over_allocated_used_fraction: float = 0.25  # share of its GPUs an over-allocated job uses (>= 1)
    requeue_remaining_fraction: float = 0.5  # share of work left when a busy job is requeued
    infer: ClassParams = ClassParams(10.0, (30.0, 70.0), (16.0, 40.0), UsageMix(0.15, 0.40, 0.40, 0.0, 0.05))
    imagegen: ClassParams = ClassParams(8.0, (80.0, 99.0), (6.0, 12.0), UsageMix(0.0, 0.35, 0.60, 0.0, 0.05))
    train: ClassParams = ClassParams(15.0, (85.0, 98.0), (30.0, 76.0), UsageMix(0.60, 0.0, 0.10, 0.20, 0.10))
    finetune: ClassParams = ClassParams(12.0, (70.0, 95.0), (12.0, 40.0), UsageMix(0.65, 0.0, 0.15, 0.10, 0.10))

    def class_params(self, job_class: str) -> ClassParams:
        if job_class not in ("infer", "imagegen", "train", "finetune"):
            raise GeneratorError(f"no generator parameters for class {job_class!r}")
        value = getattr(self, job_class)
        assert isinstance(value, ClassParams)
        return value

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Draft:
    """A trace record (or GenAI session) reduced to what a job needs, in trace seconds."""

    source: str
    line: int
    arrival_s: float
    duration_s: float
    gpus: int
    job_class: str
    vram_gib: float | None = None  # None: drawn from the class's range
    model: str = ""
    work_kind: str = ""  # forced work phase kind (imagegen serving is bursty)


# ---------------------------------------------------------------- entry point


def generate(sources: Mapping[str, Sequence[TraceJob]], params: GeneratorParams) -> Workload:
    """Trace rows per source (alibaba-2023, genai-2026, philly) -> a seeded workload.

    One source gets the whole load; several share it by `params.mix_weights`.
    """
    check_params(params)
    weights = _weights(sources, params)
    jobs: list[WorkloadJob] = []
    windows: dict[str, int] = {}
    for source, weight in weights.items():
        drafts = drafts_for(source, sources[source], params)
        if not drafts:
            raise GeneratorError(f"{source}: no usable GPU rows in the trace")
        picked, start = _walk(source, drafts, params, weight, random.Random(f"{params.seed}:{source}:window"))
        windows[source] = round(start)
        jobs.extend(picked)
    jobs.sort(key=lambda j: (j.submit_offset_s, j.source))
    named = _name(jobs)
    meta = {
        "generator": "slurm-aigc replay convert",
        "traces": ",".join(weights),
        "seed": str(params.seed),
        "compression": f"{params.compression:g}",
        "window_start_trace_s": json.dumps(windows, sort_keys=True),
        "params": params.to_json(),
    }
    return Workload(tuple(named), meta)


def check_params(params: GeneratorParams) -> None:
    """Every number finite and in its range, so a bad `--set` is one clear error, not a traceback later."""
    problems = [
        *_time_problems(params),
        *_load_problems(params),
        *_shape_problems(params),
        *(p for c in ("infer", "imagegen", "train", "finetune") for p in _class_problems(c, params.class_params(c))),
    ]
    if problems:
        raise GeneratorError(f"generator parameters: {'; '.join(problems)}")


def _time_problems(params: GeneratorParams) -> list[str]:
    problems = [
        _outside("compression", params.compression, 0, MAX_COMPRESSION, low_open=True),
        _outside("arrival_window_s", params.arrival_window_s, 0, MAX_SECONDS, low_open=True),
        _outside("min_duration_s", params.min_duration_s, 0, MAX_SECONDS, low_open=True),
        _outside("max_duration_s", params.max_duration_s, 0, MAX_SECONDS, low_open=True),
        _outside("time_limit_factor", params.time_limit_factor, 1, MAX_TIME_LIMIT_FACTOR),
        _outside("genai_session_gap_s", params.genai_session_gap_s, 0, MAX_SECONDS),
    ]
    if params.window_start_s is not None:
        problems.append(_outside("window_start_s", params.window_start_s, 0, math.inf))
    if params.min_duration_s > params.max_duration_s:
        problems.append("need min_duration_s <= max_duration_s")
    return [p for p in problems if p]


def _load_problems(params: GeneratorParams) -> list[str]:
    problems = [
        _outside("capacity_gpus", params.capacity_gpus, 1, MAX_COUNT),
        _outside("load_target", params.load_target, 0, MAX_LOAD_TARGET, low_open=True),
        _outside("max_jobs", params.max_jobs, 1, MAX_COUNT),
        _outside("max_gpus_per_job", params.max_gpus_per_job, 1, MAX_GPUS),
        _outside("untagged_fraction", params.untagged_fraction, 0, 1),
        "" if params.users else "users must not be empty",
    ]
    problems += [_outside(f"mix_weights {name}", weight, 0, math.inf) for name, weight in params.mix_weights]
    return [p for p in problems if p]


def _shape_problems(params: GeneratorParams) -> list[str]:
    """VRAM, memory and profile-shape parameters (bursts of at least 1 s: 0 s would never end)."""
    bounds: list[tuple[str, float, float, float]] = [
        ("openb_share_vram_gib", params.openb_share_vram_gib, 0, MAX_VRAM_GIB),
        ("share_vram_max_gib", params.share_vram_max_gib, 0, MAX_VRAM_GIB),
        ("imagegen_vram_gib_base", params.imagegen_vram_gib_base, 0, MAX_VRAM_GIB),
        ("imagegen_vram_gib_per_lora", params.imagegen_vram_gib_per_lora, 0, MAX_VRAM_GIB),
        ("imagegen_vram_gib_per_image", params.imagegen_vram_gib_per_image, 0, MAX_VRAM_GIB),
        ("loading_fraction_max", params.loading_fraction_max, 0, 1),
        ("min_work_s", params.min_work_s, 0, MAX_SECONDS),
        ("burst_busy_s", params.burst_busy_s, 1, MAX_SECONDS),
        ("burst_idle_s", params.burst_idle_s, 1, MAX_SECONDS),
        ("hung_busy_fraction", params.hung_busy_fraction, 0, 1),
        ("hung_overrun_s", params.hung_overrun_s, 0, MAX_SECONDS),
        ("over_allocated_used_fraction", params.over_allocated_used_fraction, 0, 1),
        ("requeue_remaining_fraction", params.requeue_remaining_fraction, 0, 1),
    ]
    problems = [_outside(name, value, low, high) for name, value, low, high in bounds]
    problems += [
        _range_problem("mem_use_fraction_range", params.mem_use_fraction_range, 0, 1),
        _range_problem("idle_tail_s_range", params.idle_tail_s_range, 0, MAX_SECONDS),
    ]
    return [p for p in problems if p]


def _class_problems(name: str, cp: ClassParams) -> list[str]:
    problems = [
        _outside(f"{name}.loading_s", cp.loading_s, 0, MAX_SECONDS),
        _range_problem(f"{name}.util_pct_range", cp.util_pct_range, 0, 100),
        _range_problem(f"{name}.vram_gib_range", cp.vram_gib_range, 0, MAX_VRAM_GIB),
    ]
    problems += [_outside(f"{name}.usage.{kind}", weight, 0, math.inf) for kind, weight in zip(USAGE_KINDS, cp.usage.weights())]
    return [p for p in problems if p]


def _outside(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> str:
    """'' when `value` is a finite number in [low, high] ((low, high] with `low_open`), else the problem."""
    finite = isinstance(value, int) or math.isfinite(value)
    if finite and (low < value if low_open else low <= value) and value <= high:
        return ""
    bound = f"> {_shown(low)}" if low_open else f">= {_shown(low)}"
    bound += f" and <= {_shown(high)}" if math.isfinite(high) else ""
    return f"{name} must be a finite number {bound}, got {_shown(value)}"


def _shown(value: float) -> str:
    """A number for a message; an int too big for a float (`--set max_jobs=1000...0`) in short."""
    if isinstance(value, int):
        return str(value) if abs(value) < 10**18 else "an integer over 1e18"
    return f"{value:g}"


def _range_problem(name: str, pair: tuple[float, float], low: float, high: float) -> str:
    low_value, high_value = pair
    if all(math.isfinite(v) for v in pair) and low <= low_value <= high_value <= high:
        return ""
    limits = f"{_shown(low)} <= low <= high <= {_shown(high)}"
    return f"{name} must be two finite numbers low,high with {limits}, got {_shown(low_value)},{_shown(high_value)}"


def _weights(sources: Mapping[str, Sequence[TraceJob]], params: GeneratorParams) -> dict[str, float]:
    unknown = sorted(set(sources) - set(SOURCE_PREFIX))
    if unknown:
        raise GeneratorError(f"unknown trace source(s) {', '.join(unknown)}")
    if len(sources) == 1:
        return {next(iter(sources)): 1.0}
    configured = {name: w for name, w in params.mix_weights if name in sources and w > 0}
    total = sum(configured.values())
    if not configured or total <= 0:
        raise GeneratorError("mix_weights give no weight to the traces given")
    return {name: w / total for name, w in sorted(configured.items())}


# ---------------------------------------------------------------- drafts


def drafts_for(source: str, rows: Sequence[TraceJob], params: GeneratorParams) -> list[Draft]:
    """Trace rows of one source -> drafts sorted by arrival (CPU-only rows dropped)."""
    if source == "alibaba-2023":
        drafts = [d for d in (_openb_draft(r, params) for r in rows) if d is not None]
    elif source == "genai-2026":
        drafts = genai_sessions(rows, params)
    elif source == "philly":
        drafts = [_philly_draft(r, params) for r in rows]
    else:
        raise GeneratorError(f"unknown trace source {source!r}")
    drafts.sort(key=lambda d: (d.arrival_s, d.line))
    return drafts


def _openb_draft(row: TraceJob, params: GeneratorParams) -> Draft | None:
    if row.gpus == 0:
        return None  # CPU-only pod: nothing for a GPU scheduler to place
    if row.gpus == 1 and row.gpu_fraction < 1.0:
        # A GPU-sharing pod (FGD): a fraction of one GPU, the shape of small inference.
        vram = max(1.0, math.ceil(row.gpu_fraction * params.openb_share_vram_gib))
        return Draft(row.source, row.line, row.arrival_s, row.duration_s, 1, "infer", vram_gib=vram)
    if row.gpus == 1:
        cls = params.openb_whole_gpu_ls_class if row.qos == "LS" else params.openb_whole_gpu_other_class
        return Draft(row.source, row.line, row.arrival_s, row.duration_s, 1, cls)
    return Draft(row.source, row.line, row.arrival_s, row.duration_s, row.gpus, "train")


def _philly_draft(row: TraceJob, params: GeneratorParams) -> Draft:
    cls = params.philly_multi_gpu_class if row.gpus > 1 else params.philly_single_gpu_class
    return Draft(row.source, row.line, row.arrival_s, row.duration_s, row.gpus, cls)


def genai_sessions(rows: Sequence[TraceJob], params: GeneratorParams) -> list[Draft]:
    """Group SD/LoRA requests into serving sessions: one imagegen job per burst per model.

    A session of model M is a run of M's requests with gaps of at most
    `genai_session_gap_s`; it lasts from its first request to the end of its last. Its VRAM
    is the base model plus the largest LoRA count and image batch seen in it.
    """
    by_model: dict[str, list[TraceJob]] = {}
    for row in sorted(rows, key=lambda r: (r.arrival_s, r.line)):
        by_model.setdefault(row.model, []).append(row)
    sessions: list[Draft] = []
    for model, requests in by_model.items():
        for burst in _bursts(requests, params.genai_session_gap_s):
            sessions.append(_session_draft(model, burst, params))
    return sessions


def _bursts(requests: Sequence[TraceJob], gap_s: float) -> list[list[TraceJob]]:
    bursts: list[list[TraceJob]] = []
    last_end = -math.inf
    for request in requests:
        if request.arrival_s - last_end > gap_s:
            bursts.append([])
        bursts[-1].append(request)
        last_end = max(last_end, request.arrival_s + request.duration_s)
    return bursts


def _session_draft(model: str, burst: Sequence[TraceJob], params: GeneratorParams) -> Draft:
    start = burst[0].arrival_s
    end = max(r.arrival_s + r.duration_s for r in burst)
    vram = (
        params.imagegen_vram_gib_base
        + params.imagegen_vram_gib_per_lora * max(r.loras for r in burst)
        + params.imagegen_vram_gib_per_image * max(r.images for r in burst)
    )
    return Draft(
        burst[0].source,
        burst[0].line,
        start,
        end - start,
        1,
        "imagegen",
        vram_gib=float(math.ceil(vram)),
        model=f"sd-{model.lower()}",
        work_kind="bursty",
    )


# ---------------------------------------------------------------- window walk


def _walk(
    source: str, drafts: Sequence[Draft], params: GeneratorParams, weight: float, rng: random.Random
) -> tuple[list[WorkloadJob], float]:
    """Jobs of whole trace windows, stacked onto the replay window until their demand reaches
    the source's budget, then thinned (seeded) to the budget and the job cap so arrivals stay
    spread over the whole window. Returns the jobs and the window start (trace s)."""
    budget_gpu_s = params.load_target * params.capacity_gpus * params.arrival_window_s * weight
    job_cap = max(1, round(params.max_jobs * weight))
    start_index = _start_index(drafts, params, rng)
    candidates = _laps(source, drafts, start_index, params, budget_gpu_s)
    rng.shuffle(candidates)
    kept: list[WorkloadJob] = []
    demand = 0.0
    for job in candidates:
        if demand >= budget_gpu_s or len(kept) >= job_cap:
            break
        kept.append(job)
        demand += _demand(job)
    kept.sort(key=lambda j: (j.submit_offset_s, j.source))
    return kept, drafts[start_index].arrival_s - drafts[0].arrival_s


def _laps(source: str, drafts: Sequence[Draft], start_index: int, params: GeneratorParams, budget_gpu_s: float) -> list[WorkloadJob]:
    """Every draft of consecutive trace windows from `start_index` (wrapping past the trace's
    end at most once) until a whole window ends with the demand at or over the budget."""
    span = drafts[-1].arrival_s - drafts[0].arrival_s
    window_trace_s = params.arrival_window_s * params.compression
    origin = drafts[start_index].arrival_s
    jobs: list[WorkloadJob] = []
    demand = 0.0
    current_lap = 0.0
    for step in range(len(drafts)):
        index = (start_index + step) % len(drafts)
        draft = drafts[index]
        wrapped = span + 1.0 if index < start_index else 0.0
        lap, within = divmod(draft.arrival_s + wrapped - origin, window_trace_s)
        if lap > current_lap and demand >= budget_gpu_s:
            break
        current_lap = lap
        # Each job draws from its own stream, so adding or dropping a job never changes another.
        job_rng = random.Random(f"{params.seed}:{draft.source}:{draft.line}")
        jobs.append(_job(source, within / params.compression, draft, job_rng, params))
        demand += _demand(jobs[-1])
    return jobs


def _demand(job: WorkloadJob) -> float:
    """Whole GPUs x the time the job holds them under stock Slurm (a hung job: its limit)."""
    return job.gpus * min(job.duration_s, job.time_limit_s)


def _start_index(drafts: Sequence[Draft], params: GeneratorParams, rng: random.Random) -> int:
    if params.window_start_s is None:
        return rng.randrange(len(drafts))
    target = drafts[0].arrival_s + params.window_start_s
    for index, draft in enumerate(drafts):
        if draft.arrival_s >= target:
            return index
    raise GeneratorError(f"window_start_s {params.window_start_s:g} is past the trace's last arrival")


def _compressed_duration(trace_s: float, params: GeneratorParams) -> float:
    return min(max(trace_s / params.compression, params.min_duration_s), params.max_duration_s)


# ---------------------------------------------------------------- jobs


def _job(source: str, offset_s: float, draft: Draft, rng: random.Random, params: GeneratorParams) -> WorkloadJob:
    cls = draft.job_class
    cp = params.class_params(cls)
    gpus = min(draft.gpus, params.max_gpus_per_job)
    kind = _usage_kind(cp.usage, gpus, rng)
    duration = _compressed_duration(draft.duration_s, params)
    profile, requeue_profile, time_limit = _profile(kind, cls, draft, duration, cp, params, rng)
    vram = draft.vram_gib if draft.vram_gib is not None else float(math.ceil(rng.uniform(*cp.vram_gib_range)))
    share = _share(cls, gpus, vram, params)
    nvlink = "yes" if cls in ("train", "finetune") and gpus > 1 else ""
    model = draft.model or (rng.choice(params.infer_models) if cls == "infer" and params.infer_models else "")
    tags = _tags(cls, model, vram, share, nvlink, params, rng)
    used = max(1, math.floor(gpus * params.over_allocated_used_fraction)) if kind == "over_allocated" else 0
    return WorkloadJob(
        name="",
        submit_offset_s=round(offset_s, 1),
        job_class=cls,
        gpus=gpus,
        vram_gib_per_gpu=vram,
        duration_s=total_seconds(profile),
        time_limit_s=time_limit,
        profile=profile,
        requeue_profile=requeue_profile,
        gpus_used=used,
        mem_used_gib_per_gpu=round(vram * rng.uniform(*params.mem_use_fraction_range), 1),
        util_pct=round(rng.uniform(*cp.util_pct_range), 1),
        tags=tags,
        share=share,
        nvlink=nvlink,
        model=model,
        user=rng.choice(params.users),
        requeue=True,
        source=f"{source}:{draft.line}",
    )


def _usage_kind(mix: UsageMix, gpus: int, rng: random.Random) -> str:
    weights = list(mix.weights())
    if gpus < 2:
        weights[USAGE_KINDS.index("over_allocated")] = 0.0  # one GPU cannot be over-allocated
    if sum(weights) <= 0:
        return "busy"
    return rng.choices(USAGE_KINDS, weights=weights)[0]


def _profile(
    kind: str,
    cls: str,
    draft: Draft,
    duration: float,
    cp: ClassParams,
    params: GeneratorParams,
    rng: random.Random,
) -> tuple[tuple[Phase, ...], tuple[Phase, ...], int]:
    """The usage profile, what a requeued run does, and the Slurm time limit (s)."""
    loading = _secs(min(cp.loading_s, duration * params.loading_fraction_max))
    bursty = draft.work_kind == "bursty" or kind == "bursty" or (cls == "infer" and kind == "idle_tail")
    load = (Phase("loading", loading),)
    if kind == "idle_tail":
        tail = _secs(rng.uniform(*params.idle_tail_s_range))
        work = _secs(max(duration - loading - tail, params.min_work_s))
        profile = (*load, *_work(work, bursty, params), Phase("idle", tail))
        # The work was done before the tail: a requeued run has nothing left to do.
        return profile, (), _limit(total_seconds(profile), params)
    work = _secs(max(duration - loading, params.min_work_s))
    if kind == "hung":
        before = _secs(max(work * params.hung_busy_fraction, 1.0))
        limit = _limit(loading + work, params)
        hang = _secs(limit + params.hung_overrun_s - loading - before)
        rest = _secs(max(work - before, 1.0))
        return (*load, *_work(before, bursty, params), Phase("hung", hang)), (*load, *_work(rest, bursty, params)), limit
    profile = (*load, *_work(work, bursty, params))
    if kind == "over_allocated":
        rest = _secs(max(work * params.requeue_remaining_fraction, 1.0))
        return profile, (*load, *_work(rest, bursty, params)), _limit(loading + work, params)
    return profile, profile, _limit(loading + work, params)


def _work(seconds: float, bursty: bool, params: GeneratorParams) -> tuple[Phase, ...]:
    """Steady work is one busy phase; bursty work alternates busy and idle (gpu-load has no
    bursty phase kind), starting and ending busy."""
    if not bursty or seconds <= params.burst_busy_s + params.burst_idle_s:
        return (Phase("busy", seconds),)
    phases: list[Phase] = []
    left = seconds
    while left > params.burst_busy_s + params.burst_idle_s:
        phases += [Phase("busy", params.burst_busy_s), Phase("idle", params.burst_idle_s)]
        left -= params.burst_busy_s + params.burst_idle_s
    phases.append(Phase("busy", left))
    return tuple(phases)


def _secs(value: float) -> float:
    return float(max(1, round(value)))


def _limit(seconds: float, params: GeneratorParams) -> int:
    return max(60, 60 * math.ceil(seconds * params.time_limit_factor / 60))


def _share(cls: str, gpus: int, vram: float, params: GeneratorParams) -> str:
    if cls not in ("infer", "imagegen"):
        return ""
    return "yes" if gpus == 1 and vram <= params.share_vram_max_gib else "no"


def _tags(cls: str, model: str, vram: float, share: str, nvlink: str, params: GeneratorParams, rng: random.Random) -> str:
    if rng.random() < params.untagged_fraction:
        return ""
    pairs = {"type": cls}
    if model:
        pairs["model"] = model
    pairs["vram"] = f"{vram:g}G"
    if share:
        pairs["share"] = share
    if nvlink:
        pairs["nvlink"] = nvlink
    return format_tags(pairs)


def _name(jobs: Sequence[WorkloadJob]) -> list[WorkloadJob]:
    named = []
    for index, job in enumerate(jobs):
        prefix = SOURCE_PREFIX.get(job.source.split(":", 1)[0], "job")
        named.append(dataclasses.replace(job, name=f"{prefix}-{job.job_class}-{index:04d}"))
    return named


# ---------------------------------------------------------------- overrides


def with_overrides(params: GeneratorParams, overrides: Mapping[str, str]) -> GeneratorParams:
    """Apply `key=value` overrides (`seed=3`, `infer.loading_s=5`, `users=a,b`) with type checks."""
    for key, text in overrides.items():
        params = _override(params, key, text)
    return params


def _override(params: GeneratorParams, key: str, text: str) -> GeneratorParams:
    head, _, tail = key.partition(".")
    fields = {f.name: f for f in dataclasses.fields(params)}
    if head not in fields:
        raise GeneratorError(f"unknown generator parameter {key!r}; known: {', '.join(sorted(fields))}")
    current = getattr(params, head)
    if tail:
        if not isinstance(current, ClassParams):
            raise GeneratorError(f"generator parameter {head!r} has no field {tail!r}")
        changes: dict[str, Any] = {head: _override_class(current, key, tail, text)}
        return dataclasses.replace(params, **changes)
    changes = {head: _coerce(key, current, text)}
    return dataclasses.replace(params, **changes)


def _override_class(current: ClassParams, key: str, tail: str, text: str) -> ClassParams:
    head, _, rest = tail.partition(".")
    if head == "usage" and rest:
        if rest not in USAGE_KINDS:
            raise GeneratorError(f"unknown usage kind in {key!r}; use one of {', '.join(USAGE_KINDS)}")
        weights: dict[str, Any] = {rest: _coerce(key, 0.0, text)}
        usage = dataclasses.replace(current.usage, **weights)
        return dataclasses.replace(current, usage=usage)
    if head not in {f.name for f in dataclasses.fields(current)} or head == "usage":
        raise GeneratorError(f"unknown generator parameter {key!r}")
    fields: dict[str, Any] = {head: _coerce(key, getattr(current, head), text)}
    return dataclasses.replace(current, **fields)


def _coerce(key: str, current: object, text: str) -> object:
    try:
        if isinstance(current, bool):
            raise GeneratorError(f"{key}: booleans are not settable")
        if isinstance(current, int):
            return int(text)
        if isinstance(current, float) or current is None:
            return float(text)
        if isinstance(current, str):
            return text
        if isinstance(current, tuple) and current and isinstance(current[0], tuple):
            return tuple((name, float(weight)) for name, weight in (item.split(":", 1) for item in text.split(",")))
        if isinstance(current, tuple) and current and isinstance(current[0], float):
            low, high = (float(v) for v in text.split(","))
            return (low, high)
        if isinstance(current, tuple):
            return tuple(v.strip() for v in text.split(",") if v.strip())
    except ValueError as error:
        raise GeneratorError(f"{key}: cannot read {text!r}: {error}") from error
    raise GeneratorError(f"{key}: not settable from the command line")
