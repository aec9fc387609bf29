"""The learner's daemon part (issue 14.4): sacct + samples in, the hook's table out, incrementally."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from slurm_aigc.db import JobGpuSample, RetentionState, open_database, transaction
from slurm_aigc.policy.model import LearnedConfig
from slurm_aigc.report.samples import SampleStore
from slurm_aigc.telemetry.learned import parse_table
from slurm_aigc.telemetry.learnpublish import LearnedPublisher, with_learner
from tests.unit.old_sqlite import sqlite_with_999_parameters
from tests.unit.sacct_json import sacct_json

NOW = datetime(2026, 12, 3, 12, tzinfo=UTC).timestamp()
UIDS = {"aigc-alice": 1001, "aigc-bob": 1002}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass
class Answer:
    stdout: str


# sacct's short state names -> the JSON's (the ones FakeSacct's jobs use).
STATE_NAMES = {"CD": "COMPLETED", "F": "FAILED", "TO": "TIMEOUT", "OOM": "OUT_OF_MEMORY", "NF": "NODE_FAIL",
               "CA": "CANCELLED", "PR": "PREEMPTED", "DL": "DEADLINE", "R": "RUNNING", "PD": "PENDING", "RQ": "REQUEUED"}


class FakeSacct:
    """`sacct --json` as slurmdbd selects: without `--state` the jobs active in the window, with it
    the jobs in those states that ended in it (`time_end between S and E`); records the calls."""

    def __init__(self) -> None:
        self.rows: list[dict[str, str]] = []
        self.calls: list[Sequence[str]] = []

    def add(self, job_id: int, name: str, user: str = "aigc-alice", stamp: str = "aigc_class=imagegen",
            end: float | None = NOW - 3600, gpus: str = "gres/gpu=1", state: str = "COMPLETED",
            start: float | None = None) -> None:
        began = (NOW if end is None else end) - 600 if start is None else start
        self.rows.append({"JobID": str(job_id), "JobName": name, "User": user, "State": state,
                          "Submit": iso(began - 300), "Start": iso(began), "End": "Unknown" if end is None else iso(end),
                          "AllocTRES": f"cpu=1,{gpus}", "AdminComment": stamp, "ElapsedRaw": "600"})

    def run(self, tool: str, args: Sequence[str]) -> Answer:
        assert tool == "sacct"
        self.calls.append(args)
        start, end = option(args, "--starttime"), option(args, "--endtime")
        states = option(args, "--state")
        if states is None:
            rows = [r for r in self.rows if r["Start"] < end and (r["End"] == "Unknown" or r["End"] >= start)]
        else:
            wanted = {STATE_NAMES[s] for s in states.split(",")}
            rows = [r for r in self.rows if r["State"] in wanted and r["End"] != "Unknown" and start <= r["End"] <= end]
        return Answer(sacct_json(rows))


def option(args: Sequence[str], name: str) -> Any:
    return next((a.split("=", 1)[1] for a in args if a.startswith(name + "=")), None)


@pytest.fixture
def db(tmp_path: Path) -> sessionmaker[Session]:
    return open_database(f"sqlite:///{tmp_path / 'state.db'}")


def add_samples(db: sessionmaker[Session], job_id: int, peak_mib: float, sm: float, end: float = NOW - 3600) -> None:
    with transaction(db) as session:
        for i, memory in enumerate((peak_mib / 2, peak_mib, peak_mib / 2)):
            session.add(JobGpuSample(ts=end - 300 + 10 * i, node="a100-01", job_id=str(job_id), gpu_index=0,
                                     sm_util_pct=sm, memory_used_mib=memory, memory_total_mib=81920.0))


def learner(tmp_path: Path, sacct: FakeSacct, db: sessionmaker[Session], clock: list[float], **config: Any
            ) -> LearnedPublisher:
    cfg = replace(LearnedConfig(enabled=True, file=str(tmp_path / "out" / "learned.txt"), interval_s=600), **config)
    return LearnedPublisher(sacct, SampleStore(db), cfg, clock=lambda: clock[0], monotonic=lambda: clock[0],
                            uids=UIDS.get)


def test_a_run_learns_from_sacct_and_samples_and_writes_the_table(tmp_path: Path, db: sessionmaker[Session]) -> None:
    sacct = FakeSacct()
    for i in range(5):
        sacct.add(100 + i, f"sd-gen-{i:04d}")
        add_samples(db, 100 + i, 6000.0, 40.0)
    sacct.add(200, "cpu-only-1", gpus="gres/gpu=0")
    sacct.add(201, "ghost-1", user="nobody-here")
    clock = [NOW]
    entries = learner(tmp_path, sacct, db, clock).tick()
    path = tmp_path / "out" / "learned.txt"
    assert parse_table(path.read_bytes()) == entries
    [entry] = entries
    assert (entry.uid, entry.pattern, entry.job_class, entry.vram_gib, entry.sm) == (1001, "sd-gen", "imagegen", 7, 0.4)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644



def test_a_window_of_many_jobs_reads_their_samples_within_an_old_sqlites_999_parameters(tmp_path: Path) -> None:
    # SQLite before 3.32 (EL8) takes 999 parameters a statement. Once retention has run, the
    # samples query binds each job id twice (rollups and raw rows): 500 ids a query made 1,004.
    db = sqlite_with_999_parameters(tmp_path / "old.db")
    with transaction(db) as session:
        session.add(RetentionState(id=1, rolled_until=NOW - 2 * 86400))
    sacct = FakeSacct()
    for i in range(600):  # all in one sacct window: one samples read
        sacct.add(1000 + i, f"sd-gen-{i:04d}")
    for i in range(5):
        add_samples(db, 1000 + i, 6000.0, 40.0)
    [entry] = learner(tmp_path, sacct, db, [NOW]).tick() or []
    assert (entry.pattern, entry.vram_gib, entry.sm) == ("sd-gen", 7, 0.4)

def test_later_runs_read_only_what_is_new_and_forget_what_is_too_old(tmp_path: Path, db: sessionmaker[Session]) -> None:
    sacct = FakeSacct()
    for i in range(5):
        sacct.add(100 + i, f"sd-gen-{i}", end=NOW - 13 * 86400)
        add_samples(db, 100 + i, 6000.0, 40.0, end=NOW - 13 * 86400)
    clock = [NOW]
    run = learner(tmp_path, sacct, db, clock)
    assert len(run.tick() or []) == 1 and len(sacct.calls) == 56  # 14 days, one window per 6 hours
    clock[0] = NOW + 2 * 86400  # the five jobs are now 15 days old
    sacct.calls.clear()
    assert run.tick() == []
    assert len(sacct.calls) == 9  # only since the last read, minus an hour's overlap: 49 h in 6-hour windows
    assert parse_table((tmp_path / "out" / "learned.txt").read_bytes()) == []


def test_tick_when_due_waits_for_interval_s_and_dry_run_writes_nothing(tmp_path: Path, db: sessionmaker[Session]) -> None:
    sacct = FakeSacct()
    clock = [NOW]
    run = learner(tmp_path, sacct, db, clock)
    assert run.tick_when_due() == [] and run.tick_when_due() is None
    clock[0] += 601
    assert run.tick_when_due() == []
    dry = LearnedPublisher(sacct, SampleStore(db), replace(run.config, file=str(tmp_path / "dry.txt")), dry_run=True,
                           uids=UIDS.get)
    dry.tick()
    assert not (tmp_path / "dry.txt").exists()
    dry.set_config(dry.config, dry.classes, dry_run=False)  # the admin went live and reloaded
    dry.tick()
    assert (tmp_path / "dry.txt").exists()


def test_the_learner_runs_even_when_the_publisher_fails(tmp_path: Path, db: sessionmaker[Session]) -> None:
    def failing(_jobs: object, _nodes: object) -> object:
        raise RuntimeError("publisher down")

    run = learner(tmp_path, FakeSacct(), db, [NOW])
    with pytest.raises(RuntimeError, match="publisher down"):
        with_learner(failing, run.tick_when_due)(None, None)
    assert (tmp_path / "out" / "learned.txt").exists()


def test_the_controller_runs_the_learner_only_when_the_policy_enables_it(tmp_path: Path) -> None:
    import yaml

    from slurm_aigc.cli.reclaim import _with_learner
    from slurm_aigc.policy.paths import shipped_policy

    table = tmp_path / "table.txt"
    document = yaml.safe_load(shipped_policy().read_text())
    document["learned"].update(file=str(table), max_age_days=1)
    off, on = tmp_path / "off.yaml", tmp_path / "on.yaml"
    off.write_text(yaml.safe_dump(document))
    document["learned"]["enabled"] = True
    on.write_text(yaml.safe_dump(document))
    db_url = f"sqlite:///{tmp_path / 'state.db'}"
    sacct = FakeSacct()
    assert _with_learner(None, sacct, db_url, str(off), False) is None  # type: ignore[arg-type]
    hooks = _with_learner(None, sacct, db_url, str(on), False)  # type: ignore[arg-type]
    assert hooks is not None and hooks.nodes_seen() is None
    for _ in range(10):  # in the loop: one sacct window per tick until the day is read, then every interval_s
        hooks.tick(None, None)
    assert table.exists() and 4 <= len(sacct.calls) <= 5  # 4 windows, and the seconds the real clock moved on
