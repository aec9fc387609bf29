"""The hook under hostile input: bounded work, trusted stamp, modify, shards, GRES (issues 12 and 13)."""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_aigc.policy.hookruntime import SUCCESS, HookRuntime
from slurm_aigc.policy.loader import load_policy, parse_policy_text
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import render_hook
from tests.unit.test_hook_rules import ALICE, SCRIPT, runtime_for, submit

# A cost model of Lua's string.find/match over a subject of n bytes and a pattern of m: a plain
# or quantifier-free search costs n*m byte comparisons; a pattern with a quantifier can
# backtrack, n*n*m in the worst case (`.*a.*b` over 16,000 bytes took 114 s in slurmctld).
COUNTING_PRELUDE = r"""
AIGC_WORK, AIGC_LONGEST = 0, 0
local real_find, real_match = string.find, string.match
local function cost(s, p, init, plain)
  if type(s) ~= "string" or type(p) ~= "string" then return end
  local n = #s - (init or 1) + 1
  if n > AIGC_LONGEST then AIGC_LONGEST = n end
  local quantified = not plain and real_find(p:gsub("%%.", ""), "[%*%+%-%?]") ~= nil
  AIGC_WORK = AIGC_WORK + (quantified and n * n * #p or n * #p)
end
string.find = function(s, p, init, plain) cost(s, p, init, plain) return real_find(s, p, init, plain) end
string.match = function(s, p, init) cost(s, p, init, false) return real_match(s, p, init) end
"""
GLOB_RULES = [{"class": "finetune", "name": ["*llama*70b*sft*"]}]


def counting_runtime() -> HookRuntime:
    document = yaml.safe_load(shipped_policy().read_text())
    document["detection"]["rules"] = GLOB_RULES
    text = render_hook(parse_policy_text(yaml.safe_dump(document), "glob-policy.yaml"))
    return HookRuntime(COUNTING_PRELUDE + text)


def work_for(runtime: HookRuntime, name: str) -> tuple[int, int, Any]:
    lua_globals = runtime._lua.globals()  # the counters the prelude keeps
    lua_globals.AIGC_WORK = 0
    result = runtime.submit({"name": name, "script": SCRIPT, "tres_per_node": "gres:gpu:1"}, submit_uid=ALICE)
    return int(lua_globals.AIGC_WORK), int(lua_globals.AIGC_LONGEST), result


def test_a_16000_character_name_costs_bounded_work() -> None:
    runtime = counting_runtime()
    hostile = "llama" + "70b" * 5_000 + "x" * 985  # 16,000 bytes, no `sft`: the worst case for `.*`
    work, longest, result = work_for(runtime, hostile)
    assert result.rc == SUCCESS and result.job_class == "unknown"
    assert longest <= 1024  # no user string is searched past the hook's read caps (Slurm's limits)
    assert work <= 3 * 1024 * 20  # each glob piece is one linear scan of the 1,024 bytes read
    # And the matcher still finds the glob in a name that has it.
    assert work_for(runtime, "my-LLAMA-3-70b-sft-run")[2].job_class == "finetune"


@settings(max_examples=300, deadline=None)
@given(name=st.text(alphabet="l a m 7 0 b s f t x".split(" ") + ["-"], max_size=60))
def test_the_linear_matcher_agrees_with_fnmatch_on_the_policy_glob(name: str) -> None:
    runtime = _plain_runtime()
    assert runtime.glob_matches("*llama*70b*sft*", name) == fnmatch.fnmatchcase(name.lower(), "*llama*70b*sft*")


_PLAIN: list[HookRuntime] = []


def _plain_runtime() -> HookRuntime:
    if not _PLAIN:
        _PLAIN.append(HookRuntime(render_hook(load_policy(shipped_policy()))))
    return _PLAIN[0]


def test_a_control_character_in_the_policy_path_cannot_end_the_header_comment() -> None:
    policy = dataclasses.replace(load_policy(shipped_policy()), source="/etc/x\rAIGC_PWNED = true\n-- \x00\x1b")
    text = render_hook(policy)
    header = text.split("local AIGC_POLICY", 1)[0]
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", header)  # only the header's own newlines
    runtime = HookRuntime(text)
    assert runtime._lua.globals().AIGC_PWNED is None


def test_a_comment_only_update_keeps_the_jobs_time_limit(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path, **{"classes.imagegen": {"time_minutes": 90}})
    record = {"job_state": 0, "comment": "aigc:type=imagegen,share=no", "time_limit": 30, "partition": "gpu",
              "admin_comment": "aigc_class=imagegen"}
    # slurmctld 22.05 hands job_modify time_limit = NO_VAL (4294967294), not nil, when the update leaves it.
    result = hook.modify({"comment": "aigc:type=imagegen,share=no,model=x"}, record, modify_uid=ALICE)
    assert result.rc == SUCCESS and "time_limit" not in result.changes
    unlimited = hook.modify({"comment": "aigc:type=imagegen"}, {**record, "time_limit": None}, modify_uid=ALICE)
    assert unlimited.changes["time_limit"][1] == 90  # a job without a limit still gets the class default


