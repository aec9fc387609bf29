"""`learned.max_entries` is shared out among users (review of issue 14.4, defect 3).

Entries were ranked by job count across all users and cut there: one user's hyper-parameter
sweep with structured names (each name its own key, each well backed) filled the table and
pushed every other user's entries out.
"""

from __future__ import annotations

from dataclasses import replace

from slurm_aigc.policy.model import LearnedConfig
from slurm_aigc.telemetry.learned import HistoryJob, JobUsage, LearnedEntry, fair_cut, learn
from tests.unit.test_learned import ALICE, BOB, CLASSES, NOW, job

CONFIG = LearnedConfig(enabled=True)
CAROL = 1003


def jobs_of(uid: int, user: str, pattern: str, count: int) -> list[HistoryJob]:
    return [job(f"{uid}-{pattern}-{i}", f"{pattern}-{i:04d}", uid=uid, user=user) for i in range(count)]


def test_a_sweep_of_many_well_backed_keys_cannot_evict_another_users_entry() -> None:
    sweep = [j for k in range(50) for j in jobs_of(ALICE, "aigc-alice", f"sweep-lr{k}x", 20)]  # 50 keys x 20 jobs
    mine = jobs_of(BOB, "aigc-bob", "sd-gen", 5)  # one key, the least backed possible
    everything = sweep + mine
    usage = {j.job_id: JobUsage(6000.0, 40.0) for j in everything}
    entries = learn(everything, usage, replace(CONFIG, max_entries=10), NOW, CLASSES)
    assert len(entries) == 10
    assert (BOB, "sd-gen") in {e.key for e in entries}
    assert sum(e.uid == ALICE for e in entries) == 9  # the sweep keeps the rest of the room
    assert entries[-1].key == (BOB, "sd-gen")  # the file still lists the best-backed first


def entry(uid: int, pattern: str, jobs: int) -> LearnedEntry:
    return LearnedEntry(uid, f"u{uid}", pattern, "infer", 8, 0.4, jobs, jobs, 7000.0)


def test_rounds_take_every_users_best_entry_before_anyones_second() -> None:
    entries = ([entry(ALICE, f"a{i}x", 100 - i) for i in range(6)] + [entry(BOB, "b1x", 7), entry(BOB, "b2x", 6)]
               + [entry(CAROL, "c1x", 5)])
    kept = fair_cut(entries, 5)
    # Round 1: a0, b1, c1; round 2: a1, b2 (the best-backed first within the round); a2.. cut.
    assert {e.pattern for e in kept} == {"a0x", "b1x", "c1x", "a1x", "b2x"}
    assert [e.pattern for e in kept] == ["a0x", "a1x", "b1x", "b2x", "c1x"]  # listed best-backed first


def test_with_room_for_all_nothing_is_cut_and_with_more_users_than_room_the_best_backed_win() -> None:
    entries = [entry(ALICE, "a1x", 9), entry(BOB, "b1x", 8), entry(CAROL, "c1x", 7)]
    assert fair_cut(entries, 10) == entries
    assert [e.uid for e in fair_cut(entries, 2)] == [ALICE, BOB]
