"""Plain-text formatting shared by every command that prints: one table layout, one number style.

Pure: strings in, strings out. The CLI commands (`report`, `replay show`, `replay compare`,
`reclaim`, `topo show`) all print their tables through `text_table`, so they line up alike.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# C0 and C1 controls and DEL, and the bidirectional overrides and isolates: in a job name or
# comment they would move the admin's cursor, recolour or rewrite the terminal, or reorder text.
_UNPRINTABLE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character shown as an escape (`\\n`, `\\x1b`, `\\u202e`)."""
    return _UNPRINTABLE_RE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
    return named or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def text_table(header: Sequence[str], body: Sequence[Sequence[str]], *, rule: bool = True) -> str:
    """Columns padded to their widest cell, two spaces apart; numbers right-aligned.

    The first column is always left-aligned (it names the row); any other cell that starts
    with a digit, or is `-` (no value), is right-aligned. `rule` draws dashes under the
    header. Trailing spaces are cut. Every row must have as many cells as the header.
    Cells may hold user text (job names): control characters are shown escaped.
    """
    rows = [[printable(str(cell)) for cell in row] for row in (header, *body)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"table row has {len(row)} cells for {len(header)} columns: {row!r}")
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [_line(row, widths) for row in rows]
    if rule:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _line(row: Sequence[str], widths: Sequence[int]) -> str:
    cells = (cell.rjust(width) if i and _numeric(cell) else cell.ljust(width) for i, (cell, width) in enumerate(zip(row, widths)))
    return "  ".join(cells).rstrip()


def _numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or text == "-")


def short_number(value: float) -> str:
    """Shortest exact-enough text: 30 not 30.0, 12.5 as is, at most 3 decimals."""
    rounded = round(value, 3)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:.3f}".rstrip("0").rstrip(".")
