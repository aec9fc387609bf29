"""Reclaim's use of the database: the `actions` audit trail and the `job_gpu_samples` it judges.

Every write goes through `slurm_aigc.db.transaction`, so a database that is down surfaces
as DatabaseError (the controller then waits and retries; it never acts without a record).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import String, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import ActionRecord, JobGpuSample, transaction
from slurm_aigc.reclaim.ladder import PastAction, PlannedAction

T = TypeVar("T")

# Batches of keys (job ids, row ids) per `IN (...)`: SQLite allows 32766 bound parameters since 3.32, older 999.
_IN_CHUNK = 900


@dataclass(frozen=True)
class ActionRow:
    """One row of the audit trail (`slurm-aigc audit`)."""

    id: int
    observation_key: str
    ts_intent: float
    ts_outcome: float | None
    job_id: str
    user: str | None
    account: str | None
    job_class: str | None
    verdict: str
    action: str
    step: int
    dry_run: bool
    state: str
    detail: Mapping[str, Any]
    gpus_before: int | None
    gpus_after: int | None
    gpu_hours_recovered: float | None

    def as_past(self) -> PastAction:
        return PastAction(self.observation_key, self.job_id, self.verdict, self.action, self.state,
                          self.dry_run, self.ts_intent, self.ts_outcome)


class SampleRow(NamedTuple):
    """A `job_gpu_samples` row, as the detectors read it (a tuple: 10,000s are built each tick)."""

    id: int
    job_id: str
    node: str
    gpu_index: int
    ts: float
    sm_util_pct: float | None
    memory_used_mib: float | None
    power_draw_w: float | None
    power_limit_w: float | None
    shared: bool


def _column_length(column: Any) -> int:
    kind = column.type
    assert isinstance(kind, String) and kind.length is not None, column
    return kind.length


# Slurm allows longer user and account names than the audit's columns hold, and MariaDB and
# PostgreSQL refuse an overlong value: the intent (so the action) of every such job failed at every
# tick. The audit keeps a prefix; the full names stay in Slurm. The loader holds the policy's class
# names to the job_class column; clipped too for jobs a policy from before that check stamped.
_USER_LENGTH = _column_length(ActionRecord.__table__.c.user)
_ACCOUNT_LENGTH = _column_length(ActionRecord.__table__.c.account)
_CLASS_LENGTH = _column_length(ActionRecord.__table__.c.job_class)

# In SampleRow's field order, so that a result row converts positionally.
_SAMPLE_COLUMNS = tuple(getattr(JobGpuSample, name) for name in SampleRow._fields)


class ReclaimStore:
    """Reads samples and reads/writes the action audit trail."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory

    def record_intent(self, plan: PlannedAction, detail: Mapping[str, Any], now_ts: float) -> int | None:
        """Insert the intent row; None when the observation key is already recorded (never act twice)."""
        with transaction(self._factory) as session:
            if session.scalar(select(ActionRecord.id).where(ActionRecord.observation_key == plan.observation_key)):
                return None
            row = ActionRecord(
                observation_key=plan.observation_key, ts_intent=now_ts, job_id=plan.job_id,
                user=_clipped(plan.user, _USER_LENGTH), account=_clipped(plan.account, _ACCOUNT_LENGTH),
                job_class=_clipped(plan.job_class, _CLASS_LENGTH), verdict=plan.verdict, action=plan.action,
                step=plan.step, dry_run=plan.dry_run, state="intent", detail=json.dumps(dict(detail), sort_keys=True),
                gpus_before=plan.gpus_before, gpus_after=plan.gpus_after, gpu_hours_recovered=plan.gpu_hours_recovered,
            )
            session.add(row)
            session.flush()
            return int(row.id)

    def record_outcome(self, action_id: int, state: str, detail: Mapping[str, Any], now_ts: float) -> None:
        """Close an intent with its outcome (done | failed | skipped) and the merged detail."""
        with transaction(self._factory) as session:
            row = session.get(ActionRecord, action_id)
            if row is None:
                return
            merged = {**_load_detail(row.detail), **detail}
            row.state, row.ts_outcome, row.detail = state, now_ts, json.dumps(merged, sort_keys=True)

    def record_progress(self, action_id: int, detail: Mapping[str, Any]) -> None:
        """Merge `detail` into an intent that stays open (a shrink waiting for its job to be PENDING)."""
        with transaction(self._factory) as session:
            row = session.get(ActionRecord, action_id)
            if row is not None:
                row.detail = json.dumps({**_load_detail(row.detail), **detail}, sort_keys=True)

    def open_intents(self) -> list[ActionRow]:
        """Live intents without an outcome: the controller stopped between the two writes."""
        query = select(ActionRecord).where(ActionRecord.state == "intent", ActionRecord.dry_run.is_(False))
        return self._rows(query.order_by(ActionRecord.id))

    def history(self, job_ids: Iterable[str]) -> dict[str, list[PastAction]]:
        """Every recorded action of these jobs, by job id."""
        result: dict[str, list[PastAction]] = {}
        for chunk in _chunks(sorted(set(job_ids))):
            for row in self._rows(select(ActionRecord).where(ActionRecord.job_id.in_(chunk))):
                result.setdefault(row.job_id, []).append(row.as_past())
        return result

    def audit(self, job_id: str | None = None, since_ts: float | None = None, action: str | None = None) -> list[ActionRow]:
        """Rows of the audit trail, oldest first, filtered like `slurm-aigc audit`."""
        query = select(ActionRecord)
        if job_id:
            query = query.where(ActionRecord.job_id == job_id)
        if since_ts is not None:
            query = query.where(ActionRecord.ts_intent >= since_ts)
        if action:
            query = query.where(ActionRecord.action == action)
        return self._rows(query.order_by(ActionRecord.ts_intent, ActionRecord.id))

    def samples(self, job_ids: Iterable[str], since_ts: float) -> list[SampleRow]:
        """`job_gpu_samples` of these jobs since `since_ts`, sorted by job, node, GPU, time."""
        return self._samples(job_ids, JobGpuSample.ts >= since_ts)

    def samples_after(self, job_ids: Iterable[str], after_id: int) -> list[SampleRow]:
        """Rows of these jobs inserted after row `after_id` (the controller's incremental read)."""
        return self._samples(job_ids, JobGpuSample.id > after_id)

    def sample_ids(self, after_id: int, upto_id: int, since_ts: float) -> set[int]:
        """Ids of the `job_gpu_samples` rows (every job) in (after_id, upto_id] since `since_ts`."""
        query = select(JobGpuSample.id).where(JobGpuSample.id > after_id, JobGpuSample.id <= upto_id,
                                              JobGpuSample.ts >= since_ts)
        with transaction(self._factory) as session:
            return set(session.connection().execute(query).scalars().all())

    def sample_ids_in(self, ranges: Sequence[tuple[int, int]], since_ts: float) -> set[int]:
        """Ids of the `job_gpu_samples` rows (every job) in any of the closed id `ranges` since `since_ts`."""
        if not ranges:
            return set()
        query = select(JobGpuSample.id).where(JobGpuSample.ts >= since_ts,
                                              or_(*(JobGpuSample.id.between(low, high) for low, high in ranges)))
        with transaction(self._factory) as session:
            return set(session.connection().execute(query).scalars().all())

    def samples_by_id(self, ids: Iterable[int]) -> list[SampleRow]:
        """These rows, sorted by job, node, GPU, time."""
        return self._samples(ids, None, key=JobGpuSample.id)

    def _samples(self, keys: Iterable[Any], condition: Any, key: Any = JobGpuSample.job_id) -> list[SampleRow]:
        rows: list[SampleRow] = []
        with transaction(self._factory) as session:
            # Core rows fetched at once: the ORM's row loading, or one fetch per row, cost 0.1-0.2 s
            # a tick over 10,000 jobs.
            connection = session.connection()
            for chunk in _chunks(sorted(set(keys))):
                query = select(*_SAMPLE_COLUMNS).where(key.in_(chunk))
                if condition is not None:
                    query = query.where(condition)
                rows.extend(map(SampleRow._make, connection.execute(query).fetchall()))
        rows.sort(key=lambda r: (r.job_id, r.node, r.gpu_index, r.ts))
        return rows

    def gpu_hours_recovered(self) -> float:
        """GPU-hours recovered by every action that was done for real (not dry run)."""
        query = (
            select(func.coalesce(func.sum(ActionRecord.gpu_hours_recovered), 0.0))
            .where(ActionRecord.state == "done", ActionRecord.dry_run.is_(False))
        )
        with transaction(self._factory) as session:
            return float(session.scalar(query) or 0.0)

    def newest_sample_ts(self) -> float | None:
        """Time of the newest job sample of any job: how fresh the agents' data is."""
        with transaction(self._factory) as session:
            value = session.scalar(select(func.max(JobGpuSample.ts)))
        return None if value is None else float(value)

    def _rows(self, query: Any) -> list[ActionRow]:
        with transaction(self._factory) as session:
            return [_action_row(r) for r in session.scalars(query)]


def _chunks(values: Sequence[T]) -> Iterable[Sequence[T]]:
    for start in range(0, len(values), _IN_CHUNK):
        yield values[start:start + _IN_CHUNK]


def _clipped(value: str | None, length: int) -> str | None:
    return None if value is None else value[:length]


def _load_detail(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"text": text}
    return value if isinstance(value, dict) else {"text": text}


def _action_row(row: ActionRecord) -> ActionRow:
    return ActionRow(
        id=row.id, observation_key=row.observation_key, ts_intent=row.ts_intent, ts_outcome=row.ts_outcome,
        job_id=row.job_id, user=row.user, account=row.account, job_class=row.job_class, verdict=row.verdict,
        action=row.action, step=row.step, dry_run=bool(row.dry_run), state=row.state,
        detail=_load_detail(row.detail), gpus_before=row.gpus_before, gpus_after=row.gpus_after,
        gpu_hours_recovered=row.gpu_hours_recovered,
    )
