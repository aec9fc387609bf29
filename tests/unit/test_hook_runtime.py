"""The lupa harness behaves like slurmctld's job_submit/lua (22.05.8) where the hook relies on it."""

from __future__ import annotations

import pytest

from slurm_aigc.policy.hookruntime import (
    ERROR,
    NO_VAL,
    SUCCESS,
    HookRuntime,
    HookRuntimeError,
)

ENTRY = """
function slurm_job_submit(job_desc, part_list, submit_uid)
{body}
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
{modify}
end
return slurm.SUCCESS
"""


def hook(body: str, modify: str = "return slurm.SUCCESS") -> HookRuntime:
    return HookRuntime(ENTRY.format(body=body, modify=modify))


def test_log_functions_format_with_string_format() -> None:
    result = hook('slurm.log_info("a=%d b=%s", 3, "x"); slurm.log_debug("%5.1f", 2.25); '
                  'slurm.log_error("bad %s", "thing"); return slurm.SUCCESS').submit({}, submit_uid=1)
    assert result.logged("log") == ["a=3 b=x", "  2.2"]
    assert result.logged("error") == ["bad thing"]


def test_user_msg_keeps_only_last_argument_and_joins_calls() -> None:
    result = hook('slurm.user_msg("first", "second"); slurm.log_user("n=%d", 7); return slurm.SUCCESS').submit({}, submit_uid=1)
    assert result.user_msg == "second\nn=7"
    assert result.messages == ["second", "n=7"]


def test_codes_and_return_value() -> None:
    result = hook("return slurm.ESLURM_INVALID_GRES").submit({}, submit_uid=1)
    assert result.rc == 2072 and not result.accepted
    assert hook("return slurm.ERROR").submit({}, submit_uid=1).rc == ERROR


def test_unset_numbers_read_as_no_val_and_strings_as_nil() -> None:
    result = hook('job_desc.comment = tostring(job_desc.time_limit) .. "/" .. tostring(job_desc.partition); '
                  "return slurm.SUCCESS").submit({}, submit_uid=1)
    assert result.after["comment"] == f"{NO_VAL}/nil"


def test_empty_string_unsets_on_submit_and_on_modify() -> None:
    # Measured on 22.05.8: a modify whose comment the hook set to "" left the job's old comment
    # (slurmctld.log had no "_update_job: setting comment"); the same update typed by the user cleared it.
    runtime = hook('job_desc.comment = ""; return slurm.SUCCESS', modify='job_desc.comment = ""; return slurm.SUCCESS')
    assert runtime.submit({"comment": "x"}, submit_uid=1).changes == {"comment": ("x", None)}
    assert runtime.modify({"comment": "aigc_class=x"}, {"job_state": 0}, modify_uid=1).changes == {
        "comment": ("aigc_class=x", None)}


def test_writing_nil_to_a_string_field_raises_like_luaL_checkstring() -> None:
    with pytest.raises(HookRuntimeError, match="string expected"):
        hook("job_desc.comment = nil; return slurm.SUCCESS").submit({"comment": "x"}, submit_uid=1)


def test_writing_extra_raises_because_it_crashes_2205() -> None:
    with pytest.raises(HookRuntimeError, match="extra"):
        hook('job_desc.extra = "x"; return slurm.SUCCESS').submit({}, submit_uid=1)


def test_unknown_field_write_is_logged_and_ignored() -> None:
    result = hook('job_desc.no_such_field = "x"; return slurm.SUCCESS').submit({}, submit_uid=1)
    assert result.rc == SUCCESS and result.changes == {}
    assert result.logged("error") == ["_set_job_field: unrecognized field: no_such_field"]


def test_script_must_return_success_on_load() -> None:
    with pytest.raises(HookRuntimeError, match="returned"):
        HookRuntime("return slurm.ERROR")
    with pytest.raises(HookRuntimeError, match="does not load"):
        HookRuntime("function (")


def test_binary_strings_survive_the_round_trip() -> None:
    blob = "a\udcff\x00b"  # not UTF-8 and an embedded NUL
    result = hook("job_desc.comment = job_desc.comment .. '!'; return slurm.SUCCESS").submit({"comment": blob}, submit_uid=1)
    assert result.after["comment"] == blob + "!"


def test_part_list_and_job_rec_are_read_only_views() -> None:
    runtime = hook(
        'job_desc.comment = tostring(part_list.gpu.max_time); return slurm.SUCCESS',
        modify='job_desc.comment = job_rec.comment .. "+"; return slurm.SUCCESS',
    )
    assert runtime.submit({}, submit_uid=1).after["comment"] == "4294967295"
    assert runtime.modify({}, {"comment": "old", "job_state": 0}, modify_uid=1).after["comment"] == "old+"
