"""Bad input to the policy commands: a clean error naming the file (or option), never a traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_aigc import fsio
from slurm_aigc.cli.main import main
from slurm_aigc.cli.policy import classify, hook_text, policy
from slurm_aigc.errors import AigcError, ConfigError
from slurm_aigc.policy.loader import load_policy, parse_policy_text
from slurm_aigc.policy.paths import shipped_policy

POLICY = str(shipped_policy())


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """`slurm-aigc ARGV` in this process: (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["slurm-aigc", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


# --------------------------------------------------------------------------- not UTF-8


def test_a_binary_policy_file_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    result = CliRunner().invoke(policy, ["check", "--policy", str(binary)])
    assert isinstance(result.exception, ConfigError), result.exception
    assert str(result.exception) == f"{binary}: not UTF-8 text (byte 0)" and result.exception.exit_code == 2


def test_a_latin1_policy_names_the_first_byte_that_is_not_utf8(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("# caf\u00e9\nstorage: {}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 5\)"):
        load_policy(latin1, hook_sections=False)  # the daemons' --config reads it the same way


def test_a_binary_policy_file_gives_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    code, err = run_main(monkeypatch, capsys, "policy", "check", "--policy", str(binary))
    assert code == 2 and err == f"slurm-aigc: error: {binary}: not UTF-8 text (byte 0)\n"


def test_an_integer_too_long_for_python_is_a_yaml_error_with_its_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy_text("storage:\n  raw_retention_hours: " + "9" * 5000 + "\n", "pol.yaml")
    assert caught.value.key_path == "line 2" and "integer of 5000 characters" in caught.value.problem


# --------------------------------------------------------------------------- repeated keys


def shipped_text_with(old: str, new: str) -> str:
    text = shipped_policy().read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, line_text: str) -> int:
    return text.splitlines().index(line_text) + 1


def test_a_repeated_key_is_refused_naming_its_path_and_both_lines() -> None:
    text = shipped_text_with("    max_fraction: 0.5\n", "    max_fraction: 0.5\n    max_fraction: 0.9\n")
    with pytest.raises(ConfigError) as caught:
        parse_policy_text(text, "pol.yaml")
    first = line_of(text, "    max_fraction: 0.5")
    assert caught.value.key_path == "rewrites.shard.max_fraction"
    assert f"line {first}, again on line {first + 1}" in caught.value.problem


def test_a_repeated_section_is_refused() -> None:
    text = shipped_policy().read_text() + "\nreclaim:\n  dry_run: false\n"
    with pytest.raises(ConfigError) as caught:
        parse_policy_text(text, "pol.yaml")
    assert caught.value.key_path == "reclaim" and "keep only the last" in caught.value.problem


@pytest.mark.parametrize(("old", "new", "key_path"), [
    ("a100: {memory_gib: 80,", "a100: {memory_gib: 40, memory_gib: 80,", "inventory.gpu_types.a100.memory_gib"),
    ("- {class: finetune, name:", "- {class: train, class: finetune, name:", "detection.rules[1].class"),
    ("t4: {memory_gib: 16", "a100: {memory_gib: 16", "inventory.gpu_types.a100"),
])
def test_repeated_keys_in_flow_mappings_and_lists(old: str, new: str, key_path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy_text(shipped_text_with(old, new), "pol.yaml")
    assert caught.value.key_path == key_path


def test_a_key_overriding_a_merged_one_and_aliases_are_not_repeats() -> None:
    text = ("inventory:\n  gpu_types:\n    a100: &big {memory_gib: 80, shards_per_gpu: 80}\n"
            "    h100: {<<: *big, memory_gib: 94}\n    h200: *big\n"
            "classes: {interactive: {}, infer: {}}\n")
    types = {t.name: t for t in parse_policy_text(text, "pol.yaml").inventory.gpu_types}
    assert (types["h100"].memory_gib, types["h100"].shards_per_gpu, types["h200"].memory_gib) == (94, 80, 80)


def test_the_shipped_policy_has_no_repeated_key() -> None:
    assert load_policy(shipped_policy()).source == POLICY


# --------------------------------------------------------------------------- render -o


def test_render_into_a_missing_directory_is_an_error_naming_the_path(tmp_path: Path) -> None:
    target = tmp_path / "nodir" / "x.lua"
    result = CliRunner().invoke(policy, ["render", "--policy", POLICY, "-o", str(target)])
    assert type(result.exception) is AigcError, result.exception
    assert str(result.exception) == f"cannot write {target}: No such file or directory"
    assert not target.parent.exists()


def test_a_failed_render_leaves_the_target_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    live = tmp_path / "job_submit.lua"
    live.write_text("-- the hook slurmctld runs\n")

    def disk_full(*_args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsio.os, "replace", disk_full)  # the temp file is written, the rename fails
    result = CliRunner().invoke(policy, ["render", "--policy", POLICY, "-o", str(live)])
    assert str(result.exception) == f"cannot write {live}: No space left on device"
    assert live.read_text() == "-- the hook slurmctld runs\n"
    assert os.listdir(tmp_path) == ["job_submit.lua"]  # no temp file left behind


def test_render_writes_what_it_prints_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.lua"
    real.write_text("old\n")
    link = tmp_path / "job_submit.lua"
    link.symlink_to(real)
    runner = CliRunner()
    assert runner.invoke(policy, ["render", "--policy", POLICY, "-o", str(link)]).exit_code == 0
    assert link.is_symlink() and real.read_text() == runner.invoke(policy, ["render", "--policy", POLICY]).stdout


# --------------------------------------------------------------------------- classify's numbers


@pytest.mark.parametrize(("args", "words"), [
    (["--gpus", "-1"], "'--gpus': -1 is not in the range"),
    (["--nodes", "0"], "'--nodes': 0 is not in the range"),
    (["--time-minutes", "-5"], "'--time-minutes': -5 is not in the range"),
    (["--time-minutes", "4294967294"], "'--time-minutes': 4294967294 is not in the range"),  # NO_VAL
    (["--user-id", "-5"], "'--user-id': -5 is not in the range"),
    (["--gres", "gpu:-3"], "'gpu:-3': a GRES count cannot be negative"),
    (["--gres", "gpu:1,gpu:a100:-1"], "'gpu:a100:-1': a GRES count cannot be negative"),
])
def test_classify_refuses_what_sbatch_refuses(args: list[str], words: str) -> None:
    result = CliRunner().invoke(classify, ["--policy", POLICY, "--tres-style", "22.05", "--partitions-from", "none", *args])
    assert result.exit_code == 2 and words in result.output, result.output


def test_classify_accepts_the_smallest_valid_numbers() -> None:
    result = CliRunner().invoke(classify, ["--policy", POLICY, "--tres-style", "22.05", "--partitions-from", "none",
                                           "--gpus", "0", "--nodes", "1", "--time-minutes", "1", "--user-id", "0",
                                           "--gres", "gpu:a100:0"])
    assert result.exit_code == 0, result.output


def test_classify_without_policy_skips_an_installed_hook_that_is_not_utf8(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.policy import paths

    monkeypatch.delenv("SLURM_AIGC_CONFIG", raising=False)
    monkeypatch.setattr(paths, "SYSTEM_POLICY", tmp_path / "absent.yaml")
    (tmp_path / "job_submit.lua").write_bytes("-- the site's own hook, caf\u00e9\n".encode("latin-1"))
    text, source = hook_text(None, tmp_path)  # as for any hook that is not ours: the policy's
    assert source == POLICY and text.startswith("-- slurm-aigc job_submit.lua (rendered)")
