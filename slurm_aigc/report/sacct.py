"""Reading job allocations from slurmdbd through `sacct` (via the Slurm boundary).

We ask for an explicit field list with `--parsable2` and an ASCII unit separator as the
delimiter, because job comments may hold `|` and even newlines. The header must match the
fields we asked for (case-insensitive; 22.05 and 24.11 spell them alike), and every data
row becomes either a `JobRecord` or a `SkippedRow` with the reason: nothing is dropped
silently. Long ranges are read window by window so that one sacct answer stays small.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, tzinfo
from typing import Protocol

from slurm_aigc.errors import AigcError, SlurmCommandError, SlurmParseError
from slurm_aigc.report.tres import Tres, TresParseError, parse_tres
from slurm_aigc.tags import trusted_class

log = logging.getLogger(__name__)

# Every field exists in sacct 22.05 and 24.11 (`Restarts` does not in 22.05: requeues are
# counted from the `--duplicates` records instead). The free-text fields sit before a
# field that is always a number (ElapsedRaw), so a comment holding a newline leaves its
# first physical line short of fields and the reader joins the next one.
FIELDS: tuple[str, ...] = (
    "JobID", "JobIDRaw", "JobName", "User", "Account", "Partition", "QOS", "State",
    "Submit", "Eligible", "Start", "End", "AllocTRES", "NodeList",
    "AdminComment", "Comment", "ElapsedRaw",
)
# ASCII unit separator: cannot be typed into a comment by `sbatch --comment`.
DELIMITER = "\x1f"
UNKNOWN_CLASS = "unknown"
REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})
_TIME_NONE = frozenset({"", "Unknown", "None", "N/A"})


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
    line_no: int = 0

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
    """A row of sacct output we could not use, with why; `source` names the sacct call."""

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


def aigc_class_of(admin_comment: str) -> str:
    """The class the hook stamped into the AdminComment (never the user's comment), else unknown."""
    return trusted_class(admin_comment)


def sacct_args(start: datetime, end: datetime, query: SacctQuery) -> list[str]:
    """Arguments of one `sacct` call for the window [start, end)."""
    args = [
        "--allocations", "--duplicates", "--parsable2", "--noconvert",
        f"--delimiter={DELIMITER}", f"--format={','.join(FIELDS)}",
        f"--starttime={_slurm_time(start)}", f"--endtime={_slurm_time(end)}",
    ]
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


def windows(since: datetime, until: datetime, chunk: timedelta) -> list[tuple[datetime, datetime]]:
    """[since, until) cut into consecutive windows of at most `chunk`."""
    if chunk <= timedelta(0):
        raise ValueError("chunk must be positive")
    edges: list[tuple[datetime, datetime]] = []
    start = since
    while start < until:
        edges.append((start, min(start + chunk, until)))
        start = edges[-1][1]
    return edges


def parse_sacct_output(text: str, *, tz: tzinfo | None = None, source: str = "") -> Iterator[Row]:
    """Parse `sacct -P --delimiter=US --format=FIELDS` output into records and skipped rows.

    Raises SlurmParseError when the header is not the field list we asked for: then no row
    can be trusted. A comment holding newlines spans several physical lines; those are
    joined until the row has all its fields.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise SlurmParseError(f"{source or 'sacct'}: empty output, expected a header line")
    _check_header(lines[0], source)
    for line_no, raw in _logical_rows(list(enumerate(lines[1:], start=2)), len(FIELDS)):
        yield _row(line_no, raw, tz, source)


def _check_header(line: str, source: str) -> None:
    got = [name.strip().lower() for name in line.split(DELIMITER)]
    want = [name.lower() for name in FIELDS]
    if got != want:
        raise SlurmParseError(f"{source or 'sacct'}: header {line!r} does not match the requested fields {','.join(FIELDS)}")


def _logical_rows(lines: list[tuple[int, str]], width: int) -> Iterator[tuple[int, str]]:
    """Join physical lines into rows of `width` fields.

    A line that cannot begin a whole row (too many fields, or the output ends first) is
    yielded alone, so `_row` reports it, and the lines after it are read again.
    """
    pending = deque(lines)
    buffer: list[tuple[int, str]] = []
    while pending or buffer:
        if not pending:
            yield buffer[0]
            pending.extend(buffer[1:])
            buffer = []
            continue
        line_no, text = pending.popleft()
        if not buffer and text.strip() == "":
            continue  # a blank line outside a row carries no data
        buffer.append((line_no, text))
        joined = "\n".join(t for _, t in buffer)
        count = joined.count(DELIMITER) + 1
        if count == width:
            yield buffer[0][0], joined
            buffer = []
        elif count > width:
            yield buffer[0]
            pending.extendleft(reversed(buffer[1:]))
            buffer = []


def _row(line_no: int, raw: str, tz: tzinfo | None, source: str) -> Row:
    values = raw.split(DELIMITER)
    if len(values) != len(FIELDS):
        reason = f"{len(values)} fields, expected {len(FIELDS)}"
        return SkippedRow(line_no, raw, reason, source)
    row = dict(zip(FIELDS, values))
    try:
        return _record(line_no, row, tz)
    except (RowError, TresParseError) as error:
        return SkippedRow(line_no, raw, str(error), source)


def _record(line_no: int, row: dict[str, str], tz: tzinfo | None) -> JobRecord:
    if "." in row["JobIDRaw"] or "." in row["JobID"]:
        raise RowError(f"job step {row['JobID']}: steps are not counted (allocation records only)")
    if not row["JobIDRaw"] or not row["State"]:
        raise RowError("empty JobIDRaw or State")
    submit_ts = _timestamp("Submit", row["Submit"], tz)
    if submit_ts is None:
        raise RowError(f"Submit {row['Submit']!r}: every job has a submit time")
    return JobRecord(
        job_id=row["JobID"], job_id_raw=row["JobIDRaw"], name=row["JobName"], user=row["User"],
        account=row["Account"], partition=row["Partition"], qos=row["QOS"],
        state=row["State"].split(" ", 1)[0].rstrip("+"),
        submit_ts=submit_ts, eligible_ts=_timestamp("Eligible", row["Eligible"], tz),
        start_ts=_timestamp("Start", row["Start"], tz), end_ts=_timestamp("End", row["End"], tz),
        elapsed_s=_elapsed(row["ElapsedRaw"]), tres=parse_tres(row["AllocTRES"]),
        alloc_tres=row["AllocTRES"], node_list=_none_empty(row["NodeList"]),
        comment=row["Comment"], admin_comment=row["AdminComment"],
        aigc_class=aigc_class_of(row["AdminComment"]), line_no=line_no,
    )


def _timestamp(name: str, value: str, tz: tzinfo | None) -> float | None:
    """sacct's `YYYY-MM-DDTHH:MM:SS` in the sacct process's time zone -> epoch seconds."""
    if value.strip() in _TIME_NONE:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise RowError(f"{name} {value!r} is not a time (is SLURM_TIME_FORMAT set?)") from None
    if moment.tzinfo is None and tz is not None:
        moment = moment.replace(tzinfo=tz)
    return moment.timestamp()


def _elapsed(value: str) -> int:
    if not value.strip().isdigit():
        raise RowError(f"ElapsedRaw {value!r} is not a number of seconds")
    return int(value)


def _none_empty(value: str) -> str:
    return "" if value in ("None assigned", "(null)") else value


def anchor_ts(record: JobRecord) -> float | None:
    """The moment a record belongs to when windows overlap: its start, else its submit."""
    return record.start_ts if record.start_ts is not None else record.submit_ts


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
        """`sacct -X -D -P ...` per window; records outside their anchor window are not repeated."""
        edges = windows(query.since, query.until, self._chunk) if not query.job_ids else [(query.since, query.until)]
        for index, (start, end) in enumerate(edges):
            args = sacct_args(start, end, query)
            source = f"sacct window {_slurm_time(start)}..{_slurm_time(end)}"
            stdout = self._slurm.run("sacct", args).stdout
            first, last = index == 0, index == len(edges) - 1
            for row in parse_sacct_output(stdout, tz=self._tz, source=source):
                if isinstance(row, SkippedRow) or query.job_ids or _owns(row, start, end, first=first, last=last, tz=self._tz):
                    yield row


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


class JobLookup(Protocol):
    """`SlurmCli.job` (scontrol show job): slurmctld's view of a job it still remembers."""

    def job(self, job_id: str) -> _HasComments | None: ...


def with_live_comments(rows: Iterable[Row], slurm: JobLookup) -> Iterator[Row]:
    """Fill in the comments of running jobs from slurmctld.

    slurmdbd 22.05 stores a job's comment when the job ends (a job that started at once
    shows an empty Comment in sacct while it runs), so its AIGC class would read as
    unknown; `scontrol show job` has it.
    """
    for row in rows:
        if isinstance(row, JobRecord) and row.end_ts is None and not (row.comment or row.admin_comment):
            try:
                live = slurm.job(row.job_id_raw)
            except SlurmCommandError as error:  # best effort: slurmctld may be restarting
                log.warning("cannot read job %s's comment from slurmctld: %s", row.job_id_raw, error)
                live = None
            if live is not None and (live.comment or live.admin_comment):
                row = replace(row, comment=live.comment, admin_comment=live.admin_comment,
                              aigc_class=aigc_class_of(live.admin_comment))
        yield row


class ReportSlurm(SacctRunner, JobLookup, Protocol):
    """What reports need of `slurm_aigc.slurm.SlurmCli`: `run("sacct", ...)` and `job(id)`."""
