"""Learned defaults for untagged jobs (issue 14.4): the learner, its file, the hook's lookup, the policy section."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_aigc.errors import ConfigError
from slurm_aigc.policy import hookruntime
from slurm_aigc.policy.hookruntime import SUCCESS, HookRuntime
from slurm_aigc.policy.loader import load_policy, parse_policy_text
from slurm_aigc.policy.model import LearnedConfig
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.report.records import SampleSlice
from slurm_aigc.tags import trusted_tags
from slurm_aigc.telemetry.learned import (
    HEADER,
    PATTERN_READ,
    HistoryJob,
    JobUsage,
    LearnedEntry,
    LearnedTableError,
    format_table,
    learn,
    lookup,
    name_pattern,
    parse_table,
    usage_from_slices,
)

ALICE, BOB = 1001, 1002
NOW = 1_800_000_000.0
DAY = 86400.0
CLASSES = ("train", "finetune", "infer", "imagegen", "videogen", "audio", "batch", "interactive")
SCRIPT = "#!/bin/bash\nsrun python gen.py\n"


# --------------------------------------------------------------------------- name patterns


@pytest.mark.parametrize(("name", "pattern"), [
    ("sd-gen-0042", "sd-gen"),
    ("sd-gen-0043", "sd-gen"),
    ("SD_Gen.0042", "sd-gen"),
    ("sdxl_2026-12-03_001", "sdxl"),
    ("train-llama3-8b-run7", "train-llama3-8b"),  # model sizes and digits inside a word stay
    ("train-llama3-70b-seed42-v2", "train-llama3-70b"),
    ("eval-deadbeef1234", "eval"),  # a hash
    ("job.20261203t1230z", "job"),  # a compact timestamp
    ("serve.sh", "serve-sh"),
    ("12345", "12345"),  # the first word is never dropped
    ("  --  ", ""),
    ("", ""),
    ("生成图片-0042", "生成图片"),  # non-ASCII bytes are word bytes
    ("*llama*?[a-z]%s.*-7", "llama-a-z-s"),  # glob and Lua pattern characters are separators
    ("name\twith\nnewline 3", "name-with-newline"),
])
def test_names_become_patterns(name: str, pattern: str) -> None:
    assert name_pattern(name) == pattern
    assert hook().learned_key(name) == pattern


def test_a_very_long_name_keys_on_its_first_bytes_as_slurmdbd_keeps_them() -> None:
    long = "gen-" + "x" * 5000 + "-0042"
    assert name_pattern(long) == "gen-" + "x" * (PATTERN_READ - 4)
    # sacct returns at most 255 bytes of a name; the key is the same as from the full name.
    assert name_pattern(long[:255]) == name_pattern(long) == hook().learned_key(long)


NAME_PIECES = ["sd", "-", "_", ".", "0042", "2026", "v2", "run", "7", "deadbeef12", "T", "z", "8b", "é", "生",
               "\udc80", "*", "?", "%", "[", " ", "\t", "\n", "\x00", "\x7f", "A", "Z", "ſ", "\u212a"]


@lru_cache(maxsize=1)
def hook() -> HookRuntime:
    return HookRuntime(render_hook(load_policy(shipped_policy())))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(NAME_PIECES) | st.text(max_size=5), max_size=40).map("".join) | st.text(max_size=300))
def test_hook_and_python_make_the_same_key(name: str) -> None:
    assert hook().learned_key(name) == name_pattern(name), repr(name)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_a_pattern_is_plain_words_and_its_own_pattern(name: str) -> None:
    pattern = name_pattern(name)
    raw = pattern.encode("utf-8", "surrogateescape")
    assert len(raw) <= PATTERN_READ and not set(raw) & set(b" \t\n\r\v\f*?%[]()^$.")
    assert name_pattern(pattern) == pattern


# --------------------------------------------------------------------------- the learner


def job(job_id: str, name: str = "sd-gen-0001", *, uid: int | None = ALICE, user: str = "aigc-alice",
        stamp: str = "aigc_class=imagegen", gpus: int = 1, age_days: float = 1.0) -> HistoryJob:
    end = NOW - age_days * DAY
    return HistoryJob(job_id, user, uid, name, stamp, gpus, end, end - 600)


def history(n: int, **kwargs: Any) -> list[HistoryJob]:
    return [job(str(i), f"sd-gen-{i:04d}", **kwargs) for i in range(n)]


def usage_for(jobs: list[HistoryJob], peaks_mib: list[float], sm_pct: float = 40.0) -> dict[str, JobUsage]:
    return {j.job_id: JobUsage(peak, sm_pct) for j, peak in zip(jobs, peaks_mib, strict=True)}


CONFIG = LearnedConfig(enabled=True)


def test_five_similar_jobs_teach_class_vram_and_sm() -> None:
    jobs = history(5)
    [entry] = learn(jobs, usage_for(jobs, [5000, 6000, 7000, 7100, 7200]), CONFIG, NOW, CLASSES)
    assert (entry.uid, entry.pattern, entry.job_class, entry.sm, entry.jobs, entry.class_jobs) == \
        (ALICE, "sd-gen", "imagegen", 0.4, 5, 5)
    # p95 of five peaks is the largest (nearest rank); 7200 MiB x 1.1 = 7.73 GiB -> 8 GiB.
    assert entry.p95_peak_mib == 7200 and entry.vram_gib == 8


def test_one_leaking_run_does_not_set_the_vram_of_every_later_job() -> None:
    jobs = history(20)
    peaks = [6000.0] * 19 + [80000.0]
    [entry] = learn(jobs, usage_for(jobs, peaks), CONFIG, NOW, CLASSES)
    assert entry.vram_gib == 7  # 6000 x 1.1 / 1024 = 6.4 -> 7, not 86


def test_a_key_whose_peaks_spread_wide_learns_no_vram_but_keeps_class_and_sm() -> None:
    # One name for inference jobs of every size (the openb stream: 2-40 GiB, median 12): the p95
    # would send all of them, most fitting a 16 GiB GPU, to the 80 GiB type.
    jobs = history(20)
    wide = [2000.0 + 2000.0 * i for i in range(20)]  # 2,000-40,000 MiB: p95 38,000 over p50 20,000 = 1.9x
    [entry] = learn(jobs, usage_for(jobs, wide), replace(CONFIG, max_vram_spread=1.8), NOW, CLASSES)
    assert (entry.vram_gib, entry.p50_peak_mib, entry.p95_peak_mib) == (None, 20000.0, 38000.0)
    assert (entry.job_class, entry.sm) == ("imagegen", 0.4)
    [kept] = learn(jobs, usage_for(jobs, wide), CONFIG, NOW, CLASSES)  # default 2x: 1.9x is tight enough
    assert kept.vram_gib == 41 and kept.p50_peak_mib == 20000.0


def test_fewer_than_min_jobs_learn_nothing() -> None:
    jobs = history(4)
    assert learn(jobs, usage_for(jobs, [5000] * 4), CONFIG, NOW, CLASSES) == []
    assert len(learn(jobs, usage_for(jobs, [5000] * 4), replace(CONFIG, min_jobs=4), NOW, CLASSES)) == 1


def test_jobs_older_than_max_age_days_do_not_count() -> None:
    jobs = history(3) + [job(f"old{i}", f"sd-gen-9{i}", age_days=20) for i in range(3)]
    assert learn(jobs, usage_for(jobs, [5000] * 6), CONFIG, NOW, CLASSES) == []
    assert len(learn(jobs, usage_for(jobs, [5000] * 6), replace(CONFIG, max_age_days=30), NOW, CLASSES)) == 1


def test_the_hooks_own_guesses_are_no_evidence_of_a_class_but_their_usage_is() -> None:
    jobs = history(5, stamp="aigc_class=imagegen aigc_learned=1")
    [entry] = learn(jobs, usage_for(jobs, [5000] * 5), CONFIG, NOW, CLASSES)
    assert entry.job_class is None and entry.class_jobs == 0 and entry.vram_gib == 6


@pytest.mark.parametrize("stamp", ["aigc_class=unknown", "aigc_class=interactive", "", "notes aigc_class=infer",
                                   "aigc_class=nosuchclass"])
def test_no_class_from_jobs_without_a_trusted_usable_stamp(stamp: str) -> None:
    jobs = history(5, stamp=stamp)
    [entry] = learn(jobs, usage_for(jobs, [5000] * 5), CONFIG, NOW, CLASSES)
    assert entry.job_class is None


def test_a_class_needs_min_class_share_of_the_evidence() -> None:
    jobs = history(8) + [job(f"i{i}", f"sd-gen-{100 + i}", stamp="aigc_class=infer") for i in range(2)]
    usage = usage_for(jobs, [5000] * 10)
    assert learn(jobs, usage, CONFIG, NOW, CLASSES)[0].job_class == "imagegen"  # 8 of 10
    assert learn(jobs, usage, replace(CONFIG, min_class_share=0.9), NOW, CLASSES)[0].job_class is None


def test_users_root_non_gpu_and_unfinished_jobs() -> None:
    mine = history(5)
    theirs = [replace(j, job_id=f"b{j.job_id}", uid=BOB, user="aigc-bob") for j in mine]
    skipped = ([replace(j, job_id=f"r{j.job_id}", uid=0) for j in mine]
               + [replace(j, job_id=f"c{j.job_id}", gpus=0, name="cpu-0001") for j in mine]
               + [replace(j, job_id=f"u{j.job_id}", uid=None, name="ghost-1") for j in mine]
               + [replace(j, job_id=f"p{j.job_id}", end_ts=None, name="running-1") for j in mine])
    everything = mine + theirs + skipped
    usage = {j.job_id: JobUsage(5000, 50) for j in everything}
    entries = learn(everything, usage, CONFIG, NOW, CLASSES)
    assert sorted(e.key for e in entries) == [(ALICE, "sd-gen"), (BOB, "sd-gen")]


def test_a_requeued_job_counts_once() -> None:
    runs = [replace(job("7"), end_ts=NOW - DAY - i) for i in range(5)]
    assert learn(runs, {"7": JobUsage(5000, 50)}, replace(CONFIG, min_jobs=2), NOW, CLASSES) == []


def test_max_entries_keeps_the_best_backed() -> None:
    jobs = [job(f"{p}{i}", f"{p}-{i}") for p, n in (("aa", 5), ("bb", 9), ("cc", 7)) for i in range(n)]
    usage = {j.job_id: JobUsage(5000, 50) for j in jobs}
    entries = learn(jobs, usage, replace(CONFIG, max_entries=2), NOW, CLASSES)
    assert [e.pattern for e in entries] == ["bb", "cc"]


def test_usage_from_slices_takes_the_peak_gpu_and_the_sm_while_computing() -> None:
    slices = [SampleSlice("1", "n", 0, 0, 10, 100.0, 4000, 16384), SampleSlice("1", "n", 1, 0, 30, 60.0, 6000, 16384),
              SampleSlice("1", "n", 0, 10, 50, 0.0, 7000, 16384),  # idle: not computing
              SampleSlice("1", "n", 0, 60, 20, 3.0, 1000, 16384),  # loading
              SampleSlice("1", "n", 0, 80, 5, None, 2000, 16384), SampleSlice("2", "n", 0, 0, 10, None, None, None),
              SampleSlice("3", "n", 0, 0, 10, 0.0, 500, 16384)]
    found = usage_from_slices(slices)
    # (100 x 10 + 60 x 30) / 40 = 70: a bursty server's busy phases, not its mean over the run (26).
    assert found == {"1": JobUsage(7000, 70.0), "3": JobUsage(500, None)}  # job 2: nothing known


# --------------------------------------------------------------------------- the file


def entry(**fields: Any) -> LearnedEntry:
    base = LearnedEntry(ALICE, "aigc-alice", "sd-gen", "imagegen", 8, 0.4, 5, 5, 7200.0)
    return replace(base, **fields)


def test_the_file_round_trips_hostile_patterns() -> None:
    entries = [entry(), entry(uid=BOB, pattern=name_pattern("生成图片-0042"), job_class=None, sm=None),
               entry(pattern=name_pattern("x" * 4000), vram_gib=None, p95_peak_mib=None, user="-"),
               entry(pattern="wide", vram_gib=None, p50_peak_mib=3000.0, p95_peak_mib=30000.0)]
    data = format_table(entries)
    assert data.startswith(HEADER) and parse_table(data) == entries
    assert lookup(parse_table(data), BOB, "生成图片-0099") == entries[1]
    assert lookup(parse_table(data), ALICE, "生成图片-0099") is None


@pytest.mark.parametrize(("line", "words"), [
    (b"1001 sd-gen imagegen 8 0.4 5 5", "10 fields"),
    (b"1001 sd gen imagegen 8 0.4 5 5 6000 7200 a", "10 fields"),
    (b"1001 sd-gen imagegen 8 0.4 5 5 x 7200 a", "x"),
    (b"alice sd-gen imagegen 8 0.4 5 5 7200 a", "uid"),
    (b"1001 sd-gen-0042 imagegen 8 0.4 5 5 7200 a", "pattern"),
    (b"1001 *gen imagegen 8 0.4 5 5 7200 a", "pattern"),
    (b"1001 sd-gen Image-Gen 8 0.4 5 5 7200 a", "class"),
    (b"1001 sd-gen imagegen 8 1.5 5 5 7200 a", "sm"),
    (b"1001 sd-gen imagegen 0 0.4 5 5 7200 a", "vram"),
    (b"1001 sd-gen imagegen lots 0.4 5 5 7200 a", "lots"),
])
def test_a_bad_line_is_an_error_naming_it(line: bytes, words: str) -> None:
    with pytest.raises(LearnedTableError, match=f"t.txt: line 2: .*{words}"):
        parse_table(HEADER + line + b"\n", "t.txt")


def test_a_v1_table_without_the_median_still_reads() -> None:
    # Written by the previous release until the controller's next learning interval rewrites it.
    [old] = parse_table(b"# slurm-aigc learned defaults v1\n1001 sd-gen imagegen 8 0.4 5 5 7200 aigc-alice\n")
    assert old == entry()


# --------------------------------------------------------------------------- the hook


def runtime(tmp_path: Path, entries: list[LearnedEntry] | None = None, *, enabled: bool = True,
            raw: bytes | None = None, **learned: Any) -> HookRuntime:
    path = tmp_path / "learned.txt"
    if raw is not None or entries is not None:
        path.write_bytes(raw if raw is not None else format_table(entries or []))
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["model_prefer"]["published_features_file"] = str(tmp_path / "published.txt")
    document["learned"] = {"enabled": enabled, "file": str(path), "refresh_seconds": 0, "max_entries": 100, **learned}
    return HookRuntime(render_hook(parse_policy_text(yaml.safe_dump(document), "test-policy.yaml")))


def submit(rt: HookRuntime, name: str = "sd-gen-0099", uid: int = ALICE, **fields: Any) -> Any:
    fields = {"script": SCRIPT, "name": name, "user_id": uid, "tres_per_node": "gres:gpu:1", **fields}
    return rt.submit(fields, submit_uid=uid)


def test_an_untagged_job_with_a_learned_entry_is_shared_and_stamped(tmp_path: Path) -> None:
    result = submit(runtime(tmp_path, [entry()]))
    assert result.rc == SUCCESS and result.job_class == "imagegen"
    assert result.changes["tres_per_node"][1].startswith("gres:shard:")
    assert trusted_tags(result.changes["admin_comment"][1]) == {"class": "imagegen", "learned": "1"}
    assert any("earlier jobs named like 'sd-gen'" in m and "type=imagegen" in m and "vram=8G" in m
               for m in result.messages)


def strict_runtime(tmp_path: Path, entries: list[LearnedEntry]) -> HookRuntime:
    path = tmp_path / "learned.txt"
    path.write_bytes(format_table(entries))
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["model_prefer"]["published_features_file"] = str(tmp_path / "published.txt")
    document["rewrites"]["vram_fit"]["reject_misfit"] = True
    document["hook"]["strict_tags"] = True
    document["learned"] = {"enabled": True, "file": str(path), "refresh_seconds": 0, "max_entries": 100}
    return HookRuntime(render_hook(parse_policy_text(yaml.safe_dump(document), "test-policy.yaml")))


def test_a_learned_vram_no_gpu_can_hold_is_dropped_never_a_reject(tmp_path: Path) -> None:
    # Jobs that filled a 16 GB T4 (p95 15,000 MiB + 10 %) learn 17G; before, the owner's next
    # untagged `--gres=gpu:t4:1` job was rejected in strict mode for a vram it never declared.
    rt = strict_runtime(tmp_path, [entry(job_class="finetune", vram_gib=17), entry(pattern="big", vram_gib=82)])
    typed = submit(rt, "sd-gen-0100", tres_per_node="gres:gpu:t4:1")
    assert typed.rc == SUCCESS and typed.job_class == "finetune"
    assert any("learned vram=17G does not fit the t4 GPUs (16G) you asked for; not used" in m for m in typed.messages)
    assert not any("declared" in m for m in typed.messages)
    untyped = submit(rt, "big-0001")
    assert untyped.rc == SUCCESS and any("learned vram=82G fits no GPU type; not used" in m for m in untyped.messages)
    assert "features" not in untyped.changes  # no type restriction from a dropped vram
    # The user's own vram= is still theirs to fix: rejected in strict mode, as before.
    declared = submit(rt, "other-0001", comment="aigc:type=finetune,vram=17G", tres_per_node="gres:gpu:t4:1")
    assert declared.rc != SUCCESS


def test_the_learned_key_reads_the_uid_as_an_integer_whatever_the_lua_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # slurmctld pushes the uid with lua_pushnumber: a float in Lua 5.3+, "1001.0" by tostring,
    # which never matched the table's "1001 ..." lines there. (Lua 5.1 prints both alike.)
    lua54 = pytest.importorskip("lupa.lua54")

    def lua54_runtime(*args: Any, **kwargs: Any) -> Any:
        lua = lua54.LuaRuntime(*args, **kwargs)
        lua.execute(b"unpack = table.unpack; loadstring = load")  # the 5.1 names the hook and harness use
        return lua
    monkeypatch.setattr(hookruntime, "lua51", SimpleNamespace(LuaRuntime=lua54_runtime, LuaError=lua54.LuaError))
    rt = runtime(tmp_path, [entry()])
    fields = {"script": SCRIPT, "name": "sd-gen-0099", "user_id": ALICE, "tres_per_node": "gres:gpu:1"}
    assert rt.submit(fields, submit_uid=float(ALICE)).job_class == "imagegen"


def test_without_an_entry_or_with_learning_off_the_job_is_as_before(tmp_path: Path) -> None:
    for index, (entries, enabled, name, uid) in enumerate((([entry()], True, "other-0001", ALICE),
                                                           ([entry()], True, "sd-gen-0099", BOB),
                                                           ([entry()], False, "sd-gen-0099", ALICE),
                                                           (None, True, "sd-gen-0099", ALICE))):  # no file
        (tmp_path / str(index)).mkdir()
        rt = runtime(tmp_path / str(index), entries, enabled=enabled)
        result = submit(rt, name, uid)
        assert result.job_class == "unknown" and set(result.changes) == {"admin_comment"}
        assert trusted_tags(result.changes["admin_comment"][1]) == {"class": "unknown"}


def test_a_tag_with_a_type_wins_and_a_tag_without_one_is_completed(tmp_path: Path) -> None:
    rt = runtime(tmp_path, [entry(job_class="infer", vram_gib=30)])
    typed = submit(rt, comment="aigc:type=imagegen")
    assert typed.job_class == "imagegen" and "tres_per_node" not in typed.changes
    assert "learned" not in trusted_tags(typed.changes["admin_comment"][1])
    completed = submit(rt, comment="aigc:vram=6G")  # the user's vram stays; the class is learned
    assert completed.job_class == "infer" and completed.changes["tres_per_node"][1].startswith("gres:shard:")
    assert any("type=infer (learned" in m for m in completed.messages)  # vram=30G was not used
    assert trusted_tags(completed.changes["admin_comment"][1])["learned"] == "1"


def test_root_and_updates_never_use_the_table(tmp_path: Path) -> None:
    rt = runtime(tmp_path, [entry(uid=0), entry()])
    assert submit(rt, uid=0).job_class == "unknown"
    record = {"name": "sd-gen-0099", "job_state": 0, "tres_per_node": "gres:gpu:1", "user_id": ALICE,
              "admin_comment": "aigc_class=unknown"}
    modified = rt.modify({"comment": "notes"}, record, modify_uid=ALICE)
    assert modified.job_class == "unknown" and "tres_per_node" not in modified.changes


@pytest.mark.parametrize("line", [
    b"1001 sd-gen interactive - - 5 5 - a",  # learning cannot make a batch job interactive
    b"1001 sd-gen nosuchclass - - 5 5 - a",
    b"1001 sd-gen - nan nan 5 5 - a",
    b"1001 sd-gen - -3 2 5 5 - a",
    b"1001 sd-gen - inf -0.5 5 5 - a",
])
def test_values_the_policy_cannot_use_are_dropped(tmp_path: Path, line: bytes) -> None:
    result = submit(runtime(tmp_path, raw=HEADER + line + b"\n"))
    assert result.job_class == "unknown" and set(result.changes) == {"admin_comment"}
    assert "learned" not in trusted_tags(result.changes["admin_comment"][1])


def test_the_hook_reads_at_most_max_entries_lines(tmp_path: Path) -> None:
    entries = [entry(pattern=f"job{i}x") for i in range(3)] + [entry()]
    assert submit(runtime(tmp_path, entries, max_entries=3)).job_class == "unknown"
    assert submit(runtime(tmp_path, entries, max_entries=4)).job_class == "imagegen"


def test_the_learned_sm_reaches_the_rules(tmp_path: Path) -> None:
    """`view.learned.sm` (0..1) is what compute-aware sharing (rule_shard, issue 14.3) reads."""
    busy = submit(runtime(tmp_path, [entry(sm=0.95)])).changes.get("tres_per_node")
    light = submit(runtime(tmp_path, [entry(sm=0.05)])).changes.get("tres_per_node")
    assert light is not None and busy != light


# --------------------------------------------------------------------------- the policy section


def parse(learned: Any) -> LearnedConfig:
    document = yaml.safe_load(shipped_policy().read_text())
    document["learned"] = learned
    return parse_policy_text(yaml.safe_dump(document), "p.yaml").learned


def test_the_section_is_off_by_default_and_read_when_given() -> None:
    assert parse(None) == LearnedConfig() and not LearnedConfig().enabled
    got = parse({"enabled": True, "file": "/srv/learned.txt", "min_jobs": 3, "max_age_days": 7.5})
    assert (got.enabled, got.file, got.min_jobs, got.max_age_days) == (True, "/srv/learned.txt", 3, 7.5)


@pytest.mark.parametrize(("learned", "key"), [
    ({"file": "learned.txt"}, "learned.file"),
    ({"file": None}, "learned.file"),
    ({"min_jobs": 0}, "learned.min_jobs"),
    ({"max_age_days": 0}, "learned.max_age_days"),
    ({"max_entries": 0}, "learned.max_entries"),
    ({"refresh_seconds": -1}, "learned.refresh_seconds"),
    ({"min_class_share": 0.5}, "learned.min_class_share"),
    ({"vram_margin_pct": -5}, "learned.vram_margin_pct"),
    ({"max_vram_spread": 0.9}, "learned.max_vram_spread"),
    ({"enabled": "yes"}, "learned.enabled"),
    ({"max_age_days": float("nan")}, "learned.max_age_days"),
    ({"colour": 1}, "learned"),
])
def test_bad_values_are_errors_naming_the_key(learned: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(learned)
    assert caught.value.key_path == key
