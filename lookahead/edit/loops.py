"""Loop detection: a block of lines that an answer repeats back to back more often than its source."""
from __future__ import annotations

import re
from typing import Sequence

LOOP_MAX_PERIOD = 16  # longest block of lines (blank ones included) checked for back-to-back repetition
_DIGITS = re.compile(r"\d+")


def norm_line(line: str) -> str:
    """A line as loop detection compares it: trailing spaces dropped, every number made 0.

    Small models also loop on a line whose number counts up ("Python 3.30 or newer",
    "Python 3.31 or newer", ...): those lines are the same line here.
    """
    return _DIGITS.sub("0", line.rstrip())


def tail_repeats(lines: Sequence[str], max_period: int = LOOP_MAX_PERIOD) -> dict[int, int]:
    """For each period p, how many trailing lines equal the line p above them (as `norm_line` sees them).

    {p: k} with k > 0 only: the last k lines repeat the block of p lines just before them,
    so the tail holds 1 + k // p back-to-back copies of that block.
    """
    n = len(lines)
    out: dict[int, int] = {}
    for p in range(1, min(max_period, n - 1) + 1):
        k = 0
        while k < n - p and norm_line(lines[n - 1 - k]) == norm_line(lines[n - 1 - k - p]):
            k += 1
        if k:
            out[p] = k
    return out


def count_consecutive(lines: Sequence[str], block: Sequence[str]) -> int:
    """Most back-to-back copies of `block` anywhere in `lines` (0 if it never occurs)."""
    p = len(block)
    block = [norm_line(b) for b in block]
    norm = [norm_line(x) for x in lines]
    best = 0
    i = 0
    while i + p <= len(norm):
        copies = 0
        j = i
        while j + p <= len(norm) and norm[j : j + p] == block:
            copies += 1
            j += p
        if copies:
            best = max(best, copies)
            i = j
        else:
            i += 1
    return best


def copies_allowed(block: Sequence[str]) -> int:
    """Back-to-back copies of a block before it counts as a loop (without the source's say).

    A block with two non-blank lines, or 30+ characters, repeated once is already a loop; a
    short single line (a closing brace, a separator) may appear twice.
    """
    content = [b.strip() for b in block if b.strip()]
    if not content:
        return 10**9  # blank lines are never a loop
    return 1 if len(content) >= 2 or sum(map(len, content)) >= 30 else 2


def find_loop(lines: Sequence[str], source_lines: Sequence[str] = (),
              max_period: int = LOOP_MAX_PERIOD) -> tuple[int, int] | None:
    """A loop at the end of `lines`: (period, lines to cut), or None.

    A loop is a block of up to `max_period` lines repeated back to back (numbers aside, see
    `norm_line`) more often than `copies_allowed` and than anywhere in `source_lines`.
    Cutting the returned number of lines keeps the first copy.
    """
    for p, k in sorted(tail_repeats(lines, max_period).items()):
        copies = 1 + k // p
        block = lines[len(lines) - k - p : len(lines) - k]
        allowed = copies_allowed(block)
        if copies <= allowed:
            continue
        if source_lines and count_consecutive(source_lines, block) >= copies:
            continue
        return p, k
    return None
