"""Learned defaults for untagged jobs (pure): from job history, per (user, job-name pattern), the
class, the VRAM need and the expected SM fraction; and the file the job_submit hook reads.

Most jobs on a real cluster carry no `aigc:` tag, so the hook knows neither their class nor
their VRAM and can neither share a GPU nor fit a GPU type for them. Their owners' earlier
jobs with a similar name tell both. The controller (`telemetry/learnpublish.py`) reads the
history (sacct records and the agents' samples), calls `learn_jobs`, and writes `format_table`'s
bytes; the hook (`learned_defaults` in job_submit_lua/aigc_hook.lua) reads the file and fills
only the keys a job's tag leaves out.

Rules, and why each exists:

* **Key: (uid, name pattern).** One user's history never shapes another user's jobs, so
  nobody can steer someone else's placement by running (or naming) jobs. The uid, not the
  name, because slurmctld hands the hook the submitting uid, which a user cannot choose.
* **Pattern** (`name_pattern`, the hook's `learned_key` does the same byte for byte, a
  property test holds them equal): the first `PATTERN_READ` bytes of the name, ASCII
  lower-cased, split into words at every ASCII byte that is not a letter or digit (bytes
  >= 0x80, i.e. non-ASCII UTF-8, are word bytes), then trailing id-like words dropped
  (`sd-gen-0042` and `sd-gen-0043` -> `sd-gen`), words joined by `-`. Cut first, then
  strip: slurmdbd keeps 255 bytes of a name, the hook sees up to 1,024, and both must
  find the same key. The pattern is a plain word list: no glob or Lua pattern character
  survives, so a hostile name can neither break the file's lines nor become a wildcard.
* **Id-like words**: all digits (counters, dates split at `-`), hex of 8 or more with a
  digit (hashes, uuids), a compact timestamp `20261203t1230`, or a short counter prefix
  followed by digits (`run7`, `v2`, `seed42`). Model sizes (`8b`, `70b`) and names with
  digits inside (`llama3`) are kept: they change the VRAM a job needs. The first word is
  never dropped, so every name has a key.
* **Recency** (`max_age_days`): code, models and data change; a job older than that says
  little about the next one.
* **At least `min_jobs`** jobs back each learned value: one or two runs are an accident.
* **VRAM**: the 95th percentile of the jobs' peak memory per GPU, plus `vram_margin_pct`,
  rounded up to whole GiB. The p95 (nearest rank), not the maximum: one leaking run must not
  push every later job onto the biggest GPUs; not the mean: a job given less than it needs
  gets requeued by the memory guard when it shares a GPU.
* **A tight key only**: the VRAM is learned only when that p95 is at most `max_vram_spread`
  times the median peak. A wider spread means the name lumps jobs of different sizes (one
  user's `openb-infer` jobs peaking anywhere from 2 to 40 GiB, median 12): any one figure is
  wrong for most of them, and the p95 would move every one of them (most of which fit a small
  GPU) onto the biggest type (the 16-node replay measured before this rule: useful utilization
  0.81x of learning off, docs/benchmarks.md). Such a key keeps its class and SM; its jobs are
  placed as if nothing were learned of their VRAM.
* **SM fraction**, 0..1: the *highest* over the jobs of each job's SM *while it computes* (its
  time-weighted mean over the samples above `COMPUTING_MIN_PCT`), rounded up to a hundredth:
  what compute-aware sharing reads as `view.learned.sm` and what the policy's per-class
  `expected_sm` means (docs/hook.md). Why the highest and not the mean: the figure decides how
  many co-tenants share the job's GPU, and a job that draws more than it was given slows them,
  not its owner. With a mean, a user could run five light jobs under a name, then compute-heavy
  ones under the same name, and have those packed as tightly as the light ones (`shard:5` of
  an a100's 80: up to 16 per GPU). With the highest, every job under the key counts against it:
  one heavy job makes the key heavy for every later job until it is `max_age_days` old. The
  cost falls on its owner (fewer co-tenants, a bigger shard request), which is the side to err
  on. A per-job mean over the whole run would count loading and idle time and read lower for a
  bursty server, packing it tighter than its busy phases allow. Fake-busy time (high SM at idle
  power) counts as computing: that errs towards sharing less too. What a user can still do:
  docs/security.md.
* **Class**: the class stamped at submit (`aigc_class=`, which only slurmctld and admins
  write) of the user's jobs under that key, when one class holds at least `min_class_share`
  of them. Jobs whose stamp says `aigc_learned=1` never count as evidence of a class: the
  learner must not feed on its own guesses (a wrong guess would confirm itself forever).
  Such a key loses its class once its real evidence is older than `max_age_days`; its VRAM
  and SM are measured values and keep counting. `unknown` and `interactive` are no
  evidence (interactive means no batch script, which learning cannot grant).
* **At most `max_entries`** entries, shared out fairly among users: every user's best-backed
  entry first, then every user's second, and so on; within a round the best-backed first. The
  hook reads the whole file, so its size stays bounded whatever the history holds, and one
  user's hyper-parameter sweep (hundreds of names, each its own key) cannot push everyone
  else's entries out: a user loses entries to the cut only past an even share.
* **What is kept per job** (`LearnedJob`): the uid, the user name, the key's pattern, the
  stamped class and the job's usage; not its name or comments. The controller holds one per
  GPU job of the last `max_age_days`, so each costs a few hundred bytes whatever its owner
  typed (strings shared by a key are interned).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_aigc.errors import AigcError
from slurm_aigc.policy.model import LearnedConfig
from slurm_aigc.report.records import SampleSlice
from slurm_aigc.stats import percentile
from slurm_aigc.tags import UNKNOWN_CLASS, trusted_tags
from slurm_aigc.units import MIB_PER_GIB

PATTERN_READ = 128  # bytes of a job name the key is made from (< slurmdbd's 255)
# A sample at or under this SM % is loading or idle, not computing (reclaim calls <= 1 % idle;
# model loading shows a few per cent): left out of the job's SM while computing.
COMPUTING_MIN_PCT = 5.0
HEADER = b"# slurm-aigc learned defaults v2: uid pattern class vram_gib sm jobs class_jobs p50_peak_mib p95_peak_mib user\n"
NONE = "-"  # a field without a learned value
LEARNED_STAMP_KEY = "learned"  # aigc_learned=1 in the AdminComment stamp (slurm_aigc/tags.py)
_NOT_EVIDENCE = frozenset({UNKNOWN_CLASS, "interactive"})
_SEPARATOR_RE = re.compile(rb"[\x00-\x2f\x3a-\x60\x7b-\x7f]+")  # ASCII that is not [a-z0-9] after lower-casing
_COUNTER_PREFIXES = frozenset({
    "v", "r", "p", "run", "job", "seed", "step", "ep", "epoch", "iter", "trial", "part", "task", "try", "rep", "shard",
})
_USER_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_CLASS_RE = re.compile(r"[a-z][a-z0-9_]*")
_ASCII_LOWER = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz")


class LearnedTableError(AigcError):
    """A learned-defaults file that cannot be read (a line names what is wrong)."""


# --------------------------------------------------------------------------- name patterns


def _id_like(word: bytes) -> bool:
    """A counter, date, hash or timestamp word (see the module docstring)."""
    if word.isdigit():
        return True
    if len(word) >= 8 and re.fullmatch(rb"[0-9a-f]+", word) and re.search(rb"[0-9]", word):
        return True
    if re.fullmatch(rb"[0-9]{8}t[0-9]+z?", word):
        return True
    prefix = re.fullmatch(rb"([a-z]+)[0-9]+", word)
    return prefix is not None and prefix.group(1).decode("ascii") in _COUNTER_PREFIXES


def name_pattern(name: str | bytes | None) -> str:
    """`SD_Gen.0042` -> `sd-gen`; '' for a name without words. Same as the hook's `learned_key`."""
    raw = name if isinstance(name, bytes) else (name or "").encode("utf-8", "surrogateescape")
    words = [w for w in _SEPARATOR_RE.split(raw[:PATTERN_READ].translate(_ASCII_LOWER)) if w]
    while len(words) > 1 and _id_like(words[-1]):
        words.pop()
    return b"-".join(words).decode("utf-8", "surrogateescape")


