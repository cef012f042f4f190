"""Where a text is cut: into pieces that fit the context, and where a rewrite cut short resumes."""
from __future__ import annotations

import difflib
import math
import re
from typing import Callable

DEFAULT_GROWTH = 1.3  # most output tokens per source token, per request
OUTPUT_SLACK_TOKENS = 32  # added to the output bound: short sources may grow by more than 30%


def output_bound(source_tokens: int, growth: float = DEFAULT_GROWTH, slack: int = OUTPUT_SLACK_TOKENS) -> int:
    """Most tokens a rewrite of a `source_tokens`-token text may emit."""
    return int(math.ceil(growth * source_tokens)) + slack


def piece_budget(n_ctx: int, overhead_tokens: int, growth: float = DEFAULT_GROWTH,
                 slack: int = OUTPUT_SLACK_TOKENS) -> int:
    """Largest source piece (tokens) whose prompt and bounded output fit a context of n_ctx."""
    return int((n_ctx - overhead_tokens - slack) / (1.0 + growth))


def _cut_points(text: str, code: bool) -> list[list[int]]:
    """Candidate cut positions (index of the first character of a new piece), coarse to fine."""
    headings, paragraphs, top_level, lines, spaces = [], [], [], [], []
    blank_before = False
    pos = 0
    for line in text.split("\n"):
        if pos > 0 and line.strip():
            lines.append(pos)
            if blank_before:
                paragraphs.append(pos)
                if code and not line[0].isspace() and line.lstrip()[0] not in ")]}":
                    top_level.append(pos)
            if not code and re.match(r"#{1,6}\s", line):
                headings.append(pos)
        blank_before = not line.strip()
        pos += len(line) + 1
    for m in re.finditer(r"(?<=[ \t])(?=\S)", text):
        spaces.append(m.start())
    first = top_level if code else headings
    return [sorted(set(first)), paragraphs, lines, spaces]


def split_text(text: str, max_tokens: int, count_tokens: Callable[[str], int], *,
               code: bool = False, min_fill: float = 0.5) -> list[tuple[int, int]]:
    """Cut `text` into (start, end) spans of at most `max_tokens` tokens each, covering it in order.

    A piece ends before the last Markdown heading (prose) or top-level definition after a
    blank line (code) that fits, if that fills at least `min_fill` of the budget; else before
    the last blank-line paragraph that fits, else the last line, else the last space; a
    piece with none of these is cut at a character. Blank lines stay at the end of the piece
    before the cut. The spans always join back to `text`:
    text == "".join(text[s:e] for s, e in spans).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not text:
        return []
    levels = _cut_points(text, code)
    spans: list[tuple[int, int]] = []
    start = 0
    n = len(text)
    while start < n:
        if count_tokens(text[start:]) <= max_tokens:
            spans.append((start, n))
            break
        reach = start + 32 * max_tokens  # no token is 32 characters long: cuts past this never fit
        best = None
        for depth, cuts in enumerate(levels):
            fit = _farthest_fit(text, start, [c for c in cuts if start < c < min(n, reach)], max_tokens, count_tokens)
            if fit is None:
                continue
            if depth > 0 or count_tokens(text[start:fit]) >= min_fill * max_tokens:
                best = fit  # sections when they fill the piece; else the last paragraph, line, space
                break
        if best is None:  # no boundary within the budget: cut at a character
            best = _farthest_fit(text, start, list(range(start + 1, min(n, reach))), max_tokens, count_tokens)
            best = best if best is not None else start + 1
        spans.append((start, best))
        start = best
    return spans


def _farthest_fit(text: str, start: int, cands: list[int], max_tokens: int,
                  count_tokens: Callable[[str], int]) -> int | None:
    """The last of the sorted `cands` with text[start:c] within budget (binary search)."""
    lo, hi, best = 0, len(cands) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if count_tokens(text[start : cands[mid]]) <= max_tokens:
            best = cands[mid]
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def _line_starts(lines: list[str]) -> list[int]:
    """Character offset of each line of "\n".join(lines), and of the end."""
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    return starts


def _matches(src: list[str], kept: str, window: int, min_ratio: float) -> list[int | None]:
    """For each non-blank line of `kept` in order, the source line it matches (None: none):
    equal or similar, at or after the previous match, within `window` lines of it."""
    out: list[int | None] = []
    cursor = 0  # first source line not yet matched
    for line in kept.split("\n"):
        target = line.strip()
        if not target:
            continue
        j = next((j for j in range(cursor, min(len(src), cursor + window))
                  if _similar(src[j].strip(), target, min_ratio)), None)
        if j is not None:
            cursor = j + 1
        out.append(j)
    return out


def _similar(a: str, b: str, min_ratio: float) -> bool:
    """Equal, or alike by difflib's ratio (a line with a typo fixed is still the same line)."""
    return a == b or bool(a and b and difflib.SequenceMatcher(None, a, b).ratio() >= min_ratio)


