"""`slurm-aigc policy ...` and `slurm-aigc classify` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_aigc.cli.policy import classify, partitions_of, policy
from slurm_aigc.errors import ConfigError
from slurm_aigc.policy.hookruntime import INFINITE, NO_VAL
from slurm_aigc.policy.paths import shipped_policy

POLICY = str(shipped_policy())


def run_classify(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(classify, ["--policy", POLICY, "--tres-style", "22.05", "--partitions-from", "none", "--json", *args])
    assert result.exit_code == 0, result.output
    document: dict[str, object] = json.loads(result.stdout)
    return document


def test_classify_json_has_exactly_the_contract_keys() -> None:
    out = run_classify("--comment", "exp42 aigc:type=infer,vram=20G", "--gres", "gpu:1")
    assert set(out) == {"class", "result", "changes", "messages"}
    assert out["class"] == "infer" and out["result"] == "accept"
    assert out["changes"]["tres_per_node"] == ["gres:gpu:1", "gres:shard:40"]  # type: ignore[index]
    assert out["changes"]["features"] == [None, "a100"]  # type: ignore[index]
    assert isinstance(out["messages"], list) and out["messages"]


def test_classify_reject_exits_zero(tmp_path: Path) -> None:
    document = yaml.safe_load(shipped_policy().read_text())
    document["hook"]["strict_tags"] = True
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(classify, ["--policy", str(strict), "--tres-style", "22.05", "--partitions-from", "none", "--json",
                                           "--comment", "aigc:vram=huge", "--gres", "gpu:1"])
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["result"] == "reject" and out["changes"] == {} and "vram=huge" in out["messages"][0]


def test_classify_root_interactive_and_untagged_change_nothing() -> None:
    root = run_classify("--comment", "aigc:type=infer,vram=20G", "--gres", "gpu:1", "--user-id", "0")
    assert root["changes"] == {"admin_comment": [None, "aigc_class=infer"]}
    interactive = run_classify("--gres", "gpu:1", "--interactive")
    # Only the trusted stamp is written: the daemons must know it is interactive.
    assert interactive["class"] == "interactive"
    assert interactive["changes"] == {"admin_comment": [None, "aigc_class=interactive"]}
    assert run_classify("--comment", "hello", "--gres", "gpu:1")["class"] == "unknown"


def test_classify_24_style_and_gpus_per_job() -> None:
    result = CliRunner().invoke(classify, ["--policy", POLICY, "--tres-style", "23.02", "--partitions-from", "none", "--json",
                                           "--comment", "aigc:type=train", "--gpus", "8", "--nodes", "1"])
    out = json.loads(result.stdout)
    assert out["changes"]["features"] == [None, "a100"]
    text = CliRunner().invoke(classify, ["--policy", POLICY, "--tres-style", "23.02", "--partitions-from", "none", "--comment", "aigc:type=infer,vram=8G",
                                         "--gres", "gpu:1"])
    assert "change:  tres_per_node: gres/gpu:1 -> gres/shard:8" in text.stdout


def test_check_render_install(tmp_path: Path) -> None:
    runner = CliRunner()
    checked = runner.invoke(policy, ["check", "--policy", POLICY])
    assert checked.exit_code == 0 and checked.stdout.startswith("ok: ")
    table = runner.invoke(policy, ["render", "--policy", POLICY, "--table-only"])
    assert table.stdout.startswith("local AIGC_POLICY = {")
    installed = runner.invoke(policy, ["install", "--policy", POLICY, "--slurm-conf-dir", str(tmp_path)])
    assert installed.exit_code == 0, installed.output
    assert (tmp_path / "job_submit.lua").read_text() == runner.invoke(policy, ["render", "--policy", POLICY]).stdout


def test_check_reports_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("inventory: {gpu_types: {a100: {memory_gib: 80, colour: red}}}\nclasses: {interactive: {}}\n")
    result = CliRunner().invoke(policy, ["check", "--policy", str(bad)])
    assert isinstance(result.exception, ConfigError)
    assert "inventory.gpu_types.a100" in str(result.exception) and "colour" in str(result.exception)
    assert result.exception.exit_code == 2


def edited_policy(tmp_path: Path, text_edits: dict[str, str]) -> str:
    """The shipped policy with `key: value` lines replaced (first match), as a file."""
    text = shipped_policy().read_text()
    for old, new in text_edits.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "edited.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("old", "new", "key_path"), [
    ("cooldown_s: 900", "cooldown_s: .nan", "reclaim.cooldown_s"),
    ("poll_interval_s: 10", "poll_interval_s: .nan", "reclaim.poll_interval_s"),
    ("a100: {memory_gib: 80", "a100: {memory_gib: .nan", "inventory.gpu_types.a100.memory_gib"),
    ("window_s: 3600", "window_s: .inf", "reclaim.classes.infer.window_s"),
    ("shard_gres: shard", "shard_gres: gpu", "inventory.shard_gres"),
    ("signal: USR1", "signal: TERM", "reclaim.signal"),
    # Past their upper bounds: rendered, the first made the hook ask for `gres/shard:5e+19`.
    ("shards_per_gpu: 80", "shards_per_gpu: 99999999999999999999", "inventory.gpu_types.a100.shards_per_gpu"),
    ("grace_s: 600", "grace_s: 100000000000000000000000", "reclaim.defaults.grace_s"),
])
@pytest.mark.parametrize("command", ["check", "render", "install"])
def test_check_render_and_install_refuse_naming_the_key(tmp_path: Path, old: str, new: str, key_path: str,
                                                         command: str) -> None:
    path = edited_policy(tmp_path, {old: new})
    extra = ["--slurm-conf-dir", str(tmp_path)] if command == "install" else []
    result = CliRunner().invoke(policy, [command, "--policy", path, *extra])
    assert isinstance(result.exception, ConfigError), result.output  # not a traceback from render
    assert result.exception.key_path == key_path and result.exception.exit_code == 2
    assert not (tmp_path / "job_submit.lua").exists()


def test_check_accepts_a_terminating_signal_when_cancelling_is_enabled(tmp_path: Path) -> None:
    path = edited_policy(tmp_path, {"signal: USR1": "signal: TERM", "cancel_enabled: false": "cancel_enabled: true"})
    result = CliRunner().invoke(policy, ["check", "--policy", path])
    assert result.exit_code == 0 and result.stdout.startswith("ok: ")


def test_classify_reads_the_partitions_from_scontrol() -> None:
    text = ("PartitionName=gpu AllowGroups=ALL Default=YES DefaultTime=NONE MaxTime=UNLIMITED State=UP\n"
            "PartitionName=short Default=NO DefaultTime=00:10:00 MaxTime=1-00:00:00 State=UP\n")
    assert partitions_of(text) == {
        "gpu": {"name": "gpu", "max_time": INFINITE, "default_time": NO_VAL, "flag_default": 1},
        "short": {"name": "short", "max_time": 1440, "default_time": 10, "flag_default": 0},
    }


def test_render_and_classify_follow_the_slurm_release_asked_for() -> None:
    # rewrites.whole_as_shards: auto is on for Slurm older than 24.11 (the 22.05 shard defect).
    old = CliRunner().invoke(policy, ["render", "--policy", POLICY, "--slurm-version", "22.05.8"])
    new = CliRunner().invoke(policy, ["render", "--policy", POLICY, "--slurm-version", "24.11"])
    assert old.exit_code == 0 and new.exit_code == 0, old.output + new.output
    assert "-- for Slurm: 22.05.8\n" in old.stdout and "-- for Slurm: 24.11\n" in new.stdout
    flag = '["whole_as_shards"] = {\n      ["enabled"] = '
    assert flag + "true" in old.stdout and flag + "false" in new.stdout
    finetune = ("--comment", "aigc:type=finetune,vram=13G", "--gres", "gpu:1")
    changes = run_classify("--slurm-version", "22.05", *finetune)["changes"]
    assert changes["tres_per_node"] == ["gres:gpu:1", "gres:shard:16"] and changes["features"] == [None, "t4"]  # type: ignore[index]
    assert "tres_per_node" not in run_classify("--slurm-version", "24.11.5", *finetune)["changes"]  # type: ignore[operator]


@pytest.mark.parametrize("given", ["22", "banana", "22.05.8.1", "-1.0"])
def test_a_slurm_version_that_is_not_a_release_is_refused(given: str) -> None:
    result = CliRunner().invoke(policy, ["render", "--policy", POLICY, "--slurm-version", given])
    assert result.exit_code == 2 and "expected a Slurm release such as 22.05" in result.output


def test_render_where_no_slurm_can_be_asked_says_so_and_leaves_auto_off(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol here
    result = CliRunner().invoke(policy, ["render", "--policy", POLICY])
    assert result.exit_code == 0, result.output
    assert "cannot read the Slurm version here" in result.stderr and "pass --slurm-version" in result.stderr
    assert "-- for Slurm: unknown\n" in result.stdout
    assert '["whole_as_shards"] = {\n      ["enabled"] = false' in result.stdout