# --------------------------------------------------------------------------- history in


@dataclass(frozen=True)
class HistoryJob:
    """One finished (or running) job as sacct recorded it; `uid` None when the user is unknown here."""

    job_id: str
    user: str
    uid: int | None
    name: str
    admin_comment: str  # the hook's trusted stamp opens it
    gpus: int  # GPUs (or shard GRES) requested; 0: not a GPU job
    end_ts: float | None  # None: still running
    start_ts: float | None


@dataclass(frozen=True)
class JobUsage:
    """What the agents saw of one job: peak memory on any one GPU, time-weighted SM % while computing."""

    peak_vram_mib: float | None
    mean_sm_pct: float | None


def usage_from_slices(slices: Iterable[SampleSlice]) -> dict[str, JobUsage]:
    """Per job id: the highest memory any of its GPUs held and its SM % while computing (over the
    slices above COMPUTING_MIN_PCT, weighted by slice time; None when it never computed)."""
    peak: dict[str, float] = {}
    busy: dict[str, float] = {}
    known: dict[str, float] = {}
    for s in slices:
        if s.memory_used_mib is not None:
            peak[s.job_id] = max(peak.get(s.job_id, 0.0), s.memory_used_mib)
        if s.sm_util_pct is not None and s.sm_util_pct > COMPUTING_MIN_PCT and s.duration_s > 0:
            busy[s.job_id] = busy.get(s.job_id, 0.0) + s.sm_util_pct * s.duration_s
            known[s.job_id] = known.get(s.job_id, 0.0) + s.duration_s
    ids = set(peak) | set(known)
    return {j: JobUsage(peak.get(j), busy[j] / known[j] if known.get(j) else None) for j in ids}


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class LearnedEntry:
    """One line of the learned table: what a key's history says, and how much history says it."""

    uid: int
    user: str
    pattern: str
    job_class: str | None
    vram_gib: int | None
    sm: float | None  # 0..1
    jobs: int  # jobs with samples behind vram and sm
    class_jobs: int  # jobs whose stamped class counted as evidence
    p95_peak_mib: float | None
    p50_peak_mib: float | None = None  # with p95: the spread that decides whether the VRAM is learned

    @property
    def key(self) -> tuple[int, str]:
        return (self.uid, self.pattern)