def _covers(answer_lines: list[str], source_lines: list[str], min_ratio: float) -> bool:
    """Whether answer lines stand for the source lines: one of them is like one source line,
    or together they hold at least half the source lines' words (the lines rewrapped)."""
    if any(_similar(s, a, min_ratio) for s in source_lines for a in answer_lines):
        return True
    words = re.findall(r"\w+", " ".join(source_lines).lower())
    have = set(re.findall(r"\w+", " ".join(answer_lines).lower()))
    return bool(words) and sum(w in have for w in words) >= 0.5 * len(words)


def ended_offset(source: str, kept: str, code: bool = False, window: int = 40, min_ratio: float = 0.75,
                 min_matched: float = 0.5) -> tuple[int, bool]:
    """Where the source's untouched rest starts after an answer `kept` that ended by itself
    before the source did: (offset, replaced), or (0, False) when there is nothing to go on
    from (as `resume_offset`: under `min_matched` of the answer's lines are source lines).

    Only a match that follows the previous one line for line is trusted (a lone similar
    line may be a later one: "return chunks" at the end of a rewritten function is like a
    later function's "return counts"). If the answer's last line is such a match, the rest
    starts on the next source line (replaced = False). If the answer ends in lines of its
    own, they replaced what followed the last trusted match, so the rest starts at the next
    block: a top-level line after a blank one in code, a paragraph in prose (replaced = True).
    """
    src = source.split("\n")
    starts = _line_starts(src)
    found = _matches(src, kept, window, min_ratio)
    prev = last = None  # source line of the previous answer line's match; of the last trusted one
    trailing_new = 0
    for j in found:
        if j is not None and prev is not None and all(not l.strip() for l in src[prev + 1 : j]):
            last, trailing_new = j, 0
        else:
            trailing_new += 1
        prev = j
    lines, matched = len(found), sum(j is not None for j in found)
    if last is None or not lines or matched < min_matched * lines:
        return 0, False
    if trailing_new == 0:
        return min(starts[last + 1], len(source)), False
    for i in range(last + 1, len(src)):
        if src[i].strip() and not src[i - 1].strip() and not (code and src[i][0].isspace()):
            while not src[i - 1].strip():  # from the blank lines before it
                i -= 1
            return starts[i], True
    return len(source), True


def skipped_head(source: str, answer: str, look: int = 3, min_lines: int = 2, min_ratio: float = 0.75) -> int:
    """Where in `source` an answer that skipped the source's first lines starts copying it
    (the character offset of that line), or 0 when it did not skip them.

    Small models sometimes leave out a file's first lines (a module docstring, a licence
    header) and start at the first line of code. Looks at the answer's first `look`
    non-blank lines: the first that is, verbatim, one source line (and only one) at line j
    decides. The answer skipped the head when the source has at least `min_lines` non-blank
    lines before j and the answer lines before it do not stand for them (none is like one of
    them, and they hold under half their words: not the head rewrapped). A first answer line
    like an early source line but not equal to any (a line the instruction changed) means
    the answer follows the source from its start: 0.
    """
    src_lines = source.split("\n")
    stripped = [l.strip() for l in src_lines]
    starts = _line_starts(src_lines)
    before: list[str] = []  # answer lines before the one that decides (lines it added)
    for line in [l.strip() for l in answer.split("\n") if l.strip()][:look]:
        if stripped.count(line) == 1:
            j = stripped.index(line)
            head = [l for l in stripped[:j] if l]
            if len(head) < min_lines or _covers(before, head, min_ratio):
                return 0
            return starts[j]
        if any(_similar(l, line, min_ratio) for l in stripped if l):
            return 0
        before.append(line)
    return 0


def resume_offset(source: str, kept: str, window: int = 40, min_ratio: float = 0.75,
                  min_matched: float = 0.5) -> int:
    """Where in `source` the text not yet rewritten starts, given the rewrite `kept` so far.

    Walks the kept lines in order and matches each to a source line at or after the last
    match (within `window` lines; equal, or similar by difflib's ratio >= `min_ratio`, so a
    line with a typo fixed still matches). Returns the character offset just after the last
    matched source line: a rewrite cut short by a loop or its bound goes on with the source
    from there, so no part of the text is lost. Returns 0 (nothing to go on from) when fewer
    than `min_matched` of the kept non-blank lines matched: the rewrite was not following
    the source, and appending the source's rest would repeat what it already said.
    """
    src_lines = source.split("\n")
    found = _matches(src_lines, kept, window, min_ratio)
    matched = [j for j in found if j is not None]
    if not found or len(matched) < min_matched * len(found):
        return 0
    return min(_line_starts(src_lines)[matched[-1] + 1], len(source))
