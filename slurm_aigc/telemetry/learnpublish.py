"""The learner's daemon part: read the job history, learn, write the table the job_submit hook reads.

Run by `slurm-aigc controller` (policy `learned.enabled`; with or without the feature publisher:
it needs only sacct and the database), at most every `learned.interval_s`, and once by
`slurm-aigc learned update`. Each run:

1. reads the jobs that ended since the last read from slurmdbd, one `WINDOW_S` window per
   `sacct --json --state=<ended states>` call (no pending or running job is transferred): the
   whole `max_age_days` on the first run, then from where the last read stopped. A job is new
   once: when it is not in the cache yet, or ended again (a requeued job's later run). The read
   position moves window by window, so a window that fails (a sacct timeout) is read again
   next time, not the whole range; a reload keeps it (`set_config`);
2. reads the agents' samples of the jobs new to the cache (`report.samples.SampleStore`, which
   also reads the hourly rollups older than the raw retention) and keeps per job only what the
   table needs (`telemetry.learned.LearnedJob`), dropping jobs older than `max_age_days`;
3. calls the pure learner (`telemetry.learned.learn_jobs`) and writes the table with the one
   atomic write (`fsio`), mode 0644, only when its bytes change. In dry-run nothing is written.

In the controller it runs in the reclaim loop's thread, so every sacct call it makes holds up
reclaim (the memory guard included): it uses the loop's Slurm timeout (`SlurmCli`'s 30 s, not
the reports' 300 s), and reads at most `LOOP_WINDOWS_PER_TICK` windows per controller tick. Until
the history is read up to now it reads on (every controller tick, not every `interval_s`) and
writes nothing, so the table on disk stays as it was until one built from the whole range replaces it.
"""

from __future__ import annotations

import functools
import logging
import pwd
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from slurm_aigc.fsio import atomic_write_bytes
from slurm_aigc.policy.model import BASE_CLASSES, LearnedConfig
from slurm_aigc.report.sacct import JobRecord, SacctQuery, SacctRunner, parse_sacct_output, sacct_args, windows
from slurm_aigc.report.samples import JOB_IDS_PER_QUERY, SampleStore
from slurm_aigc.telemetry.learned import (
    HistoryJob,
    JobUsage,
    LearnedEntry,
    LearnedJob,
    format_table,
    learn_jobs,
    learned_job,
    usage_from_slices,
)

LOG = logging.getLogger(__name__)

# slurmdbd records a job's end a little after it happens: the read position stays this far behind
# the time of the read, so the next read covers the ends recorded late.
OVERLAP_S = 3600.0
# One sacct call per window of job ends: a quarter of a day of a busy site answers well within
# the loop's 30 s timeout (a month takes minutes: cli/env.py SACCT_TIMEOUT_S).
WINDOW_S = 6 * 3600.0
# In the controller: one sacct call per controller tick while catching up (reclaim waits for it).
LOOP_WINDOWS_PER_TICK = 1
# Job states of a run that ended (sacct --state; the same names from 22.05 to 24.11). With -S/-E,
# slurmdbd selects a job in one of them whose end lies in the window (`_state_time_string` in
# as_mysql_jobacct_process.c: `time_end between S and E`), so a job comes in the window of its
# end, whenever it started. Left out: REQUEUED (an earlier run of a job that runs again: its
# last run speaks for it), BOOT_FAIL (never ran), RESIZING and REVOKED (not an end of a run).
ENDED_STATES = ("CD", "F", "TO", "OOM", "NF", "CA", "PR", "DL")
_ID_BATCH = JOB_IDS_PER_QUERY  # job ids per samples read: one query each (job_slices splits a longer list)

UidOf = Callable[[str], "int | None"]


def uid_of(user: str) -> int | None:
    """The uid of a user name (`getent passwd USER`); None when the host does not know it."""
    try:
        return pwd.getpwnam(user).pw_uid
    except (KeyError, UnicodeEncodeError):
        return None


