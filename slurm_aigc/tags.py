"""Reading `aigc:` tags back out of job comments (pure), for the daemons and reports.

The hook is the authority on the tag grammar (docs/tags.md) and records the class it
resolved as ` aigc_class=<class>` in the comment. Everything downstream reads comments
tolerantly through this module: only `key=value` pairs inside an `aigc:` word count, the
first value of a repeated key wins, and malformed text is ignored, never an error.
"""

from __future__ import annotations

import re

UNKNOWN_CLASS = "unknown"
_TAG_RE = re.compile(r"(?:^|[\s;,|])aigc:(\S+)")
_PAIR_SPLIT_RE = re.compile(r"[,;|]")
_CLASS_RE = re.compile(r"(?:^|[\s;,|])aigc_class=([A-Za-z0-9_.-]+)")


def comment_tags(comment: str) -> dict[str, str]:
    """`exp aigc:type=infer,model=x aigc_class=infer` -> {'type': 'infer', 'model': 'x', 'class': 'infer'}."""
    tags: dict[str, str] = {}
    for group in _TAG_RE.findall(comment or ""):
        for pair in _PAIR_SPLIT_RE.split(group):
            key, sep, value = pair.partition("=")
            if sep and key.strip() and value.strip():
                tags.setdefault(key.strip().lower(), value.strip())
    match = _CLASS_RE.search(comment or "")
    if match:
        tags.setdefault("class", match.group(1))
    return tags


def job_class(*comments: str, default: str = UNKNOWN_CLASS) -> str:
    """The class the hook recorded (`aigc_class=C`) in any comment, else a user's `type=C` tag."""
    for comment in comments:
        match = _CLASS_RE.search(comment or "")
        if match:
            return match.group(1)
    for comment in comments:
        tags = comment_tags(comment)
        if tags.get("type"):
            return tags["type"]
    return default
