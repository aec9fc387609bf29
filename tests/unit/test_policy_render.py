"""Rendering: Lua literals survive any text, globs become anchored Lua patterns, the file parses."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from lupa import lua51

from slurm_aigc.policy.hookruntime import HookRuntime
from slurm_aigc.policy.loader import load_policy, parse_policy_text
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import (
    MARKER,
    listing_interval_warning,
    listing_max_age_s,
    lua_string,
    lua_value,
    policy_table,
    render_hook,
)

LUA = lua51.LuaRuntime(encoding=None)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_lua_string_round_trips_any_text(text: str) -> None:
    assert LUA.eval(lua_string(text).encode()) == text.encode("utf-8")


@pytest.fixture(scope="module")
def hook_runtime() -> HookRuntime:
    return HookRuntime(render_hook(load_policy(shipped_policy())))


@settings(max_examples=400, deadline=None)
@given(glob=st.text(alphabet="ab*?.%[]()-+^$", max_size=7), name=st.text(alphabet="ab.%[]()-+^$", max_size=9))
def test_glob_matcher_agrees_with_fnmatch(hook_runtime: HookRuntime, glob: str, name: str) -> None:
    if "[" in glob:  # fnmatch gives [] a meaning our globs do not have
        return
    assert hook_runtime.glob_matches(glob, name) == fnmatch.fnmatchcase(name.lower(), glob.lower())


def test_policy_table_evaluates_to_the_same_data() -> None:
    policy = load_policy(shipped_policy())
    table = policy_table(policy)
    lua_table = LUA.eval(lua_value(table).encode())
    types = lua_table[b"inventory"][b"gpu_types"]
    assert [types[i][b"name"] for i in (1, 2)] == [b"t4", b"a100"]
    assert lua_table[b"rewrites"][b"shard"][b"max_fraction"] == policy.rewrites.shard.max_fraction
    shard = lua_table[b"rewrites"][b"shard"]
    assert (shard[b"expected_sm"][b"infer"], shard[b"max_sm"]) == (policy.rewrites.shard.expected_sm["infer"], 0.5)
    assert lua_table[b"classes"][b"infer"] is not None


def test_rendered_hook_is_deterministic_self_contained_and_marked() -> None:
    policy = load_policy(shipped_policy())
    first, second = render_hook(policy), render_hook(policy)
    assert first == second and first.startswith(MARKER)
    assert not re.search(r"\brequire\s*[(\"']", first) and not re.search(r"package\.path\s*=", first)
    assert first.rstrip().endswith("return slurm.SUCCESS")


@pytest.mark.skipif(shutil.which("luac5.1") is None, reason="luac5.1 (Debian lua5.1) not installed")
def test_rendered_hook_passes_luac(tmp_path: Path) -> None:
    path = tmp_path / "job_submit.lua"
    path.write_text(render_hook(load_policy(shipped_policy())))
    result = subprocess.run(["luac5.1", "-p", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("luac5.1") is None, reason="luac5.1 (Debian lua5.1) not installed")
def test_hook_touches_only_known_globals(tmp_path: Path) -> None:
    """A typo'd local becomes a global read at run time; only Lua's libraries and Slurm's names may appear."""
    path = tmp_path / "job_submit.lua"
    path.write_text(render_hook(load_policy(shipped_policy())))
    listing = subprocess.run(["luac5.1", "-l", "-p", str(path)], capture_output=True, text=True, check=True).stdout
    names = set(re.findall(r"[GS]ETGLOBAL.*;\s*(\w+)", listing))
    allowed = {"assert", "error", "io", "ipairs", "math", "os", "pairs", "pcall", "slurm", "string", "table",
               "tonumber", "tostring", "type", "next", "AIGC_LAST_CLASS", "AIGC_PURE", "slurm_job_submit", "slurm_job_modify"}
    assert names <= allowed, names - allowed
    assert {"slurm_job_submit", "slurm_job_modify"} <= names


def test_the_hook_trusts_the_listing_three_publisher_cycles_plus_its_refresh() -> None:
    document = yaml.safe_load(shipped_policy().read_text())
    table: Any = policy_table(parse_policy_text(yaml.safe_dump(document), "p.yaml"))
    assert table["rewrites"]["model_prefer"]["max_age_seconds"] == 3 * 30 + 10  # rendered for the hook
    document["scoring"]["interval_s"] = 25  # the controller ticks every 10 s: a cycle every 30 s
    document["rewrites"]["model_prefer"]["refresh_seconds"] = 20
    document["scoring"]["model_unlist_grace_s"] = 45
    assert listing_max_age_s(parse_policy_text(yaml.safe_dump(document), "p.yaml")) == 3 * 30 + 20


def test_a_controller_interval_the_hook_was_not_rendered_for_is_warned_about() -> None:
    # The hook's limit comes from reclaim.poll_interval_s; `controller --interval` does not reach it.
    policy = load_policy(shipped_policy())
    assert listing_interval_warning(policy, 10) is None  # the rendered case: cycles every 30 s
    assert listing_interval_warning(policy, 15) is None  # every 30 s still
    assert listing_interval_warning(policy, 45) is None  # every 45 s: two cycles + refresh = 100 s
    warning = listing_interval_warning(policy, 25)  # a cycle every 50 s: one late cycle, 2 x 50 + 10 > 100
    assert warning is not None and "every 50 s" in warning and "trusts it for 100 s" in warning


def test_the_controller_starts_with_interval_on_a_policy_written_for_daemons_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The warning loaded the policy as the hook does: a file without classes and inventory
    # (valid for the daemons) made `controller --interval` exit 1 before its first tick.
    from click.testing import CliRunner

    from slurm_aigc import daemonloop
    from slurm_aigc.cli import reclaim

    path = tmp_path / "daemon.yaml"
    path.write_text("reclaim:\n  dry_run: true\n")

    class Loop:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        stop_requested = False

        def run(self, once: bool = False) -> int:
            return 0
    monkeypatch.setattr(reclaim, "_controller", lambda *args, **kwargs: (
        SimpleNamespace(dry_run=True, stop_when=lambda stopping: None), None, None))
    monkeypatch.setattr(reclaim, "_retention", lambda *args, **kwargs: None)
    monkeypatch.setattr(daemonloop, "DaemonLoop", Loop)
    result = CliRunner().invoke(reclaim.controller, ["--config", str(path), "--interval", "60"])
    assert result.exit_code == 0, repr(result.exception)
