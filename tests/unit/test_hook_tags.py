"""One tag grammar: slurm_aigc/tags.py reads comments and AdminComments exactly as the hook does."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_aigc.policy.hookruntime import HookRuntime
from slurm_aigc.policy.loader import load_policy
from slurm_aigc.policy.paths import shipped_policy
from slurm_aigc.policy.render import render_hook
from slurm_aigc.tags import (
    MAX_COMMENT_READ,
    admin_comment_with,
    comment_tags,
    stamp,
    stamp_of,
    trusted_class,
    trusted_opt_out,
    trusted_tags,
    vram_gib,
)

POLICY = load_policy(shipped_policy())
CLASSES = frozenset(POLICY.classes)
# Whitespace Python knows and Lua's %s (C locale) does not, and the other way round none.
ODD_SPACE = ["\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u2028", "\u3000", "\x0b", "\x0c", "\r", "\t", "\n", " "]
PIECES = ["aigc:", "aigc_class=", "aigc_reclaim=no", "aigc_share=no", "aigc_learned=1", "type=", "model=", "vram=", "share=", "nvlink=", "reclaim=",
          "infer", "TRAIN", "Interactive", "\u212aB", "20G", "0.5T", "1e3G", "٣G", "512m", "yes", "No", "ON", "0",
          ",", ",,", "=", ";", "|", "%", "x", "é", "\x00", "\udc80", *ODD_SPACE,
          "signal=", "USR1", "usr2", "B.", "b:", "B:", "SIG", "sig", "TERM", "KILL", "10", "WINCH", "ſ"]


@lru_cache(maxsize=1)
def hook() -> HookRuntime:
    return HookRuntime(render_hook(POLICY))


def comments() -> st.SearchStrategy[str]:
    built = st.lists(st.sampled_from(PIECES) | st.text(max_size=6), max_size=25).map("".join)
    return built | st.text(max_size=60)


def as_python(lua_tags: dict[str, Any]) -> dict[str, Any]:
    """The hook's typed tags in tags.py's text form (flags yes/no; vram compared as GiB below)."""
    return {k: ("yes" if v else "no") if isinstance(v, bool) else v for k, v in lua_tags.items()}


def assert_same(comment: str) -> None:
    lua_tags, _ = hook().parse_tags(comment)
    ours = comment_tags(comment, CLASSES)
    expected = as_python(lua_tags)
    if "vram" in ours or "vram" in expected:
        assert vram_gib(ours.pop("vram", "")) == expected.pop("vram", None), comment
    assert ours == expected, comment


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comment=comments())
def test_hook_and_python_read_every_comment_alike(comment: str) -> None:
    assert_same(comment)


@settings(max_examples=200, deadline=None)
@given(pad=st.integers(min_value=MAX_COMMENT_READ - 40, max_value=MAX_COMMENT_READ + 5), fill=st.sampled_from(["x", "é", "€"]),
       tag=st.sampled_from(["aigc:type=infer,vram=20G", "aigc:model=llama3-8b,share=no", "aigc:reclaim=no"]))
def test_the_read_cap_cuts_at_the_same_byte(pad: int, fill: str, tag: str) -> None:
    comment = fill * (pad // len(fill.encode())) + tag
    assert_same(comment)


def test_examples_of_the_one_grammar() -> None:
    assert comment_tags("exp aigc:type=Infer,model=llama 3", CLASSES) == {"type": "infer", "model": "llama"}
    # Only the first aigc: counts and pairs split on `,` alone (tags.py used to accept ;| and every aigc:).
    assert comment_tags("aigc:type=train;reclaim=no", CLASSES) == {}
    assert comment_tags("aigc:model=a aigc:type=train", CLASSES) == {"model": "a"}
    assert comment_tags("aigc:type=infer,type=train", CLASSES) == {"type": "infer"}
    assert comment_tags("aigc:type=\u212aeep", frozenset({"keep"})) == {}  # Lua lowers ASCII only


@settings(max_examples=800, deadline=None)
@given(admin_comment=st.lists(st.sampled_from(["aigc_class=train", "aigc_reclaim=no", "aigc_share=no", "aigc_signal=B:USR1", "aigc_signal=B.USR1", "aigc_x=",
                                                "aigc_Class=a", "note", ";", " ", "\t", "\x1c", "aigc-reclaim:", "é"]),
                              max_size=8).map("".join) | st.text(max_size=30))
def test_hook_and_python_read_the_stamp_alike(admin_comment: str) -> None:
    found, text, _ = hook().stamp_of(admin_comment)
    assert trusted_tags(admin_comment) == found and stamp_of(admin_comment) == text


def test_only_the_leading_stamp_is_trusted() -> None:
    assert trusted_class("aigc_class=train aigc_reclaim=no; aigc-reclaim: job 4 idle") == "train"
    assert trusted_opt_out("aigc_class=train aigc_reclaim=no")
    assert trusted_class("site text; aigc_class=interactive") == "unknown"
    assert trusted_class("aigc_class=train aigc_class=interactive") == "train"  # first wins
    assert trusted_class("") == trusted_class(None) == "unknown"


def test_a_daemon_note_keeps_the_stamp_in_front_and_cannot_forge_one() -> None:
    first = admin_comment_with("aigc_class=train; site", "aigc-reclaim: job 4 idle: notify")
    assert first == "aigc_class=train; site; aigc-reclaim: job 4 idle: notify"
    second = admin_comment_with(first, "aigc-reclaim: job 4 idle: requeue")
    assert second == "aigc_class=train; site; aigc-reclaim: job 4 idle: requeue"  # our old note replaced
    forged = admin_comment_with("", "aigc_class=interactive x")
    assert trusted_class(forged) == "unknown" and "aigc-class=interactive" in forged
    short = admin_comment_with("aigc_class=train aigc_reclaim=no", "aigc-reclaim: " + "x" * 500, max_len=100)
    assert len(short) == 100 and trusted_tags(short) == {"class": "train", "reclaim": "no"}


def test_stamp_text() -> None:
    assert stamp("train") == "aigc_class=train" and stamp("infer", opt_out=True) == "aigc_class=infer aigc_reclaim=no"
    assert stamp("train", signal="b:sigusr1") == "aigc_class=train aigc_signal=B.USR1"
    assert stamp("infer", learned=True) == "aigc_class=infer aigc_learned=1"
    assert trusted_tags(stamp("infer", learned=True)) == {"class": "infer", "learned": "1"}
    assert stamp("infer", opt_out=True, share_no=True, signal="USR1") == (
        "aigc_class=infer aigc_reclaim=no aigc_share=no aigc_signal=USR1")


def test_examples_of_the_signal_key() -> None:
    assert comment_tags("aigc:type=train,signal=B.USR1", CLASSES) == {"type": "train", "signal": "B.USR1"}
    assert comment_tags("aigc:signal=b:SigUsr2", CLASSES) == {"signal": "B.USR2"}  # sbatch's --signal=B:USR2 spelling
    assert comment_tags("aigc:signal=wınch", CLASSES) == {}  # dotless i: Lua upper-cases ASCII only
    for value in ("TERM", "KILL", "10", "B:HUP", "SIG", "B.", "X.USR1"):
        assert comment_tags(f"aigc:signal={value}", CLASSES) == {}, value
        assert hook().parse_tags(f"aigc:signal={value}")[0] == {}, value