@dataclass(frozen=True, slots=True)
class LearnedJob:
    """What the learner keeps of one finished GPU job: all `learn_jobs` reads, nothing more.

    The controller holds one per GPU job of the last `max_age_days` (telemetry/learnpublish.py),
    so it carries no name and no comment, only the key they make and the class they stamp.
    """

    uid: int
    user: str  # NONE when not a plain user name (it is written into the table)
    pattern: str
    stamped_class: str | None  # the hook's stamp written without learning; None: no stamp, or a learned one
    end_ts: float
    peak_vram_mib: float | None = None
    sm_pct: float | None = None  # SM % while computing (`usage_from_slices`)


def learned_job(job: HistoryJob, usage: JobUsage | None = None) -> LearnedJob | None:
    """The learner's record of a finished GPU job of a known, non-root user whose name has words; else None.

    Root's jobs are never rewritten by the hook, so nothing is learned for them. The strings a
    key's jobs share (user, pattern, class) are interned: one copy, however many jobs.
    """
    if job.uid is None or job.uid == 0 or job.gpus <= 0 or job.end_ts is None:
        return None
    pattern = name_pattern(job.name)
    if not pattern:
        return None
    stamp = trusted_tags(job.admin_comment)
    stamped = None if stamp.get(LEARNED_STAMP_KEY) else stamp.get("class")
    user = job.user if _USER_RE.fullmatch(job.user) else NONE
    return LearnedJob(job.uid, sys.intern(user), sys.intern(pattern), None if stamped is None else sys.intern(stamped),
                      job.end_ts, usage.peak_vram_mib if usage else None, usage.mean_sm_pct if usage else None)


