"""The learner's daemon part: read the job history, learn, write the table the job_submit hook reads.

Run by `slurm-aigc controller` beside the feature publisher (policy `learned.enabled`), at most
every `learned.interval_s`, and once by `slurm-aigc learned update`. Each run:

1. reads the finished jobs from slurmdbd (`sacct --json` through `report.sacct.SacctReader`): the
   whole `max_age_days` on the first run, then only from the last read (minus an overlap, as
   slurmdbd records job ends late) into a cache of the jobs by id, dropping those too old;
2. reads the agents' samples of the jobs new to the cache (`report.samples.SampleStore`, which
   also reads the hourly rollups older than the raw retention): peak memory and mean SM;
3. calls the pure learner (`telemetry.learned.learn`) and writes the table with the one atomic
   write (`fsio`), mode 0644, only when its bytes change. In dry-run nothing is written.
"""

from __future__ import annotations

import logging
import pwd
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from slurm_aigc.fsio import atomic_write_bytes
from slurm_aigc.policy.model import BASE_CLASSES, LearnedConfig
from slurm_aigc.report.sacct import JobRecord, SacctQuery, SacctReader, SacctRunner
from slurm_aigc.report.samples import SampleStore
from slurm_aigc.telemetry.learned import HistoryJob, JobUsage, LearnedEntry, format_table, learn, usage_from_slices

LOG = logging.getLogger(__name__)

# slurmdbd records a job's end a little after it happens: re-read this much before the last read.
OVERLAP_S = 3600.0
_ID_BATCH = 500  # job ids per samples query (bounded IN lists)

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


class LearnedPublisher:
    """Learns the table from sacct and the samples and writes `config.file`; `tick()` is one run."""

    def __init__(self, sacct: SacctRunner, samples: SampleStore, config: LearnedConfig,
                 classes: Sequence[str] = BASE_CLASSES, *, dry_run: bool = False, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, uids: UidOf = uid_of) -> None:
        self._sacct = sacct
        self._samples = samples
        self.config = config
        self.classes = tuple(classes)
        self._dry_run = dry_run
        self._clock = clock
        self._monotonic = monotonic
        self._uids = uids
        self._jobs: dict[str, HistoryJob] = {}
        self._usage: dict[str, JobUsage] = {}
        self._read_until: float | None = None
        self._last_run: float | None = None
        self._written: bytes | None = None

    def set_config(self, config: LearnedConfig, classes: Sequence[str], dry_run: bool | None = None) -> None:
        """Use a new (validated) config from the next run on (SIGHUP); the history is read afresh.

        `dry_run` (None: unchanged) switches the mode; going live writes the file at the next run.
        """
        self.config, self.classes = config, tuple(classes)
        self._read_until = None
        if dry_run is not None and dry_run != self._dry_run:
            self._dry_run = dry_run
            self._written = None

    def tick_when_due(self) -> list[LearnedEntry] | None:
        """`tick()` at most once per `interval_s` (the controller's loop runs faster); None when not due."""
        now = self._monotonic()
        if self._last_run is not None and now - self._last_run < self.config.interval_s:
            return None
        self._last_run = now
        return self.tick()

    def tick(self) -> list[LearnedEntry]:
        """Read what is new, learn, write the table (not in dry-run); returns the entries."""
        now = self._clock()
        oldest = now - self.config.max_age_days * 86400.0
        since = oldest if self._read_until is None else max(oldest, self._read_until - OVERLAP_S)
        fresh = self._read_history(since, now)
        self._read_until = now
        self._forget_before(oldest)
        self._read_usage(fresh, oldest, now)
        entries = learn(self._jobs.values(), self._usage, self.config, now, self.classes)
        self._write(format_table(entries), len(entries))
        return entries

    def _read_history(self, since: float, until: float) -> list[str]:
        """Finished GPU jobs of [since, until] into the cache; returns the ids whose usage is to read."""
        query = SacctQuery(since=datetime.fromtimestamp(since), until=datetime.fromtimestamp(until))
        fresh = []
        for row in SacctReader(self._sacct).rows(query):
            if not isinstance(row, JobRecord) or row.end_ts is None:
                continue
            job = history_job(row, self._uids)
            known = self._jobs.get(job.job_id)
            if job.gpus > 0 and (known is None or (known.end_ts or 0.0) <= (job.end_ts or 0.0)):
                self._jobs[job.job_id] = job
                fresh.append(job.job_id)
        return fresh

    def _forget_before(self, oldest: float) -> None:
        for job_id in [j for j, job in self._jobs.items() if (job.end_ts or 0.0) < oldest]:
            del self._jobs[job_id]
            self._usage.pop(job_id, None)

    def _read_usage(self, job_ids: Iterable[str], since: float, until: float) -> None:
        ids = sorted(set(job_ids))
        for start in range(0, len(ids), _ID_BATCH):
            batch = ids[start:start + _ID_BATCH]
            found = usage_from_slices(self._samples.job_slices(since - 86400.0, until + 1.0, batch))
            self._usage.update(found)

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


def with_learner(tick: Callable[[Any, Any], object] | None, learner: LearnedPublisher) -> Callable[[Any, Any], object]:
    """The controller's publisher tick (if any), then the learner's: both run, the first error is raised after."""
    def both(jobs: Any, nodes: Any) -> object:
        errors: list[Exception] = []
        parts: list[Callable[[], object]] = [learner.tick_when_due]
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
                 *, dry_run: bool = False) -> LearnedPublisher:
    """A production learner: the state database's samples and the given Slurm runner (`SlurmCli`)."""
    from slurm_aigc.db import open_database

    names = tuple(classes) or BASE_CLASSES
    return LearnedPublisher(sacct, SampleStore(open_database(db_url)), config, names, dry_run=dry_run)
