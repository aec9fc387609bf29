"""Policy validation: typed result for the shipped file, errors naming file + key path + problem."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_aigc.db import ActionRecord
from slurm_aigc.errors import ConfigError
from slurm_aigc.policy.loader import CLASS_NAME_MAX, load_policy, parse_policy_text
from slurm_aigc.policy.paths import shipped_policy


def shipped() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(shipped_policy().read_text())
    return document


def parse(document: dict[str, Any]) -> Any:
    return parse_policy_text(yaml.safe_dump(document), "pol.yaml")


def test_shipped_policy_loads_with_types_sorted_and_every_section() -> None:
    policy = load_policy(shipped_policy())
    assert [t.name for t in policy.inventory.gpu_types] == ["t4", "a100"]
    a100 = policy.inventory.gpu_types[1]
    assert a100.gib_per_shard == 1.0 and a100.nvlink and a100.feature == "a100"
    assert set(policy.classes) >= {"train", "finetune", "infer", "imagegen", "videogen", "audio", "batch", "interactive"}
    assert policy.detection[0].interactive is True
    assert policy.reclaim.dry_run and policy.reclaim.shards_per_gpu == {"t4": 16, "a100": 80}
    assert policy.scoring.weight_max == 100 and policy.agent.backend == "nvml"


@pytest.mark.parametrize(("edit", "key_path", "words"), [
    (lambda d: d.update(hooks={}), "", "unknown key(s) hooks"),
    (lambda d: d["inventory"]["gpu_types"]["a100"].update(mem=1), "inventory.gpu_types.a100", "unknown key(s) mem"),
    (lambda d: d["inventory"]["gpu_types"]["a100"].update(memory_gib=-1), "inventory.gpu_types.a100.memory_gib", "> 0"),
    (lambda d: d["inventory"]["gpu_types"]["t4"].update(memory_gib="lots"), "inventory.gpu_types.t4.memory_gib", "a number"),
    (lambda d: d["detection"]["rules"][1].update({"class": "nope"}), "detection.rules[1].class", "unknown class"),
    (lambda d: d["rewrites"]["shard"].update(max_fraction=1.5), "rewrites.shard.max_fraction", "(0, 1]"),
    (lambda d: d["rewrites"]["shard"].update(max_sm=0), "rewrites.shard.max_sm", "(0, 1]"),
    (lambda d: d["rewrites"]["shard"].update(nice=5), "rewrites.shard.nice", "..0, got 5"),
    (lambda d: d["rewrites"]["shard"].update(nice=-2147483646), "rewrites.shard.nice", "-2147483645..0"),
    (lambda d: d["rewrites"]["shard"].update(nice=-1.5), "rewrites.shard.nice", "integer"),
    (lambda d: d["rewrites"]["shard"]["expected_sm"].update(infer=float("nan")), "rewrites.shard.expected_sm.infer",
     "finite"),
    (lambda d: d["rewrites"]["shard"]["expected_sm"].update(infer=float("inf")), "rewrites.shard.expected_sm.infer",
     "finite"),
    (lambda d: d["rewrites"]["shard"]["expected_sm"].update(infer=1.2), "rewrites.shard.expected_sm.infer", "(0, 1]"),
    (lambda d: d["rewrites"]["shard"]["expected_sm"].update(infer="low"), "rewrites.shard.expected_sm.infer", "a number"),
    (lambda d: d["rewrites"]["shard"]["expected_sm"].update(nope=0.2), "rewrites.shard.expected_sm", "unknown key(s) nope"),
    (lambda d: d["rewrites"]["shard"]["expected_sm"].pop("imagegen"), "rewrites.shard.expected_sm", "imagegen"),
    (lambda d: d["rewrites"]["nvlink"].update(method="magic"), "rewrites.nvlink.method", "expected one of types, feature"),
    (lambda d: d["rewrites"]["model_prefer"].update(published_features_file="rel.txt"),
     "rewrites.model_prefer.published_features_file", "absolute path"),
    (lambda d: d["classes"].pop("interactive"), "classes", "interactive"),
    (lambda d: d["classes"].update(unknown={}), "classes.unknown", "reserved"),
    (lambda d: d["scoring"].update(weight_max=2**31), "scoring.weight_max", "at most 2147483647"),
    (lambda d: d["classes"].update({"c" * 33: {}}), "classes." + "c" * 33, f"class name {'c' * 33!r} has 33 characters; at most 32"),
    (lambda d: d["classes"]["infer"].update(partition="a b"), "classes.infer.partition", "partition name"),
    (lambda d: d["hook"].update(strict_tags="yes"), "hook.strict_tags", "true/false"),
    (lambda d: d["hook"].update(untouched_classes=["gone"]), "hook.untouched_classes[0]", "unknown class"),
    (lambda d: d["inventory"]["gpu_types"]["a100"].update(feature="a b"), "inventory.gpu_types.a100.feature", "feature"),
])
def test_errors_name_file_key_path_and_problem(edit: Any, key_path: str, words: str) -> None:
    document = shipped()
    edit(document)
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.source == "pol.yaml"
    assert caught.value.key_path == key_path
    assert words in caught.value.problem


def test_class_names_fit_the_audit_trails_job_class_column() -> None:
    # A longer name failed reclaim's audit insert (MariaDB, PostgreSQL) for every job of the class.
    assert CLASS_NAME_MAX == ActionRecord.__table__.c.job_class.type.length
    document = shipped()
    document["classes"]["c" * CLASS_NAME_MAX] = {}
    assert "c" * CLASS_NAME_MAX in parse(document).classes

def test_weight_max_may_be_the_largest_value_the_weight_columns_hold() -> None:
    document = shipped()
    document["scoring"]["weight_max"] = 2**31 - 1  # node_publications.weight_*: Integer, 32-bit signed
    assert parse(document).scoring.weight_max == 2**31 - 1

def test_daemon_sections_are_validated_by_the_same_loader() -> None:
    document = shipped()
    document["scoring"] = {"no_such_scoring_key": 1}
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path.startswith("scoring")


def test_invalid_yaml_and_missing_file() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_policy_text("inventory: [\n", "bad.yaml")
    with pytest.raises(ConfigError, match="/nonexistent/slurm-aigc.yaml: no such file"):
        load_policy("/nonexistent/slurm-aigc.yaml")


def test_optional_sections_default() -> None:
    document = {"inventory": {"gpu_types": {"l40s": {"memory_gib": 48}}}, "classes": {"interactive": {}, "infer": {}}}
    policy = parse(document)
    assert policy.detection == ()
    assert policy.rewrites.shard.classes == ("infer",)  # defaults filtered to the classes that exist
    assert policy.inventory.gpu_types[0].shards_per_gpu == 0 and not policy.inventory.gpu_types[0].nvlink


def test_storage_retention_defaults_and_is_validated() -> None:
    assert load_policy(shipped_policy()).storage.raw_retention_hours == 48.0
    document = shipped()
    del document["storage"]
    assert parse(document).storage.raw_retention_hours == 48.0
    for bad in (0, -1, float("nan"), float("inf"), "2d"):
        document["storage"] = {"raw_retention_hours": bad}
        with pytest.raises(ConfigError) as caught:
            parse(document)
        assert caught.value.key_path == "storage.raw_retention_hours"


# --------------------------------------------------------------------------- one default per setting

# Site content, not defaults: the cluster's GPU types and classes, the detection rules, and
# reclaim's per-class overrides. Every other value the shipped file states is the default.
SITE_CONTENT = ("inventory", "classes", "detection")


def test_shipped_file_states_exactly_the_model_defaults() -> None:
    full = shipped()
    bare = {key: full[key] for key in SITE_CONTENT}
    from_file, from_defaults = parse(full), parse(bare)
    assert from_file.rewrites == from_defaults.rewrites
    assert from_file.hook == from_defaults.hook
    assert from_file.storage == from_defaults.storage
    assert from_file.scoring == from_defaults.scoring
    assert from_file.agent == from_defaults.agent
    assert from_file.learned == from_defaults.learned
    assert replace(from_file.reclaim, classes={}) == from_defaults.reclaim
    # The three the issue found different (controller vs hook): one value each now.
    assert (from_defaults.reclaim.poll_interval_s, from_defaults.reclaim.defaults.min_samples,
            from_defaults.reclaim.defaults.busy_util_pct) == (10.0, 30, 95.0)


def test_daemons_without_a_policy_file_use_the_shipped_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.policy import paths
    from slurm_aigc.policy.site import load_site_policy
    from slurm_aigc.reclaim.config import load_reclaim_config
    from slurm_aigc.telemetry.config import load_scoring_config

    monkeypatch.delenv("SLURM_AIGC_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_AIGC_SIMGPU_DIR", raising=False)
    monkeypatch.setattr(paths, "SYSTEM_POLICY", tmp_path / "absent.yaml")
    policy = load_policy(shipped_policy())
    found = paths.find_policy(required=False)
    assert found == shipped_policy()
    site = load_site_policy(hook_sections=False)
    assert (site.reclaim, site.scoring, site.agent) == (policy.reclaim, policy.scoring, policy.agent)
    assert load_reclaim_config(found) == policy.reclaim  # not dataclass defaults of its own
    assert load_scoring_config(str(found)) == policy.scoring
    assert load_policy(found, hook_sections=False).agent == policy.agent


def test_the_site_policy_is_the_option_else_the_environment_else_etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.policy import paths
    from slurm_aigc.policy.site import load_site_policy

    system, from_env, given = (tmp_path / f"{name}.yaml" for name in ("system", "env", "given"))
    for path, hours in ((system, 1), (from_env, 2), (given, 3)):
        path.write_text(f"storage: {{raw_retention_hours: {hours}}}\n")
    monkeypatch.setattr(paths, "SYSTEM_POLICY", system)
    monkeypatch.delenv("SLURM_AIGC_CONFIG", raising=False)
    assert load_site_policy(hook_sections=False).storage.raw_retention_hours == 1.0
    monkeypatch.setenv("SLURM_AIGC_CONFIG", str(from_env))
    assert load_site_policy(hook_sections=False).storage.raw_retention_hours == 2.0
    assert load_site_policy(given, hook_sections=False).storage.raw_retention_hours == 3.0
    assert load_policy(given, hook_sections=False).source == str(given)  # the loader reads what it is handed


def test_a_daemon_file_may_leave_out_the_hook_sections(tmp_path: Path) -> None:
    path = tmp_path / "daemon.yaml"
    path.write_text("reclaim: {dry_run: false}\nstorage: {raw_retention_hours: 12}\n")
    policy = load_policy(path, hook_sections=False)
    assert not policy.reclaim.dry_run and policy.storage.raw_retention_hours == 12.0
    with pytest.raises(ConfigError, match="missing required key"):
        load_policy(path)  # `policy check`: the hook needs inventory and classes


# --------------------------------------------------------------------------- issue 12.8: NaN, inf, shard_gres


def numeric_leaves(value: Any, path: str = "") -> list[str]:
    """The key path of every number in a document (booleans are not numbers)."""
    if isinstance(value, dict):
        return [leaf for key, sub in value.items() for leaf in numeric_leaves(sub, f"{path}.{key}" if path else str(key))]
    if isinstance(value, list):
        return [leaf for index, sub in enumerate(value) for leaf in numeric_leaves(sub, f"{path}[{index}]")]
    return [path] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def set_path(document: Any, path: str, value: object) -> None:
    keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
    target = document
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value


def every_numeric_key() -> list[str]:
    return numeric_leaves(shipped())


def test_the_shipped_file_has_numbers_in_every_section_we_check() -> None:
    sections = {path.split(".")[0] for path in every_numeric_key()}
    assert sections == {"inventory", "detection", "rewrites", "storage", "reclaim", "scoring", "agent", "learned"}


@pytest.mark.parametrize("key_path", every_numeric_key())
@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf"])
def test_nan_and_infinity_are_refused_naming_the_key(key_path: str, bad: str) -> None:
    document = shipped()
    set_path(document, key_path, "__BAD__")
    text = yaml.safe_dump(document).replace("__BAD__", bad)
    with pytest.raises(ConfigError) as caught:
        parse_policy_text(text, "pol.yaml")
    assert caught.value.key_path == key_path
    assert "finite" in caught.value.problem or "integer" in caught.value.problem


# Numbers the shipped file leaves out, checked as well.
OPTIONAL_NUMERIC_KEYS = ["classes.infer.time_minutes", "detection.rules[2].max_gpus", "agent.metrics_port"]


@pytest.mark.parametrize("key_path", every_numeric_key() + OPTIONAL_NUMERIC_KEYS)
def test_every_number_has_an_upper_bound_named_in_the_error(key_path: str) -> None:
    # 20 digits: `shards_per_gpu: 99999999999999999999` rendered `gres/shard:5e+19` into the hook.
    document = shipped()
    set_path(document, key_path, 10**20)
    with pytest.raises(ConfigError) as caught:
        parse(document)
    if key_path == "scoring.weight_min":  # bounded through weight_max, which the error names
        assert caught.value.key_path == "scoring" and "weight_min < weight_max" in caught.value.problem
        return
    assert caught.value.key_path == key_path
    assert re.search(r"\.\.\d+,|, \d+\]|at most \d+|1-65535", caught.value.problem), caught.value.problem


@pytest.mark.parametrize(("key_path", "bad", "words"), [
    ("inventory.gpu_types.a100.shards_per_gpu", 10_001, "an integer in 0..10000, got 10001"),
    ("inventory.gpu_types.a100.memory_gib", 4097, "a number in (0, 4096], got 4097"),
    ("reclaim.defaults.grace_s", 10**23, "a number of seconds in [0, 2592000], got 1e+23"),
    ("reclaim.poll_interval_s", 2592001, "(0, 2592000]"),
    ("rewrites.model_prefer.refresh_seconds", 2592001, "an integer in 0..2592000"),
    ("classes.infer.time_minutes", 525601, "an integer in 1..525600"),
    ("detection.rules[2].min_gpus", -1, "a non-negative integer, got -1"),
    pytest.param("inventory.gpu_types.a100.memory_gib", 10**400, "a finite number, got an integer of 401 digits",
                 id="memory_gib-beyond-float"),
    ("storage.raw_retention_hours", 87601, "(0, 87600]"),
    ("learned.max_age_days", 366, "(0, 365]"),
    ("learned.max_entries", 1_000_001, "1..1000000"),  # learning off: only the bound every count has
])
def test_upper_bounds_name_the_key_and_the_range(key_path: str, bad: int, words: str) -> None:
    document = shipped()
    set_path(document, key_path, bad)
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == key_path and words in caught.value.problem


def test_the_upper_bounds_themselves_are_accepted_and_render_exact_integers() -> None:
    from slurm_aigc.policy.hookruntime import HookRuntime
    from slurm_aigc.policy.render import render_hook

    document = shipped()
    document["inventory"]["gpu_types"]["a100"].update(memory_gib=4096, shards_per_gpu=10_000)
    document["classes"]["infer"]["time_minutes"] = 525_600
    document["reclaim"]["defaults"]["grace_s"] = 2_592_000
    document["rewrites"]["model_prefer"]["refresh_seconds"] = 29
    policy = parse(document)
    result = HookRuntime(render_hook(policy)).submit(
        {"comment": "aigc:type=infer,vram=20G", "tres_per_node": "gres:gpu:1", "script": "#!/bin/sh\n"}, submit_uid=1000)
    # N = max(ceil(20 GiB / 0.4096 GiB a shard), ceil(SM 0.5 x 10,000 shards)), an exact integer
    assert result.changes["tres_per_node"] == ("gres:gpu:1", "gres:shard:5000")
    assert policy.classes["infer"].time_minutes == 525_600


@pytest.mark.parametrize("gres", ["gpu", "mps", "gpu:a100", "shard:1", ""])
def test_shard_gres_must_be_the_sharing_gres(gres: str) -> None:
    document = shipped()
    document["inventory"]["shard_gres"] = gres
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == "inventory.shard_gres" and "shard" in caught.value.problem


# --------------------------------------------------------------------------- issue 12.6: the signal rung


@pytest.mark.parametrize("signal", ["TERM", "SIGKILL", "int", "HUP", "QUIT", "ABRT", "ALRM", "STOP", "XCPU"])
def test_a_signal_that_ends_the_job_needs_cancel_enabled(signal: str) -> None:
    document = shipped()
    document["reclaim"]["signal"] = signal
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == "reclaim.signal"
    assert "reclaim.defaults.ladder.fake_busy" in caught.value.problem and "cancel_enabled" in caught.value.problem
    document["reclaim"]["cancel_enabled"] = True
    assert parse(document).reclaim.signal == signal.upper().removeprefix("SIG")


def test_a_terminating_signal_without_a_signal_rung_is_accepted() -> None:
    document = shipped()
    document["reclaim"]["signal"] = "TERM"
    document["reclaim"]["defaults"]["ladder"]["fake_busy"] = ["notify", "requeue"]
    assert parse(document).reclaim.signal == "TERM"
    document["reclaim"]["classes"]["infer"]["ladder"]["idle"] = ["signal"]
    with pytest.raises(ConfigError, match="reclaim.classes.infer.ladder.idle uses the signal rung"):
        parse(document)


@pytest.mark.parametrize(("signal", "normalised"), [("USR1", "USR1"), ("sigusr2", "USR2"), ("CONT", "CONT")])
def test_handled_signals_are_accepted(signal: str, normalised: str) -> None:
    document = shipped()
    document["reclaim"]["signal"] = signal
    assert parse(document).reclaim.signal == normalised


@pytest.mark.parametrize("signal", ["BOGUS", "USR1; rm -rf /", "10", ""])
def test_unknown_signal_names_are_refused(signal: str) -> None:
    document = shipped()
    document["reclaim"]["signal"] = signal
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == "reclaim.signal" and "not a signal name" in caught.value.problem


# --------------------------------------------------------------------------- unknown keys everywhere


@pytest.mark.parametrize("section_path", [
    "storage", "reclaim", "reclaim.notify", "reclaim.exempt", "reclaim.defaults", "reclaim.defaults.ladder",
    "reclaim.classes.train", "scoring", "agent", "hook", "rewrites", "rewrites.shard", "rewrites.model_prefer",
    "inventory", "inventory.gpu_types.t4",
])
def test_unknown_keys_are_errors_naming_the_key_path(section_path: str) -> None:
    document = shipped()
    target = document
    for key in section_path.split("."):
        target = target[key]
    target["colour"] = "red"
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == section_path and "unknown key(s) colour" in caught.value.problem


def test_the_publisher_writes_the_file_the_hook_reads() -> None:
    document = shipped()
    document["rewrites"]["model_prefer"]["published_features_file"] = "/srv/aigc/listing.txt"
    del document["scoring"]["published_features_file"]
    assert parse(document).scoring.published_features_file == "/srv/aigc/listing.txt"  # one setting, one default
    document["scoring"]["published_features_file"] = None
    assert parse(document).scoring.published_features_file is None  # explicitly: write no listing


def test_without_any_policy_file_daemons_get_the_model_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.errors import ShippedFileError
    from slurm_aigc.policy import paths
    from slurm_aigc.policy.model import AgentConfig, ReclaimConfig
    from slurm_aigc.policy.site import load_site_policy

    def nowhere() -> Path:
        raise ShippedFileError("etc/slurm-aigc.yaml is not part of this install")

    monkeypatch.setattr(paths, "default_policy", nowhere)
    monkeypatch.delenv("SLURM_AIGC_SIMGPU_DIR", raising=False)
    assert paths.find_policy(required=False) is None
    policy = load_site_policy(hook_sections=False)
    assert policy.reclaim == ReclaimConfig() and policy.agent == AgentConfig()
    assert load_policy(None, hook_sections=False) == policy  # the pure loader, handed no file
    monkeypatch.setenv("SLURM_AIGC_SIMGPU_DIR", "/srv/simgpu")
    assert load_site_policy(hook_sections=False).agent.simgpu_dir == "/srv/simgpu"
    assert load_policy(None, hook_sections=False).agent == AgentConfig()  # it reads no environment
    assert load_policy(None, hook_sections=False, simgpu_dir="/srv/simgpu").agent.simgpu_dir == "/srv/simgpu"
    with pytest.raises(ShippedFileError):
        load_site_policy()  # the hook has nothing to render
    with pytest.raises(ConfigError, match="needs a policy file"):
        load_policy(None)


@pytest.mark.parametrize(("edit", "key_path"), [
    (lambda d: d["reclaim"]["classes"].update(trian={"grace_s": 5}), "reclaim.classes.trian"),
    (lambda d: d["reclaim"]["exempt"].update(classes=["interactive", "interactve"]), "reclaim.exempt.classes[1]"),
    (lambda d: d["scoring"].update(serving_classes=["infer", "serve"]), "scoring.serving_classes[1]"),
])
def test_class_names_the_daemons_use_must_be_classes(edit: Any, key_path: str) -> None:
    document = shipped()
    edit(document)
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == key_path and "unknown class" in caught.value.problem


def test_reclaim_may_name_the_unclassified_jobs() -> None:
    document = shipped()
    document["reclaim"]["classes"]["unclassified"] = {"window_s": 600}
    assert parse(document).reclaim.policy_for("unclassified").window_s == 600.0


def test_the_shipped_file_states_every_key_of_the_daemon_sections() -> None:
    from dataclasses import fields

    from slurm_aigc.policy.model import AgentConfig, ClassPolicy, ReclaimConfig, ScoringConfig, StorageConfig

    document = shipped()
    from slurm_aigc.policy.model import LearnedConfig

    for name, kind in (("agent", AgentConfig), ("scoring", ScoringConfig), ("storage", StorageConfig),
                       ("learned", LearnedConfig)):
        assert set(document[name]) == {f.name for f in fields(kind)}, name
    assert set(document["reclaim"]) == {f.name for f in fields(ReclaimConfig)} - {"shards_per_gpu", "gib_per_shard"}
    assert set(document["reclaim"]["defaults"]) == {f.name for f in fields(ClassPolicy)}


@pytest.mark.parametrize("address", ["localhost", "10.0.0.300", "", "0.0.0.0; rm"])
def test_metrics_address_must_be_an_ip_address(address: str) -> None:
    document = shipped()
    assert parse(document).agent.metrics_address == "127.0.0.1"
    document["agent"]["metrics_address"] = address
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == "agent.metrics_address" and "IP address" in caught.value.problem


def test_the_agent_binds_metrics_where_the_policy_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_aigc.telemetry import agent

    class Bound(Exception):
        pass

    def fake_open_metrics(daemon: str, port: int | None, address: str | None = None) -> Any:
        raise Bound(daemon, port, address)

    path = tmp_path / "agent.yaml"
    path.write_text("agent: {metrics_port: 9400, metrics_address: '::1'}\n")
    monkeypatch.setattr(agent, "open_metrics", fake_open_metrics)
    with pytest.raises(Bound) as bound:
        agent.run_agent(agent.AgentOptions(config_path=str(path)), True, lambda result: None)
    assert bound.value.args == ("agent", 9400, "::1")


@pytest.mark.parametrize(("section_name", "key", "value"), [
    ("rewrites", "comment_class", {"enabled": True}),
    ("hook", "comment_class_key", "aigc_class"),
])
def test_a_removed_key_is_refused_naming_it_and_saying_it_was_removed(section_name: str, key: str, value: Any) -> None:
    document = shipped()
    document[section_name][key] = value  # as an old policy file still has it
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == f"{section_name}.{key}"
    assert "was removed" in str(caught.value) and "AdminComment" in str(caught.value)


# --------------------------------------------------------------------------- settings that must agree


def test_the_unlist_grace_must_outlast_the_hooks_cache_of_the_listing() -> None:
    document = shipped()
    document["rewrites"]["model_prefer"]["refresh_seconds"] = 30
    with pytest.raises(ConfigError) as caught:
        parse(document)  # scoring.model_unlist_grace_s stays 30
    assert caught.value.key_path == "scoring.model_unlist_grace_s"
    assert "rewrites.model_prefer.refresh_seconds (30 s)" in caught.value.problem and "rejects" in caught.value.problem
    document["scoring"]["model_unlist_grace_s"] = 31
    assert parse(document).scoring.model_unlist_grace_s == 31.0
    document["rewrites"]["model_prefer"].update(refresh_seconds=60, enabled=False)  # no hook preference, no window
    assert parse(document).rewrites.model_prefer.refresh_seconds == 60


@pytest.mark.parametrize("prefix", ["served_", "", "model-"])
def test_only_the_prefix_the_publisher_writes_is_accepted(prefix: str) -> None:
    document = shipped()
    assert parse(document).rewrites.model_prefer.feature_prefix == "model_"
    document["rewrites"]["model_prefer"]["feature_prefix"] = prefix
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == "rewrites.model_prefer.feature_prefix"
    assert "publisher" in caught.value.problem and "model_<id>" in caught.value.problem


@pytest.mark.parametrize(("learned", "key", "words"), [
    ({"max_entries": 100_001}, "learned.max_entries", "1..100000"),
    ({"refresh_seconds": 4}, "learned.refresh_seconds", "at least 5 s with max_entries 10000"),
    ({"max_entries": 100_000, "refresh_seconds": 41}, "learned.refresh_seconds", "at least 42 s"),
    # Re-read at every submit: a 10,000-line table would be read inside slurmctld per submit.
    ({"refresh_seconds": 0}, "learned.refresh_seconds", "needs max_entries <= 100, got max_entries 10000"),
    ({"max_entries": 101, "refresh_seconds": 0}, "learned.refresh_seconds", "at least 1 or lower max_entries"),
])
def test_the_learned_table_is_bounded_by_what_the_hook_can_reread(learned: dict[str, Any], key: str, words: str) -> None:
    document = shipped()
    document["learned"].update(learned, enabled=True)
    with pytest.raises(ConfigError) as caught:
        parse(document)
    assert caught.value.key_path == key and words in caught.value.problem
    # With learning off the hook reads no table: a file valid before these bounds still loads,
    # or an upgrade would keep every agent and the controller from starting.
    document["learned"]["enabled"] = False
    assert parse(document).learned.enabled is False


def test_learned_refresh_limits_that_are_accepted() -> None:
    document = shipped()
    for entries, seconds in ((10_000, 5), (100_000, 42), (1_000, 1), (100, 0)):
        document["learned"].update(max_entries=entries, refresh_seconds=seconds, enabled=True)
        assert parse(document).learned.refresh_seconds == seconds


def test_models_per_node_are_capped_by_a_positive_integer() -> None:
    document = shipped()
    assert parse(document).scoring.max_models_per_node == 8
    for bad in (0, -1, 2.5):
        document["scoring"]["max_models_per_node"] = bad
        with pytest.raises(ConfigError) as caught:
            parse(document)
        assert caught.value.key_path == "scoring.max_models_per_node"


@pytest.mark.parametrize("value", ["maybe", 1, "on", None])
def test_whole_as_shards_is_auto_true_or_false(value: object) -> None:
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["whole_as_shards"] = {"enabled": value}
    with pytest.raises(ConfigError, match=r"rewrites\.whole_as_shards\.enabled: expected auto, true or false"):
        parse_policy_text(yaml.safe_dump(document), "p.yaml")