def learn(history: Iterable[HistoryJob], usage: Mapping[str, JobUsage], config: LearnedConfig, now_ts: float,
          classes: Iterable[str]) -> list[LearnedEntry]:
    """The learned table from sacct's records and the agents' usage (see `learn_jobs`).

    A requeued job has a sacct record per run: the last one speaks for it.
    """
    latest: dict[str, HistoryJob] = {}
    for job in history:
        if job.end_ts is not None and (job.job_id not in latest or (latest[job.job_id].end_ts or 0.0) <= job.end_ts):
            latest[job.job_id] = job
    kept = (learned_job(job, usage.get(job_id)) for job_id, job in latest.items())
    return learn_jobs([job for job in kept if job is not None], config, now_ts, classes)


def learn_jobs(jobs: Iterable[LearnedJob], config: LearnedConfig, now_ts: float, classes: Iterable[str]
               ) -> list[LearnedEntry]:
    """The learned table from the jobs that ended within `max_age_days`: best-backed entries
    first, at most `max_entries`, shared out among users (`fair_cut`)."""
    known = frozenset(classes) - _NOT_EVIDENCE
    oldest = now_ts - config.max_age_days * 86400.0
    groups: dict[tuple[int, str], list[LearnedJob]] = {}
    users: dict[int, str] = {}
    for job in jobs:
        if job.end_ts >= oldest:
            groups.setdefault((job.uid, job.pattern), []).append(job)
            users[job.uid] = job.user
    entries = [entry for (uid, pattern), group in groups.items()
               if (entry := _entry(uid, users[uid], pattern, group, config, known)) is not None]
    return fair_cut(entries, config.max_entries)


def _backing(entry: LearnedEntry) -> tuple[int, int, str]:
    """Sort key: the best-backed first (jobs behind the values plus stamped jobs), then by key."""
    return (-(entry.jobs + entry.class_jobs), entry.uid, entry.pattern)


def fair_cut(entries: Iterable[LearnedEntry], max_entries: int) -> list[LearnedEntry]:
    """At most `max_entries`, taken in rounds: every user's best-backed entry, then every user's
    second, ...; within a round the best-backed first. Returned best-backed first.

    A user with many keys keeps them only as far as the table has room once every other user's
    better-ranked entries are in: a sweep of structured names cannot evict another user.
    """
    taken: dict[int, int] = {}
    rounds: list[tuple[int, LearnedEntry]] = []
    for entry in sorted(entries, key=_backing):
        rounds.append((taken.get(entry.uid, 0), entry))
        taken[entry.uid] = rounds[-1][0] + 1
    rounds.sort(key=lambda item: item[0])  # stable: within a round, still best-backed first
    return sorted((entry for _, entry in rounds[:max_entries]), key=_backing)


def _entry(uid: int, user: str, pattern: str, jobs: Sequence[LearnedJob], config: LearnedConfig,
           known: frozenset[str]) -> LearnedEntry | None:
    job_class, class_jobs = _learned_class(jobs, config, known)
    peaks = [j.peak_vram_mib for j in jobs if j.peak_vram_mib is not None and j.peak_vram_mib > 0]
    sms = [j.sm_pct for j in jobs if j.sm_pct is not None]
    p95 = percentile(peaks, 95) if len(peaks) >= config.min_jobs else None
    p50 = percentile(peaks, 50) if p95 is not None else None
    vram = None
    if p95 is not None and p50 is not None and p95 <= config.max_vram_spread * p50:  # a tight key
        vram = max(1, math.ceil(p95 * (1 + config.vram_margin_pct / 100) / MIB_PER_GIB - 1e-9))
    # The highest job's figure, not the mean (module docstring): rounded up, as it caps co-tenants.
    sm = math.ceil(min(100.0, max(sms)) - 1e-9) / 100 if len(sms) >= config.min_jobs else None
    if job_class is None and vram is None and sm is None:
        return None
    return LearnedEntry(uid, user, pattern, job_class, vram, sm, max(len(peaks), len(sms)), class_jobs, p95, p50)


