"""Reading job allocations from slurmdbd through `sacct --json` (via the Slurm boundary).

Why JSON: the job name, comment and work directory are user text. Any delimiter sacct
can print (`|`, `--delimiter=X`, even an ASCII unit separator) can be typed into
`sbatch --comment` together with a newline, so with `--parsable2` a comment could close
its own row and add a whole record (192 GPU-hours charged to another user). In
`sacct --json` (22.05's `dbv0.0.38` and 23.02+'s data_parser alike) user text is a quoted
string value and cannot leave it. Every record becomes either a `JobRecord` or a
`SkippedRow` with the reason: nothing is dropped silently. Long ranges are read window by
window so that one sacct answer stays small.

Slurm 23.02+ with NVML autodetection records `gres/gpuutil` and `gres/gpumem` per step
(`TRESUsageInAve`/`TRESUsageInMax`, JSON `steps[].tres.requested`); they are read into
`sacct_gpu_util_pct`/`sacct_gpu_mem_mib` for reports to use where agent samples are missing.
22.05 records neither (those stay None).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, tzinfo
from typing import Protocol

from slurm_aigc import slurmjson
from slurm_aigc.errors import AigcError, SlurmCommandError, SlurmParseError
from slurm_aigc.report.tres import Tres, TresParseError, parse_tres
from slurm_aigc.tags import trusted_class

log = logging.getLogger(__name__)

UNKNOWN_CLASS = "unknown"
REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})


class SacctRunner(Protocol):
    """What the reader needs of `slurm_aigc.slurm.SlurmCli`."""

    def run(self, tool: str, args: Sequence[str]) -> _HasStdout: ...


class _HasStdout(Protocol):
    @property
    def stdout(self) -> str: ...


class RowError(AigcError):
    """One sacct row could not be read; becomes a SkippedRow with this message."""


@dataclass(frozen=True)
class JobRecord:
    """One allocation record (`sacct -X -D`): a requeued job has one per run segment."""

    job_id: str
    job_id_raw: str
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    submit_ts: float | None
    eligible_ts: float | None
    start_ts: float | None
    end_ts: float | None
    elapsed_s: int
    tres: Tres
    alloc_tres: str
    node_list: str
    comment: str
    admin_comment: str
    aigc_class: str
    line_no: int = 0  # the record's position in sacct's `jobs` list (1-based)
    sacct_gpu_util_pct: float | None = None  # Slurm 23.02+ gres/gpuutil, per allocated GPU (see _gpu_usage)
    sacct_gpu_mem_mib: float | None = None  # Slurm 23.02+ gres/gpumem, peak per step

    @property
    def requeued(self) -> bool:
        return self.state in REQUEUE_STATES

    @property
    def running(self) -> bool:
        return self.start_ts is not None and self.end_ts is None

    @property
    def queue_wait_s(self) -> float | None:
        """Submit (reset by each requeue) to start, None while still pending."""
        if self.start_ts is None or self.submit_ts is None:
            return None
        return max(0.0, self.start_ts - self.submit_ts)


@dataclass(frozen=True)
class SkippedRow:
    """A sacct record we could not use, with why; `line_no` is its position, `source` names the sacct call."""

    line_no: int
    raw: str
    reason: str
    source: str = ""


Row = JobRecord | SkippedRow


@dataclass(frozen=True)
class SacctQuery:
    """`sacct -S SINCE -E UNTIL [-u ..] [-A ..] [-r ..] [--name ..]`; classes are filtered here, not by sacct."""

    since: datetime
    until: datetime
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    job_ids: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    classes: tuple[str, ...] = field(default=())
    # Also each job's steps, inside its record: the only place of Slurm 23.02+'s gres/gpuutil and
    # gres/gpumem (`-X` makes slurmdbd leave steps out). Off where they are not read: they add
    # most of the output.
    steps: bool = False


def aigc_class_of(admin_comment: str) -> str:
    """The class the hook stamped into the AdminComment (never the user's comment), else unknown."""
    return trusted_class(admin_comment)


def sacct_args(start: datetime, end: datetime, query: SacctQuery) -> list[str]:
    """Arguments of one `sacct` call for the window [start, end)."""
    args = [] if query.steps else ["--allocations"]
    args += ["--duplicates", "--json", f"--starttime={_slurm_time(start)}", f"--endtime={_slurm_time(end)}"]
    args += [f"--user={','.join(query.users)}"] if query.users else ["--allusers"]
    if query.accounts:
        args.append(f"--accounts={','.join(query.accounts)}")
    if query.partitions:
        args.append(f"--partition={','.join(query.partitions)}")
    if query.job_ids:
        args.append(f"--jobs={','.join(query.job_ids)}")
    if query.names:
        args.append(f"--name={','.join(query.names)}")
    return args


def _slurm_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def window_count(since: datetime, until: datetime, chunk: timedelta) -> int:
    """How many windows `windows(since, until, chunk)` cuts, without building them.

    Integer division of microseconds: a float quotient rounds off the last microsecond
    of a span over 2**53 us (285 years) and counts one window less than there are.
    """
    if chunk <= timedelta(0):
        raise ValueError("chunk must be positive")
    return max(0, -((since - until) // chunk))  # the ceiling of (until - since) / chunk


def windows(since: datetime, until: datetime, chunk: timedelta) -> list[tuple[datetime, datetime]]:
    """[since, until) cut into consecutive windows of at most `chunk`."""
    return [(since + i * chunk, min(since + (i + 1) * chunk, until)) for i in range(window_count(since, until, chunk))]


def parse_sacct_output(text: str, *, tz: tzinfo | None = None, source: str = "") -> Iterator[Row]:
    """Parse `sacct --json` output into records and skipped records.

    Raises SlurmParseError when the answer is not sacct's JSON (then nothing can be
    trusted). JSON times are epoch seconds, so `tz` is not needed; it is accepted for
    callers that pass it.
    """
    what = source or "sacct --json"
    data = slurmjson.load(text, what)
    for index, job in enumerate(slurmjson.records(data, "jobs", what), start=1):
        yield _row(index, job, source)


def _row(index: int, job: slurmjson.JsonObject, source: str) -> Row:
    try:
        return _record(index, job)
    except (RowError, TresParseError, SlurmParseError) as error:
        return SkippedRow(index, json.dumps(job, ensure_ascii=False)[:2000], str(error), source)


def _record(index: int, job: slurmjson.JsonObject) -> JobRecord:
    t, n = slurmjson.text, slurmjson.number
    raw_id = n(job.get("job_id"))
    state = slurmjson.job_state((job.get("state") or {}).get("current"))
    if not raw_id or not state:
        raise RowError("no job_id or state")
    times = job.get("time") or {}
    submit_ts = _timestamp(times.get("submission"))
    if submit_ts is None:
        raise RowError(f"job {raw_id}: no submit time (every job has one)")
    comments = job.get("comment") or {}
    alloc = slurmjson.tres_text((job.get("tres") or {}).get("allocated"))
    admin_comment = t(comments.get("administrator"))
    tres = parse_tres(alloc)
    util, mem = _gpu_usage(job.get("steps") or [], tres.gpus)
    return JobRecord(
        job_id=_display_id(job, raw_id), job_id_raw=str(raw_id), name=t(job.get("name")), user=t(job.get("user")),
        account=t(job.get("account")), partition=t(job.get("partition")), qos=t(job.get("qos")),
        state=state.split(" ", 1)[0].rstrip("+"),
        submit_ts=submit_ts, eligible_ts=_timestamp(times.get("eligible")),
        start_ts=_timestamp(times.get("start")), end_ts=_timestamp(times.get("end")),
        elapsed_s=n(times.get("elapsed")) or 0, tres=tres, alloc_tres=alloc,
        node_list=_none_empty(t(job.get("nodes"))), comment=t(comments.get("job")), admin_comment=admin_comment,
        aigc_class=aigc_class_of(admin_comment), line_no=index, sacct_gpu_util_pct=util, sacct_gpu_mem_mib=mem,
    )


def _display_id(job: slurmjson.JsonObject, raw_id: int) -> str:
    """sacct's JobID: `ARRAY_TASK` for an array task, `HET+OFFSET` for a het component, else the id."""
    array, het = job.get("array") or {}, job.get("het") or {}
    array_id, task = slurmjson.number(array.get("job_id")), slurmjson.number(array.get("task_id"))
    if array_id:
        return f"{array_id}_{task}" if task is not None else f"{array_id}_[{slurmjson.text(array.get('task'))}]"
    het_id, offset = slurmjson.number(het.get("job_id")), slurmjson.number(het.get("job_offset"))
    if het_id and offset is not None:
        return f"{het_id}+{offset}"
    return str(raw_id)


def _timestamp(value: object) -> float | None:
    """Epoch seconds; 0 or unset means the moment has not come (not started, not ended)."""
    seconds = slurmjson.number(value)
    return float(seconds) if seconds else None


def _gpu_usage(steps: Sequence[slurmjson.JsonObject], gpus: int) -> tuple[float | None, float | None]:
    """(GPU utilization % per allocated GPU, peak GPU memory MiB) from Slurm 23.02+'s step TRES.

    `gres/gpuutil` is the sum of the SM utilization of a task's processes over its GPUs
    (gpu/nvml), averaged over the step's tasks (`TRESUsageInAve`): times the tasks and
    divided by the job's GPUs, capped at 100, it is a per-GPU mean. `gres/gpumem` is in
    bytes (`TRESUsageInMax`). The busiest step stands for the job. None when no step
    recorded them (22.05, or no NVML autodetection).
    """
    utils: list[float] = []
    mems: list[int] = []
    for step in steps:
        usage = (step.get("tres") or {}).get("requested") or {}
        tasks = slurmjson.number((step.get("tasks") or {}).get("count")) or 1
        average = _tres_count(usage.get("average"), "gpuutil")
        utils += [] if average is None else [average * tasks / max(gpus, 1)]
        peak = _tres_count(usage.get("max"), "gpumem")
        mems += [] if peak is None else [peak]
    util = min(100.0, max(utils)) if utils else None
    return util, (max(mems) / (1024 * 1024) if mems else None)


def _tres_count(items: object, name: str) -> int | None:
    if not isinstance(items, list):
        return None
    for item in items:
        if isinstance(item, dict) and item.get("type") == "gres" and item.get("name") == name:
            return slurmjson.number(item.get("count"))
    return None


def _none_empty(value: str) -> str:
    return "" if value in ("None assigned", "(null)") else value


def anchor_ts(record: JobRecord) -> float | None:
    """The moment a record belongs to when windows overlap: its start, else its submit."""
    return record.start_ts if record.start_ts is not None else record.submit_ts


# sacct calls one read may make, refused before the first: a year of day-long windows is 366;
# `--since 1970-01-01` at a day each was 20,000 calls on slurmdbd.
MAX_WINDOWS = 2_000


def too_many_windows(since: datetime, until: datetime, chunk: timedelta) -> int | None:
    """The number of sacct windows of `chunk` in [since, until) when over MAX_WINDOWS, else None.

    `SacctReader` refuses by it, and `slurm-aigc report` before it in its options' words:
    one count, so the two cannot disagree about a range.
    """
    count = window_count(since, until, chunk)
    return count if count > MAX_WINDOWS else None


class SacctReader:
    """Reads `sacct` window by window and yields each allocation record exactly once.

    A job running across a window edge is listed by sacct in both windows; it is kept in
    the window holding its start (or submit when it never started). Jobs that started
    before `since` are kept from the first window, those after `until` from the last.
    """

    def __init__(self, slurm: SacctRunner, *, tz: tzinfo | None = None, chunk: timedelta = timedelta(days=1)) -> None:
        self._slurm = slurm
        self._tz = tz
        self._chunk = chunk

    def rows(self, query: SacctQuery) -> Iterator[Row]:
        """`sacct -X -D --json ...` per window; records outside their anchor window are not repeated."""
        edges = self._windows(query)
        for index, (start, end) in enumerate(edges):
            args = sacct_args(start, end, query)
            source = f"sacct window {_slurm_time(start)}..{_slurm_time(end)}"
            stdout = self._slurm.run("sacct", args).stdout
            first, last = index == 0, index == len(edges) - 1
            for row in parse_sacct_output(stdout, tz=self._tz, source=source):
                if isinstance(row, SkippedRow) or query.job_ids or _owns(row, start, end, first=first, last=last, tz=self._tz):
                    yield row

    def _windows(self, query: SacctQuery) -> list[tuple[datetime, datetime]]:
        """A job query reads its whole range at once; the rest window by window, up to MAX_WINDOWS."""
        if query.job_ids:
            return [(query.since, query.until)]
        if (count := too_many_windows(query.since, query.until, self._chunk)) is not None:
            raise AigcError(f"{_slurm_time(query.since)} to {_slurm_time(query.until)} is {count:,} sacct windows of "
                            f"{self._chunk}; at most {MAX_WINDOWS:,}: give a later start or larger windows")
        return windows(query.since, query.until, self._chunk)


def _owns(record: JobRecord, start: datetime, end: datetime, *, first: bool, last: bool, tz: tzinfo | None) -> bool:
    anchor = anchor_ts(record)
    lo, hi = _epoch(start, tz), _epoch(end, tz)
    if anchor is None:
        return first
    if anchor < lo:
        return first
    if anchor >= hi:
        return last
    return True


def _epoch(moment: datetime, tz: tzinfo | None) -> float:
    if moment.tzinfo is None and tz is not None:
        moment = moment.replace(tzinfo=tz)
    return moment.timestamp()


def filter_classes(rows: Iterable[Row], classes: Sequence[str]) -> Iterator[Row]:
    """Keep records of the given AIGC classes (all when none given); skipped rows pass."""
    for row in rows:
        if not classes or isinstance(row, SkippedRow) or row.aigc_class in classes:
            yield row


class _HasComments(Protocol):
    @property
    def comment(self) -> str: ...

    @property
    def admin_comment(self) -> str: ...


class _HasIdAndComments(_HasComments, Protocol):
    @property
    def job_id(self) -> str: ...


class JobLookup(Protocol):
    """`SlurmCli.jobs` (JSON): every job slurmctld still remembers."""

    def jobs(self) -> Sequence[_HasIdAndComments]: ...


def with_live_comments(rows: Iterable[Row], slurm: JobLookup) -> Iterator[Row]:
    """Fill in the comments of running jobs from slurmctld.

    slurmdbd 22.05 stores a job's comment when the job ends (a job that started at once
    shows an empty Comment in sacct while it runs), so its AIGC class would read as
    unknown; slurmctld has it. All jobs are read once, on the first record that needs it
    (on 22.05 reading one job costs as much as reading all of them).
    """
    live_jobs: dict[str, _HasIdAndComments] | None = None
    for row in rows:
        if isinstance(row, JobRecord) and row.end_ts is None and not (row.comment or row.admin_comment):
            if live_jobs is None:
                live_jobs = _live_jobs(slurm)
            live = live_jobs.get(row.job_id_raw)
            if live is not None and (live.comment or live.admin_comment):
                row = replace(row, comment=live.comment, admin_comment=live.admin_comment,
                              aigc_class=aigc_class_of(live.admin_comment))
        yield row


def _live_jobs(slurm: JobLookup) -> dict[str, _HasIdAndComments]:
    try:
        return {job.job_id: job for job in slurm.jobs()}
    except SlurmCommandError as error:  # best effort: slurmctld may be restarting
        log.warning("cannot read running jobs' comments from slurmctld: %s", error)
        return {}


class ReportSlurm(SacctRunner, JobLookup, Protocol):
    """What reports need of `slurm_aigc.slurm.SlurmCli`: `run("sacct", ...)` and `jobs()`."""
