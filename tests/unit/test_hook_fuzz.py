"""Hostile comments, names and GPU requests: the hook never raises out and never rejects by accident."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_aigc.policy.hookruntime import SUCCESS, HookResult, HookRuntime
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.tags import comment_tags, trusted_class, trusted_opt_out, trusted_tags

TOUCHED = {"comment", "admin_comment", "features", "prefer", "tres_per_node", "tres_per_job", "partition", "qos", "time_limit"}
LUA_MAGIC = "%[]().*+-?^$"
KEYS = ["type", "model", "vram", "share", "nvlink", "reclaim", "signal", "TYPE", "", "x", "aigc", "vram "]
VALUES = ["infer", "train", "imagegen", "interactive", "unknown", "20G", "0G", "1e9G", "-5G", "40", "yes", "no",
          "", "%d", "%s%s%s", "llama3-8b", "∞", "\x00", "((((", "a,b", "=", "USR1", "B.USR1", "b:sigusr2", "TERM", "B.KILL"]


@lru_cache(maxsize=1)
def runtime() -> HookRuntime:
    return HookRuntime(render_hook(load_policy(shipped_policy())))


def tagged_comments() -> st.SearchStrategy[str]:
    pair = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.sampled_from(VALUES) | st.text(max_size=12))
    tag = st.lists(pair | st.text(alphabet=LUA_MAGIC + ",=:", max_size=8), max_size=8).map(lambda pairs: "aigc:" + ",".join(pairs))
    noise = st.text(max_size=40) | st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape"))
    return st.builds(lambda a, t, b: f"{a}{t}{b}", noise, tag, noise) | noise | st.text(alphabet=LUA_MAGIC, max_size=50)


def gres_values() -> st.SearchStrategy[str | None]:
    entry = st.sampled_from(["gres:gpu:1", "gres/gpu:2", "gres:gpu:a100:8", "gpu", "gres:shard:4", "gres:gpu:",
                             "gres:gpu:%d", "gres:gpu:t4:1", "gres/gpu=1", "gres:gpu:1(S:0)", "gres::::"])
    return st.none() | st.lists(entry, min_size=1, max_size=3).map(",".join) | st.text(max_size=20)


def check_invariants(fields: dict[str, Any], result: HookResult) -> None:
    assert result.rc == SUCCESS, result.user_msg
    assert not [line for line in result.logged("error") if "aigc: hook error" in line], result.logged("error")
    assert set(result.changes) <= TOUCHED
    before = fields.get("comment")
    after = result.after.get("comment")
    # The hook never grows the comment (Slurm's length limit), it only drops stamp-like words.
    assert len((after or "").encode("utf-8", "surrogateescape")) <= len((before or "").encode("utf-8", "surrogateescape"))
    if result.job_class is not None and "admin_comment" in result.changes:
        assert trusted_class(result.after["admin_comment"]) == result.job_class


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comment=tagged_comments(), gres=gres_values(), name=st.text(max_size=30) | st.none(),
       job_gres=gres_values(), features=st.none() | st.text(max_size=15), batch=st.booleans(), uid=st.sampled_from([0, 1001]))
def test_hostile_jobs_are_accepted_and_never_crash_the_hook(
    comment: str, gres: str | None, name: str | None, job_gres: str | None, features: str | None, batch: bool, uid: int,
) -> None:
    fields: dict[str, Any] = {"comment": comment, "tres_per_node": gres, "tres_per_job": job_gres, "name": name,
                              "features": features, "script": "#!/bin/sh\n" if batch else None}
    result = runtime().submit(fields, submit_uid=uid)
    check_invariants(fields, result)
    if uid == 0:
        assert set(result.changes) <= {"admin_comment"}  # root's jobs are only stamped
    else:
        # Every user job carries the hook's stamp, and no user text reaches the stamp words.
        assert trusted_class(result.after["admin_comment"]) == result.job_class
        assert "aigc_class=" not in (result.after.get("comment") or "")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comment=tagged_comments(), admin_comment=st.sampled_from(["aigc_class=interactive", "aigc_class=interactive; x",
                                                                 "x; aigc_class=train", "aigc_reclaim=no",
                                                                 "aigc_signal=B.USR1"]) | st.text(max_size=30))
def test_a_submitted_admin_comment_never_supplies_the_stamp(comment: str, admin_comment: str) -> None:
    """slurmctld refuses a user's AdminComment before the plugin; if one ever got through, the hook's stamp wins."""
    fields = {"comment": comment, "admin_comment": admin_comment, "tres_per_node": "gres:gpu:1", "script": "#!/bin/sh\n"}
    result = runtime().submit(fields, submit_uid=1001)
    stamped = result.after["admin_comment"]
    assert trusted_class(stamped) == result.job_class
    assert trusted_opt_out(stamped) == (comment_tags(comment).get("reclaim") == "no")  # only the tag opts out
    assert trusted_tags(stamped).get("signal") == comment_tags(comment).get("signal")  # only the tag declares a signal


@settings(max_examples=50, deadline=None)
@given(repeat=st.integers(min_value=1, max_value=200), body=st.sampled_from(["type=infer,", "vram=20G,", "%%,", "aigc:"]))
def test_very_long_and_repeated_tags(repeat: int, body: str) -> None:
    comment = "aigc:" + body * repeat + "x" * 10_000
    fields = {"comment": comment, "tres_per_node": "gres:gpu:1", "script": "#!/bin/sh\n"}
    check_invariants(fields, runtime().submit(fields, submit_uid=1001))


@settings(max_examples=100, deadline=None)
@given(comment=tagged_comments(), gres=gres_values())
def test_modify_with_hostile_input_is_accepted(comment: str, gres: str | None) -> None:
    record = {"job_state": 0, "comment": "old", "gres": gres, "name": "j"}
    result = runtime().modify({"comment": comment}, record, modify_uid=1001)
    assert result.rc == SUCCESS
    assert not [line for line in result.logged("error") if "aigc: hook error" in line]