@pytest.mark.parametrize("vram", ["0.0000000001K", "1K", "0.001G", "1M"])
def test_a_tiny_vram_takes_one_shard_never_zero(vram: str) -> None:
    document = yaml.safe_load(shipped_policy().read_text())
    document["rewrites"]["shard"]["expected_sm"]["infer"] = 0.001  # the SM share rounds up to 1 shard too
    runtime = HookRuntime(render_hook(parse_policy_text(yaml.safe_dump(document), "tiny-sm.yaml")))
    result = submit(runtime, comment=f"aigc:type=infer,vram={vram}", tres_per_node="gres:gpu:1")
    assert result.after["tres_per_node"] == "gres:shard:1"


def test_a_comment_at_slurms_limit_does_not_grow() -> None:
    # slurmctld refuses a comment over 1,024 bytes, checked after the plugin ran (22.05 to 26.05).
    comment = "x" * 976 + " aigc:type=infer,vram=20G aigc_class=interactive"
    assert len(comment) == 1024
    result = submit(_plain_runtime(), comment=comment, tres_per_node="gres:gpu:1")
    assert len(result.after["comment"]) < len(comment) and "admin_comment" in result.changes


GPU_ENTRY = re.compile(r"^(?:gres[:/])?(gpu|shard)\b")


def gpu_like(fields: Mapping[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for field in ("tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task"):
        for entry in str(fields.get(field) or "").split(","):
            if GPU_ENTRY.match(entry):
                counts[field] = counts.get(field, 0) + 1
    return counts


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tag=st.sampled_from(["", "aigc:type=infer,vram=20G", "aigc:type=imagegen,vram=6G", "aigc:type=train",
                            "aigc:type=finetune,nvlink=yes", "aigc:type=infer,vram=8G,share=no", "aigc:type=batch,vram=90G"]),
       per_node=st.sampled_from([None, "gres:gpu:1", "gres:gpu:4", "gres/gpu:a100:2", "gres:gpu:1,gres:gpu:1"]),
       per_job=st.sampled_from([None, "gres:gpu:1", "gres/gpu:8"]), nodes=st.sampled_from([None, 1, 2]))
def test_the_hook_never_adds_a_second_gpu_request(tag: str, per_node: str | None, per_job: str | None, nodes: int | None) -> None:
    """Slurm 26.05 refuses --gres=gpu:N together with --gpus-per-node: the hook must never make one."""
    fields = {"comment": tag, "tres_per_node": per_node, "tres_per_job": per_job, "min_nodes": nodes, "script": SCRIPT}
    result = _plain_runtime().submit(fields, submit_uid=ALICE)
    before, after = gpu_like(fields), gpu_like(result.after)
    assert sum(after.values()) <= max(1, sum(before.values()))
    assert all(after.get(field, 0) <= max(1, count) for field, count in before.items())
    assert all(count <= 1 for field, count in after.items() if before.get(field, 0) <= 1)


CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def test_user_strings_cannot_forge_slurmctld_log_lines(tmp_path: Path) -> None:
    hook = runtime_for(tmp_path)
    name = "x\nslurmctld: error: forged\r\x1b[2J\t\\n"
    submitted = submit(hook, name=name, comment="aigc:type=infer,vram=20G note\x07\naigc_class=interactive",
                       tres_per_node="gres:gpu:1")
    record = {"job_state": 0, "name": name, "gres": "gres:gpu:1", "admin_comment": "aigc_class=unknown"}
    modified = hook.modify({"comment": "aigc:vram=lots\x7f\nforged"}, record, modify_uid=ALICE)
    logged = submitted.logged("log") + modified.logged("log")
    assert len(submitted.logged("log")) >= 2 and modified.logged("log")
    assert not [line for line in logged if CONTROL.search(line)]
    # One line per event, the name readable and unambiguous: `\` itself is escaped too.
    assert all("name=x\\nslurmctld: error: forged\\r\\x1b[2J\\t\\\\n class=infer" in line
               for line in submitted.logged("log"))
    assert any("\\x07\\naigc_class=interactive" in line for line in submitted.logged("log"))
    assert any("vram=lots\\x7f" in line for line in modified.logged("log"))


def test_a_hook_error_quoting_user_text_is_logged_on_one_escaped_line() -> None:
    # Our own bug raising with a job's name in the message: still one line, and the job accepted.
    text = render_hook(load_policy(shipped_policy())).replace(
        "local function guarded(entry, ...)",
        "hook.submit = function(job_desc) error('bad name ' .. job_desc.name, 0) end\nlocal function guarded(entry, ...)", 1)
    result = HookRuntime(text).submit({"name": "x\nslurmctld: error: forged"}, submit_uid=ALICE)
    assert result.rc == SUCCESS
    [line] = result.logged("error")
    assert line == "aigc: hook error, job accepted unchanged: bad name x\\nslurmctld: error: forged"
