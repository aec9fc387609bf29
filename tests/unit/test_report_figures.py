"""Figures per group from recorded sacct rows, synthetic samples and audit events."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from slurm_aigc.report.figures import (
    _CLASS,
    Aggregator,
    GroupFigures,
    Report,
    ReportParams,
    UsefulRule,
    _segment_at,
    build_report,
    job_view,
    split_by_day,
    useful_rules,
)
from slurm_aigc.report.records import ActionEvent, SampleSlice
from slurm_aigc.report.sacct import JobRecord, parse_sacct_output
from tests.unit.report_fixtures import SHARDS_PER_GPU, stamped_sacct
from tests.unit.sacct_json import DELIMITER, FIELDS, text_to_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sacct"


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def rows(name: str) -> list[object]:
    return list(parse_sacct_output(stamped_sacct(name), tz=UTC))  # classes stamped as the hook would have


def params(*group_by: str, since: str = "2026-11-30T00:00:00", until: str = "2026-12-01T00:00:00") -> ReportParams:
    return ReportParams(since_ts=ts(since), until_ts=ts(until), group_by=group_by, shards_per_gpu=SHARDS_PER_GPU, tz=UTC)


def record(job: str, start: str | None, end: str | None, tres: str, *, cls: str = "train", submit: str | None = None,
           state: str = "COMPLETED", partition: str = "gpu", nodes: str = "a100-01") -> JobRecord:
    values = dict.fromkeys(FIELDS, "")
    values.update(JobID=job, JobIDRaw=job, User="aigc-alice", Account="aigc", Partition=partition, State=state,
                  Submit=submit or start or "2026-11-30T00:00:00", Start=start or "Unknown", End=end or "Unknown",
                  AllocTRES=tres, NodeList=nodes, Comment=f"aigc:type={cls}", AdminComment=f"aigc_class={cls}",
                  ElapsedRaw="0")  # the class is the hook's AdminComment stamp
    parsed = next(parse_sacct_output(text_to_json(DELIMITER.join(FIELDS) + "\n" + DELIMITER.join(values[f] for f in FIELDS)), tz=UTC))
    assert isinstance(parsed, JobRecord)
    return parsed


def test_slurm_22_05_figures_by_class() -> None:
    report = build_report(params("class"), rows("sacct-22.05.json"))  # type: ignore[arg-type]
    by = {g.key[0]: g for g in report.groups}
    # train: 101 (2 GPUs x 2 h) + 104's two runs (4 GPUs x 1 h each) + 106 pending.
    assert by["train"].gpu_hours_allocated == pytest.approx(12.0)
    assert (by["train"].jobs, by["train"].gpu_jobs, by["train"].run_segments) == (3, 2, 4)
    assert (by["train"].jobs_requeued, by["train"].requeues) == (1, 1)
    assert by["train"].queue_wait_mean_s == pytest.approx((300 + 600 + 1800) / 3)
    assert by["train"].queue_wait_p95_s == 1800
    # infer: 102 (20 shards of an a100 = 1/4 GPU, 2 h), 103 running until the window end (1 h), 108 (2 GPUs, 30 min).
    assert by["infer"].gpu_hours_allocated == pytest.approx(2.5)
    assert by["infer"].shard_gpu_hours == pytest.approx(0.5)
    assert (by["infer"].shard_jobs, by["infer"].whole_gpu_jobs, by["infer"].running_jobs) == (1, 2, 1)
    assert by["unknown"].jobs == 1 and by["unknown"].gpu_hours_allocated == 0.0
    assert report.total.jobs == 9
    assert report.total.gpu_hours_allocated == pytest.approx(16.0)
    assert report.total.gpu_hours_used is None and report.total.efficiency is None
    assert report.total.jobs_without_samples == 7
    assert len(report.skipped) == 1
    assert any("a100=80, t4=16" in note for note in report.notes)


def test_slurm_24_11_figures_by_gpu_type_and_user() -> None:
    report = build_report(params("gpu_type", "user"), rows("sacct-24.11.json"))  # type: ignore[arg-type]
    by = {g.key: g for g in report.groups}
    assert by[("a100", "aigc-alice")].gpu_hours_allocated == pytest.approx(1.0 + 0.5 + 1.0)
    assert by[("a100", "aigc-bob")].gpu_hours_allocated == pytest.approx(8.0)
    # 220: 8 of 16 t4 shards = 1/2 GPU over 20 + 20 + 60 minutes (running until the window end).
    t4_bob = by[("t4", "aigc-bob")]
    assert t4_bob.shard_gpu_hours == pytest.approx(0.5 * 100 / 60)
    assert t4_bob.whole_gpu_hours == pytest.approx(2.0)
    assert (t4_bob.jobs_requeued, t4_bob.requeues) == (1, 2)
    assert by[("none", "aigc-bob")].jobs == 2  # het component without GPUs, pending array


def test_all_of_a_gpus_shards_count_as_a_whole_gpu_job() -> None:
    # On Slurm 22.05 the hook asks for a whole GPU as all of its shards (rewrites.whole_as_shards):
    # 16 of a t4's 16 shards is one whole GPU, not a shard job; 8 of them is half a GPU, shared.
    jobs = [record("1", "2026-11-30T00:00:00", "2026-11-30T01:00:00", "gres/shard=16", nodes="t4-01"),
            record("2", "2026-11-30T00:00:00", "2026-11-30T01:00:00", "gres/shard=8", nodes="t4-01")]
    total = build_report(params(), jobs).total
    assert (total.whole_gpu_jobs, total.shard_jobs) == (1, 1)
    assert total.whole_gpu_hours == pytest.approx(1.0) and total.shard_gpu_hours == pytest.approx(0.5)


def test_window_clips_and_running_jobs_count_to_until() -> None:
    jobs = [record("1", "2026-11-29T22:00:00", "2026-11-30T02:00:00", "gres/gpu:a100=2,gres/gpu=2", submit="2026-11-29T20:00:00"),
            record("2", "2026-11-30T23:30:00", None, "gres/gpu:a100=1,gres/gpu=1", state="RUNNING"),
            record("3", "2026-11-30T23:00:00", "2026-12-01T05:00:00", "gres/gpu:t4=4,gres/gpu=4")]
    report = build_report(params(), jobs)
    assert report.total.gpu_hours_allocated == pytest.approx(2 * 2 + 0.5 + 4 * 1)
    assert report.total.running_jobs == 2  # at the window end: job 2 still runs, job 3 ran on
    assert report.total.queue_wait_p95_s == 0.0  # job 1 started before the window: its wait is not this window's
    assert report.total.run_segments == 3


def test_day_grouping_splits_at_midnight() -> None:
    job = record("1", "2026-11-30T23:00:00", "2026-12-01T01:30:00", "gres/gpu:t4=2,gres/gpu=2", submit="2026-11-30T22:00:00")
    report = build_report(params("day", until="2026-12-02T00:00:00"), [job])
    by = {g.key[0]: g for g in report.groups}
    assert by["2026-11-30"].gpu_hours_allocated == pytest.approx(2.0)
    assert by["2026-12-01"].gpu_hours_allocated == pytest.approx(3.0)
    assert by["2026-11-30"].queue_wait_mean_s == 3600 and by["2026-12-01"].queue_wait_mean_s is None
    assert report.total.jobs == 1


def slices_for(job: str, start: str, count: int, util: float | None, gpus: int = 1) -> list[SampleSlice]:
    return [SampleSlice(job, "a100-01", gpu, ts(start) + 60 * i, 60.0, util, 1000.0, 81920.0)
            for gpu in range(gpus) for i in range(count)]


def test_samples_give_used_idle_and_efficiency_only_where_they_exist() -> None:
    jobs = [record("1", "2026-11-30T10:00:00", "2026-11-30T11:00:00", "gres/gpu:a100=2,gres/gpu=2", cls="train"),
            record("2", "2026-11-30T10:00:00", "2026-11-30T11:00:00", "gres/gpu:a100=1,gres/gpu=1", cls="infer"),
            record("3", "2026-11-30T10:00:00", "2026-11-30T12:00:00", "gres/gpu:a100=4,gres/gpu=4", cls="train")]
    samples = slices_for("1", "2026-11-30T10:00:00", 60, 25.0, gpus=2) + slices_for("2", "2026-11-30T10:00:00", 60, None)
    samples += slices_for("99", "2026-11-30T10:00:00", 5, 100.0)  # a job outside the selection
    report = build_report(params("class"), jobs, samples)
    by = {g.key[0]: g for g in report.groups}
    train = by["train"]
    assert train.gpu_hours_allocated == pytest.approx(2 + 8)
    assert train.gpu_hours_used == pytest.approx(2 * 0.25)
    assert train.gpu_hours_sampled == pytest.approx(2.0)
    assert train.idle_gpu_hours == pytest.approx(1.5)
    assert train.efficiency == pytest.approx(0.25)
    assert train.jobs_without_samples == 1 and train.gpu_hours_unsampled == pytest.approx(8.0)
    # Samples without utilization do not make a job "sampled".
    assert by["infer"].gpu_hours_used is None and by["infer"].efficiency is None
    assert any("outside the selection" in n for n in report.notes)
    assert [round(u) for _, u in report.util_by_class["train"]] == [25] * len(report.util_by_class["train"])


def test_actions_count_only_done_and_not_dry_run() -> None:
    jobs = [record("1", "2026-11-30T10:00:00", "2026-11-30T11:00:00", "gres/gpu:a100=4,gres/gpu=4"),
            record("2", "2026-11-30T10:00:00", "2026-11-30T11:00:00", "gres/gpu:a100=4,gres/gpu=4")]

    def event(job: str, action: str, state: str = "done", dry_run: bool = False, hours: float = 1.5) -> ActionEvent:
        return ActionEvent(job, ts("2026-11-30T10:30:00"), "idle", action, state, dry_run, "", 4, 2, hours)

    actions = [event("1", "requeue"), event("2", "shrink", hours=0.5), event("2", "requeue", dry_run=True),
               event("1", "shrink", state="failed"), event("7", "requeue")]
    total = build_report(params(), jobs, (), actions).total
    assert (total.jobs_requeued_by_aigc, total.jobs_shrunk_by_aigc) == (1, 1)
    assert total.gpu_hours_recovered == pytest.approx(2.0)


def test_day_split() -> None:
    pieces = split_by_day(ts("2026-11-30T22:00:00"), ts("2026-12-02T03:00:00"), UTC)
    assert pieces == [("2026-11-30", 7200.0), ("2026-12-01", 86400.0), ("2026-12-02", 10800.0)]


def test_unknown_group_key_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot group by qos"):
        build_report(params("qos"), [])


def _slice(ts_s: float, util: float | None, power: float | None, limit: float | None = 400.0) -> SampleSlice:
    return SampleSlice("901", "a100-01", 0, ts_s, 3600.0, util, 10_000.0, 81_920.0, power, limit)


def test_useful_gpu_hours_leave_out_fake_busy_and_idle_time() -> None:
    """Issue 14.2: 1 h real work at 80 %, 1 h hung (100 % SM at 60 W of 400 W), 1 h idle: 0.8 useful GPU-h of 1.8 used."""
    job = record("901", "2026-11-30T01:00:00", "2026-11-30T04:00:00", "gres/gpu=1")
    start = ts("2026-11-30T01:00:00")
    slices = [_slice(start, 80.0, 350.0), _slice(start + 3600, 100.0, 60.0), _slice(start + 7200, 0.5, 55.0)]
    report = build_report(params(), [job], slices)
    total = report.total
    assert total.gpu_hours_used == pytest.approx(0.8 + 1.0 + 0.005)  # the SM figure counts the hung hour
    assert total.gpu_hours_useful == pytest.approx(0.8)  # fails if the fake-busy hour (or the idle one) counted
    assert total.useful_efficiency == pytest.approx(0.8 / 3)
    assert not any("no power reading" in note for note in report.notes)


def test_thresholds_come_from_the_rule_and_a_missing_power_reading_is_noted() -> None:
    job = record("901", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/gpu=1")
    start = ts("2026-11-30T01:00:00")
    hung = [_slice(start, 97.0, 100.0)]  # 25 % of the limit
    default = build_report(params(), [job], hung).total
    assert default.gpu_hours_useful == pytest.approx(0.0)
    strict = ReportParams(since_ts=params().since_ts, until_ts=params().until_ts, tz=UTC,
                          useful=UsefulRule(idle_util_pct=1.0, busy_util_pct=95.0, low_power_pct=20.0))
    assert build_report(strict, [job], hung).total.gpu_hours_useful == pytest.approx(0.97)  # 25 % > 20 %: real work
    unknown = build_report(params(), [job], [_slice(start, 99.0, None)])
    assert unknown.total.gpu_hours_useful == pytest.approx(0.99)  # like the detector: no power, never fake-busy
    assert any("1.000 GPU-hours at >= 95 % SM had no power reading" in note for note in unknown.notes)


def test_useful_rule_is_the_policy_defaults() -> None:
    from slurm_aigc.policy.loader import load_policy

    shipped = load_policy(Path(__file__).resolve().parents[2] / "etc" / "slurm-aigc.yaml").reclaim.defaults
    assert UsefulRule.of(shipped) == UsefulRule(shipped.idle_util_pct, shipped.busy_util_pct, shipped.low_power_pct)
    assert UsefulRule.of(shipped).useful_pct(100.0, 60.0, 400.0) == 0.0
    assert UsefulRule.of(shipped).useful_pct(100.0, 390.0, 400.0) == 100.0
    assert UsefulRule.of(shipped).useful_pct(None, 390.0, 400.0) is None


def test_the_sample_store_hands_the_power_readings_to_the_rule(tmp_path: Path) -> None:
    from slurm_aigc.db import JobGpuSample, open_database, transaction
    from slurm_aigc.report.samples import SampleStore

    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    start = ts("2026-11-30T01:00:00")
    with transaction(db) as session:
        for index in range(6):  # one minute hung at 10 s polls: 100 % SM at 15 % of the limit
            session.add(JobGpuSample(ts=start + 10 * index, node="a100-01", job_id="901", gpu_index=0, sm_util_pct=100.0,
                                     memory_used_mib=2048.0, memory_total_mib=81920.0, power_draw_w=60.0, power_limit_w=400.0))
    pieces = list(SampleStore(db).job_slices(start, start + 3600))
    assert {(p.power_draw_w, p.power_limit_w) for p in pieces} == {(60.0, 400.0)}
    job = record("901", "2026-11-30T01:00:00", "2026-11-30T01:01:00", "gres/gpu=1")
    total = build_report(params(), [job], pieces).total
    assert total.gpu_hours_used == pytest.approx(60 / 3600) and total.gpu_hours_useful == 0.0


def test_hours_a_sampled_job_has_no_samples_for_are_unknown_not_idle() -> None:
    """Audit 1: 10 h on one GPU, samples for 1 h at 100 %: 100 % over the sampled hour, 9 h unknown."""
    job = record("11", "2026-11-30T01:00:00", "2026-11-30T11:00:00", "gres/gpu:a100=1,gres/gpu=1")
    total = build_report(params(), [job], slices_for("11", "2026-11-30T04:00:00", 60, 100.0)).total
    assert total.gpu_hours_allocated == pytest.approx(10.0)
    assert total.gpu_hours_sampled == pytest.approx(1.0)
    assert total.gpu_hours_unsampled == pytest.approx(9.0)
    assert (total.gpu_hours_used, total.idle_gpu_hours, total.efficiency) == (pytest.approx(1.0), pytest.approx(0.0), pytest.approx(1.0))


def test_used_hours_never_exceed_the_allocation() -> None:
    """Audit 2: a 20/80 shard job alone on its GPU at 100 %, a 1-GPU job also sampled on a GPU it does not hold."""
    shard = record("21", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/shard:a100=20,gres/shard=20", cls="infer")
    whole = record("22", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/gpu:a100=1,gres/gpu=1")
    samples = slices_for("21", "2026-11-30T01:00:00", 60, 100.0) + slices_for("22", "2026-11-30T01:00:00", 60, 100.0, gpus=2)
    report = build_report(params("class"), [shard, whole], samples)
    by = {g.key[0]: g for g in report.groups}
    infer, train = by["infer"], by["train"]
    assert infer.gpu_hours_allocated == pytest.approx(0.25)
    assert (infer.gpu_hours_sampled, infer.gpu_hours_used, infer.efficiency) == (pytest.approx(0.25), pytest.approx(0.25), pytest.approx(1.0))
    assert (train.gpu_hours_sampled, train.gpu_hours_used, train.efficiency) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0))
    assert report.total.gpu_hours_used == pytest.approx(infer.gpu_hours_used + train.gpu_hours_used)
    assert report.total.idle_gpu_hours == pytest.approx(0.0)
    # Below its share the shard job reads what it used of it: 10 % of the GPU is 40 % of a quarter.
    low = build_report(params(), [shard], slices_for("21", "2026-11-30T01:00:00", 60, 10.0)).total
    assert low.efficiency == pytest.approx(0.4)


def test_jobs_without_gpu_hours_add_no_used_hours() -> None:
    """Audit 3: untyped shards on a node that names no type count 0 GPU-hours, used ones too."""
    unresolved = record("31", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/shard=20", nodes="node7")
    whole = record("32", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/gpu:a100=1,gres/gpu=1")
    samples = slices_for("31", "2026-11-30T01:00:00", 60, 100.0) + slices_for("32", "2026-11-30T01:00:00", 60, 50.0)
    report = build_report(params(), [unresolved, whole], samples)
    assert report.total.gpu_hours_allocated == pytest.approx(1.0)
    assert report.total.gpu_hours_used == pytest.approx(0.5)
    assert report.total.efficiency == pytest.approx(0.5)
    assert any("1 job(s) hold shards of an unknown GPU type" in note for note in report.notes)
    alone = build_report(params(), [unresolved], slices_for("31", "2026-11-30T01:00:00", 60, 100.0)).total
    assert alone.gpu_hours_used is None and alone.efficiency is None


def test_a_requeued_jobs_samples_join_the_run_they_fall_in() -> None:
    """Audit 4: the first run on `gpu` (20 %), the requeued one on `debug` (80 %): each group gets its run's samples."""
    first = record("41", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/gpu:a100=1,gres/gpu=1", state="REQUEUED")
    second = record("41", "2026-11-30T03:00:00", "2026-11-30T04:00:00", "gres/gpu:a100=1,gres/gpu=1", partition="debug")
    samples = slices_for("41", "2026-11-30T01:00:00", 60, 20.0) + slices_for("41", "2026-11-30T03:00:00", 60, 80.0)
    by = {g.key[0]: g for g in build_report(params("partition"), [first, second], samples).groups}
    assert (by["gpu"].gpu_hours_used, by["gpu"].efficiency) == (pytest.approx(0.2), pytest.approx(0.2))
    assert (by["debug"].gpu_hours_used, by["debug"].efficiency) == (pytest.approx(0.8), pytest.approx(0.8))


def test_report_and_report_job_agree_on_a_shard_jobs_efficiency() -> None:
    """Audit 6: a 20/80 shard job at 25 % of its GPU uses all of its share, in both views."""
    job = record("61", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/shard:a100=20,gres/shard=20")
    samples = slices_for("61", "2026-11-30T01:00:00", 60, 25.0)
    total = build_report(params(), [job], samples).total
    view = job_view("61", [job], samples, [], now_ts=ts("2026-12-01T00:00:00"), shards_per_gpu=SHARDS_PER_GPU)
    assert total.efficiency == pytest.approx(1.0)
    assert view.efficiency == pytest.approx(total.efficiency)
    assert view.gpu_hours_used == pytest.approx(total.gpu_hours_used) == pytest.approx(0.25)


def test_queue_waits_leave_out_runs_that_started_after_the_window() -> None:
    """Audit 8: submitted in the window, started after --until: not this window's wait."""
    inside = record("81", "2026-11-30T10:10:00", "2026-11-30T11:00:00", "gres/gpu=1", submit="2026-11-30T10:00:00")
    later = record("82", "2026-12-01T02:00:00", "2026-12-01T03:00:00", "gres/gpu=1", submit="2026-11-30T23:00:00")
    total = build_report(params(), [inside, later]).total
    assert (total.queue_wait_mean_s, total.queue_wait_p95_s) == (600.0, 600.0)


# -- the caps' cells, folded as the sample stream passes ------------------------------------------------


class _Reference(Aggregator):
    """The caps as eaead38 computed them, the reference for the streaming fold: every cell of the
    period kept until `result()`, then capped in insertion order. Only `add_slices` and the fold
    are copied; the helpers (cuts, fractions, group keys) are the aggregator's own."""

    def __init__(self, params: ReportParams) -> None:
        super().__init__(params)
        self._all_cells: dict[tuple[str, int, int, str], list[float]] = {}

    def add_slices(self, slices: Iterable[SampleSlice]) -> None:
        for piece in slices:
            job = self._job_alias.get(piece.job_id, piece.job_id)
            segments = self._job_segments.get(job)
            if segments is None:
                self._foreign_sample_jobs.add(piece.job_id)
                continue
            if piece.sm_util_pct is None:
                continue
            index = _segment_at(segments, piece.ts)
            segment = segments[index]
            cell = self._util_bins[segment.attrs[_CLASS]][int((piece.ts - self._p.since_ts) // self._bin_s)]
            cell[0] += piece.sm_util_pct * piece.duration_s
            cell[1] += piece.duration_s
            share = min(1.0, segment.gpus)
            if share <= 0:
                continue
            used, useful, unjudged = self._fractions(piece, share, self._p.useful_for(segment.attrs[_CLASS]))
            start = max(piece.ts, self._p.since_ts)
            for hour, day, seconds in self._cuts(start, min(piece.ts + piece.duration_s, self._p.until_ts)):
                sums = self._all_cells.get((job, index, hour, day))
                if sums is None:
                    sums = self._all_cells[(job, index, hour, day)] = [0.0, 0.0, 0.0, 0.0]
                sums[0] += share * seconds
                sums[1] += used * seconds
                sums[2] += useful * seconds
                sums[3] += unjudged * seconds

    def result(self) -> Report:
        for (job, index, hour, day), (known, used, useful, unjudged) in self._all_cells.items():
            segment = self._job_segments[job][index]
            if segment.start_ts is None:
                continue
            day_start, day_end = self._day_span(day)
            low = max(segment.start_ts, self._p.since_ts, hour * 3600.0, day_start)
            high = min(segment.end_ts, self._p.until_ts, (hour + 1) * 3600.0, day_end)
            sampled = min(known, segment.gpus * max(0.0, high - low))
            if sampled <= 0:
                continue
            used = min(used, sampled)
            key = self._key(segment.attrs, day)
            for acc in (self._groups[key], self._total):
                acc.sampled_gpu_s += sampled
                acc.used_gpu_s += used
                acc.useful_gpu_s += min(useful, used)
                acc.unjudged_gpu_s += min(unjudged, sampled)
                acc.sampled_jobs.add(job)
        self._all_cells.clear()
        return super().result()


def _report_with(kind: type[Aggregator], params: ReportParams, jobs: Sequence[JobRecord], pieces: Iterable[SampleSlice]) -> Report:
    aggregator = kind(params)
    aggregator.add_rows(jobs)
    aggregator.add_slices(pieces)
    return aggregator.result()


def _iso(ts_s: float) -> str:
    return datetime.fromtimestamp(ts_s, UTC).strftime("%Y-%m-%dT%H:%M:%S")


# (AllocTRES, node list, GPUs sampled): whole GPUs, a shard job, untyped shards (unresolved), CPU only.
_ALLOCATIONS = (("gres/gpu:a100=1,gres/gpu=1", "a100-01", 1), ("gres/gpu:a100=2,gres/gpu=2", "a100-02", 2),
                ("gres/gpu:t4=4,gres/gpu=4", "t4-01", 4), ("gres/shard:a100=20,gres/shard=20", "a100-03", 1),
                ("gres/shard=20", "node7", 1), ("", "cpu-01", 0))


def _random_jobs(rng: random.Random, since: float, until: float, count: int) -> list[tuple[JobRecord, int]]:
    """Jobs with 1-3 run segments (requeued ones change partition), before, across and after the window's
    edges, some running at its end and one never started: each with how many GPUs its samples cover."""
    jobs: list[tuple[JobRecord, int]] = [(record("99", None, None, "gres/gpu=1", submit=_iso(since + 600)), 0)]
    for number in range(count):
        job = str(rng.choice((10, 1000, 200)) + number)  # ids of mixed lengths: the store's order is by text
        tres, nodes, gpus = rng.choice(_ALLOCATIONS)
        gpus += gpus > 0 and rng.random() < 0.3  # its agent also reports a GPU it does not hold: over the cap
        cls = rng.choice(("train", "infer"))
        cursor = rng.uniform(since - 8 * 3600, until - 1800)
        runs = rng.choice((1, 1, 1, 2, 3))
        for run in range(runs):
            start = round(cursor)
            last = run == runs - 1
            end: float | None = start + rng.choice((600, 1800, 3600, 4 * 3600, 11 * 3600)) + rng.randrange(3600)
            if last and rng.random() < 0.25 and start < until:
                end = None  # still running at the window's end
            state = "RUNNING" if end is None else ("COMPLETED" if last else "REQUEUED")
            jobs.append((record(job, _iso(start), None if end is None else _iso(end), tres, cls=cls, state=state,
                                submit=_iso(start - rng.randrange(3600)), partition=rng.choice(("gpu", "debug")),
                                nodes=nodes), gpus))
            cursor = (end or until) + rng.randrange(300, 3 * 3600)
    return jobs


def _random_samples(rng: random.Random, jobs: Sequence[tuple[JobRecord, int]], until: float) -> list[dict[str, object]]:
    """Agent rows of every run (polls at 30-300 s; some outages; a second of clock skew at the edges; rows at
    each run's start and end, and for some at each clock hour), plus a job the report does not select. A
    rolled-up hour's slice then reaches into the next hour by its first row's offset, as on a cluster."""
    rows: list[dict[str, object]] = []
    for job, gpus in jobs:
        if job.start_ts is None:
            continue
        end = job.end_ts if job.end_ts is not None else until + 1800
        interval, unknown = rng.choice((30.0, 60.0, 300.0)), rng.choice((0.0, 0.0, 0.05))
        hours = range(int(job.start_ts // 3600) + 1, int(end // 3600) + 1) if rng.random() < 0.3 else range(0)
        for gpu in range(gpus):
            times = [job.start_ts - 1.0, job.start_ts, end - 1.0, end] + [hour * 3600.0 for hour in hours]
            cursor = job.start_ts + rng.uniform(0, interval)
            while cursor < end:
                if rng.random() < 0.01:
                    cursor += rng.uniform(600, 3 * 3600)  # the agent was down
                times.append(cursor)
                cursor += interval
            for ts_s in sorted(set(times)):
                util = None if rng.random() < unknown else rng.choice((0.0, 0.5, 100.0, rng.uniform(0, 100)))
                power = None if rng.random() < 0.2 else rng.choice((60.0, 300.0))
                rows.append({"ts": ts_s, "node": job.node_list, "job_id": job.job_id_raw, "gpu_index": gpu, "sm_util_pct": util,
                             "memory_used_mib": 1000.0, "memory_total_mib": 81920.0, "power_draw_w": power, "power_limit_w": 400.0})
    rows += [{"ts": until - 7200 + 60 * i, "node": "a100-09", "job_id": "777777", "gpu_index": 0, "sm_util_pct": 50.0} for i in range(5)]
    return rows


def _store_stream(tmp_path: Path, rows: list[dict[str, object]], since: float, until: float, mark: float) -> list[SampleSlice]:
    """The stream `report` reads: hours before `mark` from their rollups (retention ran), the rest raw."""
    from sqlalchemy import insert

    from slurm_aigc.db import GpuSample, JobGpuSample, open_database, transaction
    from slurm_aigc.report.retention import Retention, rolled_until
    from slurm_aigc.report.samples import SampleStore

    db = open_database(f"sqlite:///{tmp_path / 'stream.db'}")
    with transaction(db) as session:
        session.execute(insert(JobGpuSample), rows)
        # The agents' poll at the run's time: retention keeps what is newer than the newest sample's hour.
        session.add(GpuSample(ts=mark + 3600, node="t4-01", gpu_index=0, sm_util_pct=0.0))
    Retention(db, raw_retention_hours=1.0).run(now_ts=mark + 3600)
    with transaction(db) as session:
        assert rolled_until(session) == mark  # the hours before the mark come from their rollups
    return list(SampleStore(db).job_slices(since, until))


def _assert_same_report(new: Report, old: Report, *, rounding: bool = False) -> None:
    """Field by field, exactly; with `rounding`, GPU-hours to float rounding (the same capped cells, added in another order)."""
    def same(a: GroupFigures, b: GroupFigures) -> None:
        for name in a.__dataclass_fields__:
            x, y = getattr(a, name), getattr(b, name)
            if rounding and isinstance(x, float) and isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9), (a.key, name, x, y)
            else:
                assert x == y, (a.key, name, x, y)

    assert [g.key for g in new.groups] == [g.key for g in old.groups]
    for a, b in zip(new.groups, old.groups, strict=True):
        same(a, b)
    same(new.total, old.total)
    if rounding:
        assert new.util_by_class.keys() == old.util_by_class.keys()
        for cls, points in new.util_by_class.items():
            assert [t for t, _ in points] == [t for t, _ in old.util_by_class[cls]]
            assert [u for _, u in points] == pytest.approx([u for _, u in old.util_by_class[cls]], rel=1e-12)
    else:
        assert new.util_by_class == old.util_by_class
    assert (new.queue_waits_s, new.skipped, new.notes) == (old.queue_waits_s, old.skipped, old.notes)


@pytest.mark.parametrize(("seed", "tz", "group_by"), [(1, timezone(timedelta(hours=5, minutes=30)), ("day", "partition", "class")),
                                                      (2, UTC, ("gpu_type", "user")), (3, timezone(timedelta(hours=-3)), ())])
def test_streaming_fold_gives_the_figures_of_folding_at_the_end(tmp_path: Path, seed: int, tz: timezone,
                                                                group_by: tuple[str, ...]) -> None:
    """A random (seeded) store stream, rollups before the retention mark and raw rows after it: the same
    figures as keeping every cell to the end, on this stream, and on the stream as the store read it before."""
    rng = random.Random(seed)
    since, until, mark = ts("2026-11-30T00:20:00"), ts("2026-12-01T19:40:30"), ts("2026-11-30T21:00:00")
    jobs = _random_jobs(rng, since, until, 45)
    pieces = _store_stream(tmp_path, _random_samples(rng, jobs, until), since, until, mark)
    runs = [job for job, _ in itertools.groupby(p.job_id for p in pieces)]
    assert len(runs) == len(set(runs))  # each job's slices together, its rollups and its raw rows
    assert {p.job_id for p in pieces if p.ts < mark} & {p.job_id for p in pieces if p.ts >= mark}  # jobs across the mark
    records = [job for job, _ in jobs]
    params = ReportParams(since, until, group_by, shards_per_gpu=SHARDS_PER_GPU, tz=tz)
    new = _report_with(Aggregator, params, records, pieces)
    old = _report_with(_Reference, params, records, pieces)
    assert old.total.requeues > 0 and old.total.shard_jobs > 0 and old.total.running_jobs > 0
    assert 0 < old.total.gpu_hours_sampled < old.total.gpu_hours_allocated
    _assert_same_report(new, old)
    # Before, the store read every rollup first, then the raw rows (a stable sort by "after the mark" gives that).
    two_passes = sorted(pieces, key=lambda p: p.ts >= mark)
    _assert_same_report(new, _report_with(_Reference, params, records, two_passes), rounding=True)


def _finished_jobs(count: int) -> tuple[ReportParams, list[JobRecord], Iterator[SampleSlice]]:
    """`count` 2-GPU jobs of 3 h, one starting every 30 min, sampled every 5 min, in the store's order."""
    since = ts("2026-11-30T00:00:00")
    params = ReportParams(since, since + (count + 8) * 1800, shards_per_gpu=SHARDS_PER_GPU, tz=UTC)
    starts = [since + 1800 * i + 900 for i in range(count)]
    jobs = [record(f"{1000 + i}", _iso(start), _iso(start + 3 * 3600), "gres/gpu:a100=2,gres/gpu=2") for i, start in enumerate(starts)]
    pieces = (SampleSlice(f"{1000 + i}", "a100-01", gpu, start + 300 * step, 300.0, 50.0, 1000.0, 81920.0)
              for i, start in enumerate(starts) for gpu in range(2) for step in range(36))
    return params, jobs, pieces


def test_open_cells_do_not_grow_with_the_finished_jobs_the_stream_has_passed() -> None:
    def peak(count: int) -> int:
        params, jobs, pieces = _finished_jobs(count)
        aggregator = Aggregator(params)
        aggregator.add_rows(jobs)
        seen = [0]

        def watched() -> Iterator[SampleSlice]:
            for piece in pieces:
                yield piece
                seen[0] = max(seen[0], aggregator.open_cells)

        aggregator.add_slices(watched())
        assert aggregator.result().total.gpu_hours_used == pytest.approx(count * 3.0)
        return seen[0]

    few, many = peak(10), peak(200)
    assert many == few <= 12  # one job's 4 hours and the last hours of the few running beside it, not 800 cells


def test_the_hour_across_the_retention_mark_is_capped_once(tmp_path: Path) -> None:
    """A rolled-up hour's slice reaches past the mark by its first row's offset, into the hour of the first raw
    rows; the store hands a job's rollups and raw rows together, so that hour is capped once, not per part."""
    job = record("5", "2026-11-30T10:00:00", "2026-11-30T12:00:00", "gres/gpu:a100=1,gres/gpu=1")
    other = record("6", "2026-11-30T10:00:00", "2026-11-30T12:00:00", "gres/gpu:a100=1,gres/gpu=1")
    start = ts("2026-11-30T10:00:30")
    rows: list[dict[str, object]] = [
        {"ts": start + 60 * i, "node": "a100-01", "job_id": name, "gpu_index": gpu, "sm_util_pct": 50.0}
        for name, gpus in (("5", 2), ("6", 1)) for gpu in range(gpus) for i in range(120)]  # job 5 also on a GPU it does not hold
    pieces = _store_stream(tmp_path, rows, params().since_ts, ts("2026-11-30T12:00:00"), ts("2026-11-30T11:00:00"))
    assert [job for job, _ in itertools.groupby(p.job_id for p in pieces)] == ["5", "6"]
    by_job = {g.key[0]: g for g in build_report(params("user"), [job], pieces).groups}
    assert by_job["aigc-alice"].gpu_hours_sampled == pytest.approx(2.0)  # capped apart: 2 h + 2 x 30 s
    report = build_report(params(), [job, other], pieces)
    assert report.total.gpu_hours_sampled == pytest.approx(2.0 + (7200 - 30) / 3600)  # job 6: from 10:00:30
    _assert_same_report(report, _report_with(_Reference, params(), [job, other], pieces))


def test_a_job_may_come_back_for_hours_not_yet_capped() -> None:
    jobs = [record("5", "2026-11-30T10:00:00", "2026-11-30T16:00:00", "gres/gpu=1"),
            record("6", "2026-11-30T13:00:00", "2026-11-30T14:00:00", "gres/gpu=1")]
    pieces = (slices_for("5", "2026-11-30T10:00:00", 120, 50.0) + slices_for("6", "2026-11-30T13:00:00", 60, 80.0)
              + slices_for("5", "2026-11-30T14:00:00", 120, 20.0))
    report = build_report(params(), jobs, pieces)
    assert report.total.gpu_hours_used == pytest.approx(1.0 + 0.8 + 0.4)
    _assert_same_report(report, _report_with(_Reference, params(), jobs, pieces))


def test_a_job_whose_samples_come_apart_is_an_error_not_other_figures() -> None:
    jobs = [record("5", "2026-11-30T10:00:00", "2026-11-30T12:00:00", "gres/gpu=1"),
            record("6", "2026-11-30T13:00:00", "2026-11-30T14:00:00", "gres/gpu=1")]
    pieces = slices_for("5", "2026-11-30T10:00:00", 60, 50.0) + slices_for("6", "2026-11-30T13:00:00", 60, 50.0)
    with pytest.raises(ValueError, match="samples of job 5 out of order"):
        build_report(params(), jobs, pieces + slices_for("5", "2026-11-30T10:30:00", 1, 50.0))


def test_a_class_with_its_own_reclaim_thresholds_is_judged_by_them(tmp_path: Path) -> None:
    # reclaim.classes.train.busy_util_pct: 90 makes reclaim call 92 % SM at 150 W of 700 W
    # fake-busy for a train job; the report counted that hour as useful work by the defaults' 95 %.
    from slurm_aigc.policy.loader import load_policy

    shipped = (Path(__file__).resolve().parents[2] / "etc" / "slurm-aigc.yaml").read_text()
    policy_file = tmp_path / "site.yaml"
    policy_file.write_text(shipped.replace("  classes:\n    train:\n", "  classes:\n    train:\n      busy_util_pct: 90\n", 1))
    reclaim = load_policy(policy_file).reclaim
    assert reclaim.policy_for("train").busy_util_pct == 90  # the edit took
    useful, by_class = useful_rules(reclaim)
    assert set(by_class) == {"train"}  # infer overrides only its window: the defaults' rule
    start = ts("2026-11-30T01:00:00")
    hung = [_slice(start, 92.0, 150.0, 700.0)]
    judged = ReportParams(since_ts=params().since_ts, until_ts=params().until_ts, tz=UTC, useful=useful,
                          useful_by_class=by_class)
    train = record("901", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/gpu=1", cls="train")
    assert build_report(judged, [train], hung).total.gpu_hours_useful == pytest.approx(0.0)
    infer = record("901", "2026-11-30T01:00:00", "2026-11-30T02:00:00", "gres/gpu=1", cls="infer")
    assert build_report(judged, [infer], hung).total.gpu_hours_useful == pytest.approx(0.92)  # 92 < 95: work
