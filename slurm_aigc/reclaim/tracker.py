"""Stretches of every GPU series kept between controller ticks, so a tick reads only new samples.

A full tick over 10,000 jobs x 8 GPUs would re-read and re-judge each window's samples
every poll; the tracker folds each new batch of samples into per-series summaries
(`detect.extend`) instead. It gives the same verdicts as `detect` over the full window
(tested), only without the per-window readings (max util, memory) in the evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from slurm_aigc.reclaim.config import ReclaimConfig
from slurm_aigc.reclaim.detect import (
    PREDICATES,
    BoolArray,
    IntArray,
    JobMeta,
    SampleBatch,
    Stretches,
    Verdict,
    bare_evidence,
    extend,
    judge,
    stretches,
)

SeriesKey = tuple[str, str, int]  # job id, node, GPU index


def series_keys(batch: SampleBatch) -> list[SeriesKey]:
    """The (job, node, GPU) of every series of `batch`, in batch order."""
    job_ids = [m.job_id for m in batch.metas]
    jobs = np.repeat(np.arange(len(job_ids)), np.diff(batch.job_offsets)).tolist()
    return [(job_ids[j], node, gpu) for j, node, gpu in zip(jobs, batch.series_node, batch.series_gpu)]


class StretchTracker:
    """Per-series stretches across ticks, keyed by (job, node, GPU)."""

    def __init__(self) -> None:
        self._keys: list[SeriesKey] = []
        self._state: Stretches | None = None

    def __len__(self) -> int:
        return len(self._keys)

    def jobs(self) -> set[str]:
        return {key[0] for key in self._keys}

    def last_ts(self) -> dict[SeriesKey, float]:
        """Newest sample time per series: rows at or before it were already folded in."""
        if self._state is None:
            return {}
        return dict(zip(self._keys, self._state.last_ts.tolist()))

    def update(self, batch: SampleBatch, config: ReclaimConfig) -> None:
        """Fold a batch of samples newer than each series' `last_ts` into the stretches."""
        if not batch.metas:
            return
        newer = stretches(batch, config.classes, config.defaults, config.gap_s)
        keys = series_keys(batch)
        index = {key: row for row, key in enumerate(self._keys)}
        rows = np.asarray([index.get(key, -1) for key in keys], dtype=np.int64)
        known = rows >= 0
        state: Stretches | None
        if self._state is not None and known.any():
            updated = extend(self._state.take(rows[known]), newer.take(np.flatnonzero(known)), config.gap_s)
            state = _assign(self._state, rows[known], updated)
        else:
            state = self._state
        added = np.flatnonzero(~known)
        fresh = newer.take(added)
        self._state = fresh if state is None else _concat(state, fresh)
        self._keys = self._keys + [keys[i] for i in added.tolist()]

    def prune(self, metas: Mapping[str, JobMeta], oldest_ts: float) -> None:
        """Forget series of jobs no longer running, of an earlier run of the job, or too old."""
        if self._state is None:
            return
        last = self._state.last_ts.tolist()
        keep = [i for i, (key, ts) in enumerate(zip(self._keys, last))
                if key[0] in metas and ts >= metas[key[0]].start_ts and ts >= oldest_ts]
        rows = np.asarray(keep, dtype=np.int64)
        self._state = self._state.take(rows)
        self._keys = [self._keys[i] for i in keep]

    def verdicts(self, metas: Mapping[str, JobMeta], config: ReclaimConfig, now_ts: float) -> list[Verdict]:
        """Verdicts of every tracked job (jobs without series are the caller's: no samples)."""
        if self._state is None or not self._keys:
            return []
        order = sorted(range(len(self._keys)), key=self._keys.__getitem__)
        keys = [self._keys[i] for i in order]
        found = self._state.take(np.asarray(order, dtype=np.int64))
        job_ids = sorted({key[0] for key in keys})
        counts = np.asarray([sum(1 for _ in group) for group in _runs(keys)], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        evidence = bare_evidence(found, [k[1] for k in keys], [k[2] for k in keys])
        return judge([metas[j] for j in job_ids], offsets, found, config.classes, config.defaults, now_ts,
                     config.gap_s, evidence)


def _runs(keys: Sequence[SeriesKey]) -> list[list[SeriesKey]]:
    groups: list[list[SeriesKey]] = []
    for key in keys:
        if groups and groups[-1][0][0] == key[0]:
            groups[-1].append(key)
        else:
            groups.append([key])
    return groups


def _columns(found: Stretches) -> dict[str, np.ndarray]:
    columns: dict[str, np.ndarray] = {"first_ts": found.first_ts, "last_ts": found.last_ts}
    for name in PREDICATES:
        columns[f"start_ts.{name}"] = found.start_ts[name]
        columns[f"count.{name}"] = found.count[name]
        columns[f"whole.{name}"] = found.whole[name]
    return columns


def _from_columns(columns: Mapping[str, np.ndarray]) -> Stretches:
    start: dict[str, np.ndarray] = {}
    count: dict[str, IntArray] = {}
    whole: dict[str, BoolArray] = {}
    for name in PREDICATES:
        start[name] = columns[f"start_ts.{name}"]
        count[name] = columns[f"count.{name}"]
        whole[name] = columns[f"whole.{name}"]
    return Stretches(columns["first_ts"], columns["last_ts"], start, count, whole)


def _assign(base: Stretches, rows: IntArray, values: Stretches) -> Stretches:
    columns = {name: column.copy() for name, column in _columns(base).items()}
    for name, column in _columns(values).items():
        columns[name][rows] = column
    return _from_columns(columns)


def _concat(first: Stretches, second: Stretches) -> Stretches:
    a, b = _columns(first), _columns(second)
    return _from_columns({name: np.concatenate([a[name], b[name]]) for name in a})
