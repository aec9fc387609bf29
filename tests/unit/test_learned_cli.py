"""`slurm-aigc learned show`, `classify --user` and `replay convert --untagged-fraction` (issue 14.4)."""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import replace
from pathlib import Path

import yaml
from click.testing import CliRunner

from slurm_aigc.cli.learned import file_problems, learned
from slurm_aigc.cli.policy import classify
from slurm_aigc.cli.replay import replay
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.replay.workload_files import read_workload
from slurm_aigc.telemetry.learned import LearnedEntry, format_table
from tests.unit.test_replay_cli import traces_dir

ENTRY = LearnedEntry(1001, "aigc-alice", "sd-gen", "imagegen", 8, 0.4, 6, 6, 7200.0)


def setup(tmp_path: Path, entries: list[LearnedEntry], enabled: bool = True) -> Path:
    table = tmp_path / "learned.txt"
    table.write_bytes(format_table(entries))
    table.chmod(0o644)
    document = yaml.safe_load(shipped_policy().read_text())
    document["learned"].update(enabled=enabled, file=str(table), refresh_seconds=0, max_entries=100)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(document))
    return policy


def test_show_lists_the_table_and_filters_by_user_and_name(tmp_path: Path) -> None:
    policy = setup(tmp_path, [ENTRY, replace(ENTRY, uid=1002, user="aigc-bob", pattern="train-llama3-8b")])
    result = CliRunner().invoke(learned, ["show", "--config", str(policy)])
    assert result.exit_code == 0, result.output
    assert "sd-gen" in result.output and "train-llama3-8b" in result.output and "2 entries" in result.output
    one = CliRunner().invoke(learned, ["show", "--config", str(policy), "--user", "1001", "--name", "SD_gen.0042", "--json"])
    assert one.exit_code == 0 and [json.loads(line)["pattern"] for line in one.output.splitlines()] == ["sd-gen"]


def test_show_warns_about_a_file_others_may_write_and_fails_on_a_missing_one(tmp_path: Path) -> None:
    policy = setup(tmp_path, [ENTRY])
    (tmp_path / "learned.txt").chmod(0o666)
    result = CliRunner().invoke(learned, ["show", "--config", str(policy)])
    assert result.exit_code == 0 and "writable by group or others (mode 0666)" in result.output
    (tmp_path / "learned.txt").unlink()
    missing = CliRunner().invoke(learned, ["show", "--config", str(policy)])
    assert missing.exit_code != 0 and "no learned table yet" in str(missing.exception or missing.output)


def test_file_problems_names_owner_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"")
    path.chmod(0o644)
    assert file_problems(path, frozenset({os.geteuid()})) == []
    assert file_problems(path, frozenset({12345})) == [f"owned by uid {os.geteuid()}, not root or SlurmUser"]


def test_classify_with_user_prints_the_key_the_entry_and_why(tmp_path: Path) -> None:
    uid = pwd.getpwnam("root").pw_uid
    policy = setup(tmp_path, [replace(ENTRY, uid=uid, user="root")])
    args = ["--policy", str(policy), "--partitions-from", "none", "--user", "root", "--name", "sd-gen-0042",
            "--gres", "gpu:1"]
    result = CliRunner().invoke(classify, [*args, "--json"])
    assert result.exit_code == 0, result.output
    learned_part = json.loads(result.output)["learned"]
    assert learned_part["key"] == {"uid": uid, "pattern": "sd-gen"} and learned_part["entry"]["jobs"] == 6
    assert "p95 of 6 job peaks 7200 MiB" in learned_part["why"]
    text = CliRunner().invoke(classify, args)
    assert "learned: key uid=0 pattern=sd-gen" in text.output and "from 6 job(s)" in text.output
    plain = CliRunner().invoke(classify, ["--policy", str(policy), "--partitions-from", "none", "--json"])
    assert "learned" not in json.loads(plain.output)  # without --user the output is as before


def test_classify_says_why_a_wide_key_has_no_vram(tmp_path: Path) -> None:
    uid = pwd.getpwnam("root").pw_uid
    wide = replace(ENTRY, uid=uid, user="root", vram_gib=None, p50_peak_mib=3000.0, p95_peak_mib=30000.0)
    policy = setup(tmp_path, [wide])
    result = CliRunner().invoke(classify, ["--policy", str(policy), "--partitions-from", "none", "--user", "root",
                                           "--name", "sd-gen-0042", "--gres", "gpu:1", "--json"])
    assert result.exit_code == 0, result.output
    learned_part = json.loads(result.output)["learned"]
    assert learned_part["entry"]["p50_peak_mib"] == 3000.0
    assert "median 3000 MiB to a p95 30000 MiB, over max_vram_spread 2x" in learned_part["why"]
    text = CliRunner().invoke(classify, ["--policy", str(policy), "--partitions-from", "none", "--user", "root",
                                         "--name", "sd-gen-0042", "--gres", "gpu:1"])
    assert "learned: class=imagegen vram=- sm=0.4 from 6 job(s)" in text.output  # no VRAM learned: not "-G"


def test_untagged_fraction_strips_tags_deterministically_and_nothing_else(tmp_path: Path) -> None:
    root = traces_dir(tmp_path)
    workloads = {}
    for name, extra in (("tagged", []), ("a", ["--untagged-fraction", "0.7"]), ("b", ["--untagged-fraction", "0.7"])):
        result = CliRunner().invoke(replay, ["convert", "--trace", "mix", "--input", str(root), "-o",
                                             str(tmp_path / f"{name}.csv"), "--seed", "3", *extra])
        assert result.exit_code == 0, result.output
        workloads[name] = read_workload(tmp_path / f"{name}.csv")
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    tagged, untagged = workloads["tagged"].jobs, workloads["a"].jobs
    share = sum(1 for j in untagged if not j.tags) / len(untagged)
    assert all(j.tags for j in tagged) and 0.55 <= share <= 0.85, share
    assert [replace(j, tags="") for j in tagged] == [replace(j, tags="") for j in untagged]
