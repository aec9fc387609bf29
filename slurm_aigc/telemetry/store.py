"""Telemetry rows in the state database (tables defined in `slurm_aigc/db.py`).

The agent writes one transaction per poll: every GPU (`gpu_samples`), every compute
process with its job (`process_samples`) and every job's use of every GPU
(`job_gpu_samples`). The publisher reads node utilization back and records each change
it makes to Slurm (`node_publications`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from sqlalchemy import Table, delete, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import (
    GpuSample,
    JobGpuSample,
    NodePublication,
    ProcessSample,
    transaction,
)
from slurm_aigc.telemetry.records import GpuReading, NodeReading


class JobGpuUse(Protocol):
    """A job's share of one GPU at one poll (`attribution.JobGpuUsage`)."""

    @property
    def job_id(self) -> str: ...
    @property
    def gpu_index(self) -> int: ...
    @property
    def sm_util_pct(self) -> float | None: ...
    @property
    def memory_used_mib(self) -> float | None: ...
    @property
    def shared(self) -> bool: ...


@dataclass(frozen=True)
class Publication:
    """One change the publisher or the agent made (or, in dry-run, would make) to a node."""

    ts: float
    node: str
    features_before: tuple[str, ...] | None
    features_after: tuple[str, ...] | None
    weight_before: int | None
    weight_after: int | None
    reason: str
    dry_run: bool


