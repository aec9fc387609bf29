"""The `aigc:` tag grammar and the hook's trusted stamp, for the daemons and reports (pure).

Two different texts, two different trust levels (docs/tags.md, docs/security.md):

* The job's **comment** belongs to its owner, who may change it at any time, also while the
  job runs. `comment_tags` reads the `aigc:` tag from it with exactly the grammar of the
  job_submit hook (`parse_tags` in job_submit_lua/aigc_hook.lua; a property test runs both on
  the same hostile comments). Nothing read from it may grant anything: it only describes the
  job (which model it serves, how much GPU memory it needs).
* The job's **AdminComment** can be written only by slurmctld (our hook, at submit) and by
  Slurm admins: `scontrol update AdminComment=` by a job owner is refused ("Access/permission
  denied", measured on 22.05). The hook opens it with the stamp `aigc_class=<class>`
  (`aigc_reclaim=no` when the user opted out, `aigc_share=no` when the user asked never to
  share a GPU, `aigc_signal=B.USR1` when the user declared the job handles that signal),
  e.g. `aigc_class=train aigc_reclaim=no; aigc-reclaim: job 7 idle: ...`.
  `trusted_class` / `trusted_tags` read that stamp; the daemons decide with it.

The stamp is the run of `aigc_<key>=<value>` words at the very start of the AdminComment,
before the first `;`. Whatever follows (a site's text, a daemon's note) can never be read as
a stamp, and `admin_comment_with` keeps the stamp in front when a daemon writes its note.
"""

from __future__ import annotations

import re

UNKNOWN_CLASS = "unknown"
TAG_PREFIX = "aigc:"
MAX_COMMENT_READ = 1024  # bytes the hook reads: Slurm's own comment limit (MAX_COMMENT_READ in aigc_hook.lua)
# Signals a job may declare it handles (`aigc:signal=USR1`, `aigc:signal=B.USR1`), which are
# also the only ones the reclaim `signal` rung may send while cancelling is off
# (policy/sections.py): every other signal's default action ends or stops the job.
SIGNAL_NAMES = ("USR1", "USR2", "CONT", "URG", "WINCH")

# Lua 5.1's %s in the C locale (slurmctld's): exactly these six bytes, not Python's \s.
_LUA_SPACE = " \t\n\v\f\r"
_BODY_RE = re.compile(f"[^{re.escape(_LUA_SPACE)}]*")
_LUA_SPACE_RE = re.compile(f"[{re.escape(_LUA_SPACE)}]+")
_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STAMP_WORD_RE = re.compile(r"aigc_([a-z]+)=([A-Za-z0-9_.:-]+)")  # `:` for aigc_signal=B:USR1
_MODEL_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_.\-]+")
_VRAM_RE = re.compile(r"([0-9]+\.?[0-9]*)[ \t\n\v\f\r]*([KkMmGgTt])[iI]?[bB]?")  # Lua's %d is ASCII
_UNIT_GIB = {"k": 1 / 1048576, "m": 1 / 1024, "g": 1.0, "t": 1024.0}
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_BOOLEANS = {"yes": True, "true": True, "1": True, "on": True, "no": False, "false": False, "0": False, "off": False}


# --------------------------------------------------------------------------- the user's tag


def tag_pairs(comment: str | None) -> list[tuple[str, str | None]]:
    """The raw pairs of the first `aigc:` word: [(key, value)], (pair_text, None) when malformed.

    Mirrors the hook's `tag_pairs`: only the first `aigc:` counts; its body ends at the first
    Lua whitespace byte; pairs are split on `,` with empty pairs skipped; a pair is
    `key=value` with key `[A-Za-z_][A-Za-z0-9_]*` and value anything (possibly empty).
    """
    if not comment:
        return []
    # The hook reads bytes: cut at the same byte, keep a split character as escaped bytes.
    comment = comment.encode("utf-8", "surrogateescape")[:MAX_COMMENT_READ].decode("utf-8", "surrogateescape")
    at = comment.find(TAG_PREFIX)
    if at < 0:
        return []
    body_match = _BODY_RE.match(comment, at + len(TAG_PREFIX))
    body = body_match.group(0) if body_match else ""
    pairs: list[tuple[str, str | None]] = []
    for pair in (p for p in body.split(",") if p):
        key, sep, value = pair.partition("=")
        if sep and _KEY_RE.fullmatch(key):
            pairs.append((key, value))
        else:
            pairs.append((pair, None))
    return pairs


def clean_model(value: str) -> str:
    """The hook's (and the publisher's) model id: unsafe runs -> `_`, outer `_` dropped."""
    return _MODEL_UNSAFE_RE.sub("_", value).strip("_")


def vram_gib(value: str) -> float | None:
    """`20G` -> 20.0, `512M` -> 0.5 (per GPU, G = GiB); None when not a positive size."""
    match = _VRAM_RE.fullmatch(value)
    if not match:
        return None
    gib = float(match.group(1)) * _UNIT_GIB[match.group(2).lower()]
    return gib if gib > 0 else None


def ascii_lower(text: str) -> str:
    """Lua's string.lower in the C locale: A-Z only (Python's lower() also folds e.g. the Kelvin sign)."""
    return text.translate(_ASCII_LOWER)