def history_job(record: JobRecord, uids: UidOf) -> HistoryJob:
    """The learner's view of one sacct allocation record (GPUs or shards it held count as GPU use)."""
    return HistoryJob(record.job_id_raw, record.user, uids(record.user) if record.user else None, record.name,
                      record.admin_comment, record.tres.gpus + record.tres.shards, record.end_ts, record.start_ts)


def ended_jobs_args(start: datetime, end: datetime) -> list[str]:
    """`sacct -X -D --json -S START -E END --allusers --state=CD,F,...`: the runs that ended in [start, end]."""
    return [*sacct_args(start, end, SacctQuery(since=start, until=end)), f"--state={','.join(ENDED_STATES)}"]


class LearnedPublisher:
    """Learns the table from sacct and the samples and writes `config.file`; `tick()` is one run.

    `windows_per_tick`: sacct windows one run reads at most (None: all, `learned update`).
    """

    def __init__(self, sacct: SacctRunner, samples: SampleStore, config: LearnedConfig,
                 classes: Sequence[str] = BASE_CLASSES, *, dry_run: bool = False, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, uids: UidOf = uid_of,
                 windows_per_tick: int | None = None) -> None:
        self._sacct = sacct
        self._samples = samples
        self.config = config
        self.classes = tuple(classes)
        self._dry_run = dry_run
        self._clock = clock
        self._monotonic = monotonic
        self._uids = uids
        self._windows_per_tick = windows_per_tick
        self._jobs: dict[str, LearnedJob] = {}
        self._read_until: float | None = None  # every run that ended before this is in _jobs
        self._behind = False  # the last run stopped at windows_per_tick, short of now
        self._last_run: float | None = None
        self._written: bytes | None = None

    @property
    def held_jobs(self) -> Mapping[str, LearnedJob]:
        """The cache: per job id, what the learner keeps of it."""
        return self._jobs

    def set_config(self, config: LearnedConfig, classes: Sequence[str], dry_run: bool | None = None) -> None:
        """Use a new (validated) config from the next run on (SIGHUP).

        The history read so far is kept: the cache holds everything any learning parameter
        applies to, so only a longer `max_age_days` reads again (the days before the cache
        starts; jobs read before are not new, so their samples are not read again). A new
        `file` is written at the next run; `dry_run` (None: unchanged) switches the mode, and
        going live writes the file at the next run.
        """
        if config.max_age_days > self.config.max_age_days:
            self._read_until = None
        if config.file != self.config.file:
            self._written = None
        self.config, self.classes = config, tuple(classes)
        if dry_run is not None and dry_run != self._dry_run:
            self._dry_run = dry_run
            self._written = None

    def tick_when_due(self) -> list[LearnedEntry] | None:
        """`tick()` at most once per `interval_s` (the controller's loop runs faster), or on every
        call while the history is still being read; None when not due or not read up to now."""
        now = self._monotonic()
        if not self._behind and self._last_run is not None and now - self._last_run < self.config.interval_s:
            return None
        self._last_run = now
        return self.tick()

    def tick(self) -> list[LearnedEntry] | None:
        """Read what is new, learn, write the table (not in dry-run); returns the entries, or None
        while the history is not read up to now yet (nothing learned or written)."""
        now = self._clock()
        oldest = now - self.config.max_age_days * 86400.0
        self._forget_before(oldest)
        if not self._read(oldest, now):
            return None
        entries = learn_jobs(self._jobs.values(), self.config, now, self.classes)
        LOG.debug("learned %d entries from %d job(s)", len(entries), len(self._jobs))
        self._write(format_table(entries), len(entries))
        return entries

    def _read(self, oldest: float, now: float) -> bool:
        """The windows from the read position up to now, at most `windows_per_tick`; True once at now."""
        since = oldest if self._read_until is None else max(oldest, self._read_until)
        edges = windows(datetime.fromtimestamp(since), datetime.fromtimestamp(now), timedelta(seconds=WINDOW_S))
        self._behind = False
        uids = functools.cache(self._uids)  # one lookup per user name a run: a window names few users, many times
        for index, (start, end) in enumerate(edges):
            if self._windows_per_tick is not None and index >= self._windows_per_tick:
                self._behind = True
                return False
            fresh = self._read_window(start, end, uids)
            self._keep_with_usage(fresh, oldest, now)  # before the position moves: a failure re-reads the window
            self._read_until = min(end.timestamp(), now - OVERLAP_S)
        return True

    def _read_window(self, start: datetime, end: datetime, uids: UidOf) -> dict[str, LearnedJob]:
        """The learnable runs that ended in [start, end] and are new: not in the cache, or ended later."""
        source = f"sacct window {start.isoformat()}..{end.isoformat()}"
        fresh: dict[str, LearnedJob] = {}
        for row in parse_sacct_output(self._sacct.run("sacct", ended_jobs_args(start, end)).stdout, source=source):
            if not isinstance(row, JobRecord) or row.end_ts is None:
                continue
            job = learned_job(history_job(row, uids))
            if job is None:
                continue
            known = fresh.get(row.job_id_raw) or self._jobs.get(row.job_id_raw)
            if known is None or known.end_ts < job.end_ts:  # strictly later: a job re-read in the overlap is not new
                fresh[row.job_id_raw] = job
        return fresh

    def _keep_with_usage(self, fresh: Mapping[str, LearnedJob], oldest: float, now: float) -> None:
        """Into the cache, each with what the agents saw of it (samples of the last max_age_days and a day)."""
        ids = sorted(fresh)
        usage: dict[str, JobUsage] = {}
        for start in range(0, len(ids), _ID_BATCH):
            usage.update(usage_from_slices(self._samples.job_slices(oldest - 86400.0, now + 1.0, ids[start:start + _ID_BATCH])))
        for job_id, job in fresh.items():
            seen = usage.get(job_id)
            self._jobs[job_id] = job if seen is None else replace(job, peak_vram_mib=seen.peak_vram_mib,
                                                                  sm_pct=seen.mean_sm_pct)

    def _forget_before(self, oldest: float) -> None:
        for job_id in [j for j, job in self._jobs.items() if job.end_ts < oldest]:
            del self._jobs[job_id]

    def _write(self, data: bytes, count: int) -> None:
        path = Path(self.config.file)
        if data == self._written:
            return
        if self._dry_run:
            LOG.info("dry-run: would write %d learned default(s) to %s", count, path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, data, mode=0o644)  # world-readable for slurmctld's hook
            LOG.info("wrote %d learned default(s) to %s", count, path)
        self._written = data


def with_learner(tick: Callable[[Any, Any], object] | None, learn: Callable[[], object]) -> Callable[[Any, Any], object]:
    """The controller's publisher tick (if any), then the learner's (`LearnedPublisher.tick_when_due`):
    both run, the first error is raised after."""
    def both(jobs: Any, nodes: Any) -> object:
        errors: list[Exception] = []
        parts: list[Callable[[], object]] = [learn]
        if tick is not None:
            parts.insert(0, lambda: tick(jobs, nodes))
        for part in parts:
            try:
                part()
            except Exception as error:  # noqa: BLE001 - one failing part must not starve the other
                errors.append(error)
        if errors:
            raise errors[0]
        return None
    return both


def open_learner(config: LearnedConfig, classes: Mapping[str, object] | Sequence[str], db_url: str | None, sacct: SacctRunner,
                 *, dry_run: bool = False, windows_per_tick: int | None = None) -> LearnedPublisher:
    """A production learner: the state database's samples and the given Slurm runner (`SlurmCli`)."""
    from slurm_aigc.db import open_database

    names = tuple(classes) or BASE_CLASSES
    return LearnedPublisher(sacct, SampleStore(open_database(db_url)), config, names, dry_run=dry_run,
                            windows_per_tick=windows_per_tick)