class TelemetryStore:
    """Reads and writes of the telemetry tables; one transaction per call."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory

    def write_poll(self, reading: NodeReading, pid_jobs: Mapping[int, str | None], uses: Sequence[JobGpuUse]) -> int:
        """Store one poll of one node; returns the number of rows written."""
        ts = reading.ts.timestamp()
        tables: list[tuple[type[GpuSample] | type[ProcessSample] | type[JobGpuSample], list[dict[str, object]]]] = [
            (GpuSample, [_gpu_row(ts, reading.node, gpu) for gpu in reading.gpus]),
            (ProcessSample, [
                {"ts": ts, "node": reading.node, "gpu_index": gpu.index, "pid": proc.pid, "job_id": pid_jobs.get(proc.pid),
                 "used_memory_mib": proc.used_memory_mib, "sm_util_pct": proc.sm_util_pct}
                for gpu in reading.gpus for proc in gpu.processes]),
            (JobGpuSample, [_job_row(ts, reading, use) for use in uses]),
        ]
        with transaction(self._factory) as session:
            # Plain INSERTs (no RETURNING of the new ids): the agent's database role may insert
            # samples but not read them (docs/deploy.md). Through the Core table: an ORM bulk insert
            # on PostgreSQL adds RETURNING id for a batch of one row (rows split by their NULLs).
            for model, rows in tables:
                if rows:
                    session.execute(insert(cast(Table, model.__table__)), rows)
        return sum(len(rows) for _, rows in tables)

    def mean_util_by_node(self, since_ts: float) -> dict[str, float]:
        """Mean SM utilization per node over the GPU samples since `since_ts` (lost GPUs and nulls skipped)."""
        query = (
            select(GpuSample.node, func.avg(GpuSample.sm_util_pct))
            .where(GpuSample.ts >= since_ts, GpuSample.lost.is_(False), GpuSample.sm_util_pct.is_not(None))
            .group_by(GpuSample.node)
        )
        with transaction(self._factory) as session:
            return {node: float(mean) for node, mean in session.execute(query) if mean is not None}

    def gpu_utilization_since(self, since_ts: float) -> list[tuple[float, str, int, float | None]]:
        """(ts, node, gpu_index, sm_util_pct) of every GPU sample since `since_ts`, lost GPUs skipped (replay metrics)."""
        query = (
            select(GpuSample.ts, GpuSample.node, GpuSample.gpu_index, GpuSample.sm_util_pct)
            .where(GpuSample.ts >= since_ts, GpuSample.lost.is_(False))
        )
        with transaction(self._factory) as session:
            return [(float(ts), node, int(index), util) for ts, node, index, util in session.execute(query)]

    def gpu_power_utilization_since(self, since_ts: float) -> list[tuple[float, str, int, float | None, float | None, float | None]]:
        """(ts, node, gpu_index, sm_util_pct, power_draw_w, power_limit_w) since `since_ts`, lost GPUs skipped
        (replay's useful utilization: high SM at low power is fake-busy)."""
        query = (
            select(GpuSample.ts, GpuSample.node, GpuSample.gpu_index, GpuSample.sm_util_pct,
                   GpuSample.power_draw_w, GpuSample.power_limit_w)
            .where(GpuSample.ts >= since_ts, GpuSample.lost.is_(False))
        )
        with transaction(self._factory) as session:
            return [(float(ts), node, int(index), util, power, limit)
                    for ts, node, index, util, power, limit in session.execute(query)]

    def job_sm_since(self, since_ts: float) -> list[tuple[float, str, int, str, float | None]]:
        """(ts, node, gpu_index, job_id, sm_util_pct) since `since_ts`: each job's share of its GPUs' SM
        (replay: the share a job spent hung on a GPU it shared is taken out of useful utilization)."""
        query = (
            select(JobGpuSample.ts, JobGpuSample.node, JobGpuSample.gpu_index, JobGpuSample.job_id,
                   JobGpuSample.sm_util_pct)
            .where(JobGpuSample.ts >= since_ts)
        )
        with transaction(self._factory) as session:
            return [(float(ts), node, int(index), str(job_id), util) for ts, node, index, job_id, util in session.execute(query)]

    def record_publication(self, publication: Publication) -> int:
        """Append one row to `node_publications`; its id (for `forget_publication`)."""
        with transaction(self._factory) as session:
            row = _publication_row(publication)
            session.add(row)
            session.flush()
            return int(row.id)

    def forget_publication(self, row_id: int) -> None:
        """Remove a row recorded before a write that Slurm then refused: it never happened."""
        with transaction(self._factory) as session:
            session.execute(delete(NodePublication).where(NodePublication.id == row_id))

    def record_publications(self, publications: Sequence[Publication]) -> None:
        """Append rows to `node_publications` in one transaction (a dry-run cycle's, at once)."""
        with transaction(self._factory) as session:
            session.add_all([_publication_row(p) for p in publications])

    def publications(self, node: str | None = None) -> list[Publication]:
        """Every recorded change, oldest first (of one node when given)."""
        query = select(NodePublication).order_by(NodePublication.ts, NodePublication.id)
        if node is not None:
            query = query.where(NodePublication.node == node)
        with transaction(self._factory) as session:
            return [_publication(row) for row in session.scalars(query)]

    def last_published_weights(self) -> dict[str, int]:
        """The weight last written (not dry-run) to each node: seeds the publisher after a restart."""
        weights: dict[str, int] = {}
        query = (
            select(NodePublication.node, NodePublication.weight_after)
            .where(NodePublication.dry_run.is_(False), NodePublication.weight_after.is_not(None))
            .order_by(NodePublication.ts, NodePublication.id)
        )
        with transaction(self._factory) as session:
            for node, weight in session.execute(query):
                if weight is not None:
                    weights[node] = int(weight)
        return weights


def _publication_row(p: Publication) -> NodePublication:
    return NodePublication(
        ts=p.ts, node=p.node, features_before=_join(p.features_before), features_after=_join(p.features_after),
        weight_before=p.weight_before, weight_after=p.weight_after, reason=p.reason, dry_run=p.dry_run,
    )


def _gpu_row(ts: float, node: str, gpu: GpuReading) -> dict[str, object]:
    return {
        "ts": ts, "node": node, "gpu_index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "lost": gpu.lost,
        "memory_total_mib": gpu.memory_total_mib, "memory_used_mib": gpu.memory_used_mib,
        "sm_util_pct": gpu.sm_util_pct, "mem_bw_util_pct": gpu.mem_bw_util_pct,
        "power_draw_w": gpu.power_draw_w, "power_limit_w": gpu.power_limit_w, "temperature_c": gpu.temperature_c,
    }


def _job_row(ts: float, reading: NodeReading, use: JobGpuUse) -> dict[str, object]:
    # Memory total and power are the GPU's: power cannot be split between jobs, and the
    # idle detectors read "busy yet cool" from the whole GPU.
    gpu = reading.gpu(use.gpu_index)
    return {
        "ts": ts, "node": reading.node, "job_id": use.job_id, "gpu_index": use.gpu_index,
        "sm_util_pct": use.sm_util_pct, "memory_used_mib": use.memory_used_mib,
        "memory_total_mib": gpu.memory_total_mib if gpu else None, "power_draw_w": gpu.power_draw_w if gpu else None,
        "power_limit_w": gpu.power_limit_w if gpu else None, "shared": use.shared,
    }


def _join(features: tuple[str, ...] | None) -> str | None:
    return None if features is None else ",".join(features)


def _split(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(f for f in text.split(",") if f)


def _publication(row: NodePublication) -> Publication:
    return Publication(
        ts=row.ts, node=row.node, features_before=_split(row.features_before), features_after=_split(row.features_after),
        weight_before=row.weight_before, weight_after=row.weight_after, reason=row.reason, dry_run=row.dry_run,
    )