def signal_tag(value: str) -> str | None:
    """The hook's reading of `aigc:signal=`: `b:sigusr1` -> `B.USR1`, `usr2` -> `USR2`; None when not allowed.

    `B:`/`B.` means the batch shell (as `sbatch --signal=B:USR1`), else the job steps; the
    stamp writes `.` for `:`. Only `SIGNAL_NAMES`, by name (numbers differ between systems).
    """
    text = value.translate(_ASCII_UPPER)  # Lua's string.upper in the C locale: ASCII only
    batch = text[:2] in ("B:", "B.")
    name = text[2:] if batch else text
    name = name[3:] if name.startswith("SIG") else name
    return ("B." if batch else "") + name if name in SIGNAL_NAMES else None


def _checked(key: str, value: str, classes: frozenset[str] | None) -> str | None:
    """The hook's `check_pair`, as text: the value kept, or None when the hook drops the pair."""
    if value == "":
        return None
    if key == "type":
        cls = ascii_lower(value)
        return cls if classes is None or cls in classes else None
    if key == "model":
        return clean_model(value) or None
    if key == "vram":
        return value if vram_gib(value) is not None else None
    if key in ("share", "nvlink", "reclaim"):
        flag = _BOOLEANS.get(ascii_lower(value))
        return None if flag is None else ("yes" if flag else "no")
    if key == "signal":
        return signal_tag(value)
    return None


def comment_tags(comment: str | None, classes: frozenset[str] | None = None) -> dict[str, str]:
    """`exp aigc:type=Infer,model=llama 3` -> {'type': 'infer', 'model': 'llama'}: what the hook accepts.

    Same pairs, same first-wins for a repeated key, same dropped values as the hook; flags
    come back as `yes`/`no`. `classes` (the policy's class names) checks `type`; without it
    any `type` value is kept. Describes the job only: never trust it for a decision.
    """
    tags: dict[str, str] = {}
    for key, value in tag_pairs(comment):
        if value is None or key in tags:
            continue
        checked = _checked(key, value, classes)
        if checked is not None:
            tags[key] = checked
    return tags


# --------------------------------------------------------------------------- the hook's stamp


def _stamp_words(admin_comment: str | None) -> list[re.Match[str]]:
    words: list[re.Match[str]] = []
    head = (admin_comment or "").split(";", 1)[0]
    for word in _LUA_SPACE_RE.split(head):
        if not word:
            continue
        match = _STAMP_WORD_RE.fullmatch(word)
        if match is None:
            break
        words.append(match)
    return words


def trusted_tags(admin_comment: str | None) -> dict[str, str]:
    """`aigc_class=train aigc_reclaim=no; note` -> {'class': 'train', 'reclaim': 'no'} (first wins)."""
    tags: dict[str, str] = {}
    for match in _stamp_words(admin_comment):
        tags.setdefault(match.group(1), match.group(2))
    return tags


def trusted_class(admin_comment: str | None) -> str:
    """The class the hook stamped into the AdminComment, else `unknown`."""
    return trusted_tags(admin_comment).get("class", UNKNOWN_CLASS)


def trusted_opt_out(admin_comment: str | None) -> bool:
    """Did the hook record the user's `aigc:reclaim=no` (`aigc_reclaim=no`)?"""
    return trusted_tags(admin_comment).get("reclaim") == "no"


def trusted_share_no(admin_comment: str | None) -> bool:
    """Did the hook record the user's `aigc:share=no` (`aigc_share=no`), as it stood at submit?"""
    return trusted_tags(admin_comment).get("share") == "no"


def stamp_of(admin_comment: str | None) -> str:
    """The stamp words of an AdminComment as they stand (`aigc_class=train aigc_reclaim=no`)."""
    return " ".join(match.group(0) for match in _stamp_words(admin_comment))


def stamp(job_class: str, opt_out: bool = False, signal: str = "", learned: bool = False,
          share_no: bool = False) -> str:
    """The stamp the hook writes: `aigc_class=<class>` (+ ` aigc_reclaim=no`) (+ ` aigc_share=no`)
    (+ ` aigc_signal=B.USR1`) (+ ` aigc_learned=1` when the hook took untagged keys from the
    learned table)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", job_class):
        raise ValueError(f"class {job_class!r} cannot be stamped: use letters, digits, _ . -")
    declared = signal_tag(signal) if signal else ""
    if declared is None:
        raise ValueError(f"signal {signal!r} cannot be stamped: use one of {', '.join(SIGNAL_NAMES)}, B. for the batch shell")
    return (f"aigc_class={job_class}" + (" aigc_reclaim=no" if opt_out else "") + (" aigc_share=no" if share_no else "")
            + (f" aigc_signal={declared}" if declared else "") + (" aigc_learned=1" if learned else ""))


def admin_comment_with(existing: str | None, note: str, max_len: int | None = None) -> str:
    """The AdminComment after a daemon writes `note`: the stamp first, the site's text, then the note.

    A previous note with the same first word (e.g. `aigc-reclaim:`) and all that followed it
    is replaced, as the reclaim actuator always did. Stamp-like words in the site's text or
    the note are defused (`aigc_class=` -> `aigc-class=`); `max_len` shortens the text after
    the stamp from the front (oldest first), never the stamp.
    """
    current = existing or ""
    head = stamp_of(current)
    rest = current[len(head):].lstrip(" ;") if head else current
    tag = note.split(maxsplit=1)[0] if note.strip() else ""
    kept = (rest.split(tag, 1)[0] if tag else rest).rstrip(" ;")
    body = "; ".join(part for part in (kept, note.strip()) if part)
    body = re.sub(r"aigc_(?=[a-z]+=)", "aigc-", body)
    if max_len is not None:
        room = max_len - (len(head) + 2 if head else 0)
        body = body[-room:] if room > 0 else ""
    return f"{head}; {body}" if head and body else head or body