def _learned_class(jobs: Sequence[LearnedJob], config: LearnedConfig, known: frozenset[str]) -> tuple[str | None, int]:
    """The dominant stamped class and how many jobs were evidence (see the module docstring)."""
    counts: dict[str, int] = {}
    for job in jobs:
        cls = job.stamped_class
        if cls is not None and cls in known:
            counts[cls] = counts.get(cls, 0) + 1
    evidence = sum(counts.values())
    if evidence < config.min_jobs:
        return None, evidence
    best = min(counts, key=lambda c: (-counts[c], c))
    return (best if counts[best] >= config.min_class_share * evidence else None), evidence


# --------------------------------------------------------------------------- the file


def format_table(entries: Sequence[LearnedEntry]) -> bytes:
    """The file the hook reads: a header line, then one line per entry, fields split by one space.

    `uid pattern class vram_gib sm jobs class_jobs p50_peak_mib p95_peak_mib user`; `-` for no
    value. The hook reads the first five fields, `slurm-aigc classify`/`learned show` all of them.
    """
    lines = [HEADER]
    for e in entries:
        fields = [str(e.uid), e.pattern, e.job_class or NONE, _opt(e.vram_gib), _opt(e.sm), str(e.jobs),
                  str(e.class_jobs), _mib(e.p50_peak_mib), _mib(e.p95_peak_mib), e.user]
        lines.append(" ".join(fields).encode("utf-8", "surrogateescape") + b"\n")
    return b"".join(lines)


def _opt(value: float | int | None) -> str:
    return NONE if value is None else f"{value:g}"


def _mib(value: float | None) -> str:
    return NONE if value is None else f"{value:.0f}"


def parse_table(data: bytes, source: str = "learned table") -> list[LearnedEntry]:
    """`format_table`'s bytes back into entries; a bad line is a LearnedTableError naming it."""
    entries = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line or line.startswith(b"#"):
            continue
        try:
            entries.append(_parse_line(line))
        except (ValueError, UnicodeDecodeError) as error:
            raise LearnedTableError(f"{source}: line {number}: {error}") from None
    return entries


def _parse_line(line: bytes) -> LearnedEntry:
    fields = line.split(b" ")
    if len(fields) == 9:  # a v1 table (no p50) until the controller next writes it
        fields.insert(7, NONE.encode())
    if len(fields) != 10:
        raise ValueError(f"expected 10 fields split by single spaces, got {len(fields)}")
    uid, pattern, cls, vram, sm, jobs, class_jobs, p50, p95, user = (
        f.decode("utf-8", "surrogateescape") for f in fields)
    if not uid.isdigit() or not pattern or name_pattern(pattern.encode("utf-8", "surrogateescape")) != pattern:
        raise ValueError(f"not a uid and a name pattern: {uid!r} {pattern!r}")
    if cls != NONE and not _CLASS_RE.fullmatch(cls):
        raise ValueError(f"not a class name: {cls!r}")
    sm_value = None if sm == NONE else float(sm)
    if sm_value is not None and not 0 <= sm_value <= 1:
        raise ValueError(f"sm must be within 0..1, got {sm!r}")
    vram_value = None if vram == NONE else int(vram)
    if vram_value is not None and vram_value < 1:
        raise ValueError(f"vram_gib must be >= 1, got {vram!r}")
    return LearnedEntry(int(uid), user, pattern, None if cls == NONE else cls, vram_value, sm_value, int(jobs),
                        int(class_jobs), None if p95 == NONE else float(p95), None if p50 == NONE else float(p50))


def lookup(entries: Iterable[LearnedEntry], uid: int, name: str | None) -> LearnedEntry | None:
    """The entry the hook would use for a job of `uid` named `name`, or None."""
    key = (uid, name_pattern(name))
    return next((e for e in entries if e.key == key), None)
