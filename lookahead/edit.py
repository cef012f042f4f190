"""Editing: rewrite a text, or a region of it, by an instruction, streaming the new text.

    from lookahead import edit
    rw = edit.rewrite(fast, buffer_text, "Fix the typos")            # fast = lookahead.load()
    for piece in rw:                                                  # str, in order, as produced
        show(piece)
    rw.result.text, rw.result.warnings, rw.result.finish_reason       # after the loop

The source (the whole text, or each piece of it) is registered as the reference of its
request (as its `prediction`, so the stats count the drafts taken from it apart), so
unchanged stretches are drafted from it and verified in one pass. What comes
back is cleaned as it streams: a code fence around the whole answer and a line of chatter
before it ("Here is the revised document:") are dropped, and so is what follows the closing
fence or a repeated line of the instruction. A rewrite never runs away: each request may
emit at most `growth` times the source's tokens plus a little slack, and a block of lines
repeated back to back (more often than in the source, numbers aside) stops the request, is
cut from the result, and adds a warning. A rewrite cut short that way goes on with the
original text from the line where it stopped (when it was following the source), so no
part of the text is lost; a request that returns no text keeps the original. A text longer
than the context is rewritten in pieces cut at natural boundaries (Markdown headings,
blank-line paragraphs, top-level definitions in code; lines, then spaces, only when a single
block is too long), each piece with its own source as the reference, streamed in order.

The prompt puts the document first and the instruction after it, so two edits of the same
document with different instructions share the document's tokens as a prompt prefix and the
second request reuses their KV cache (`speculation["reused_prompt_tokens"]`).

This module is pure text logic plus calls to the wrapper (`fast.create_chat_completion`,
`fast.count_tokens`, `fast.n_ctx`); it imports no backend.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

CODE_SUFFIXES = {".py", ".js", ".ts", ".c", ".h", ".cpp", ".rs", ".go", ".java", ".sh", ".rb", ".php", ".cs",
                 ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".sql", ".html", ".css"}

DEFAULT_GROWTH = 1.3  # most output tokens per source token, per request
OUTPUT_SLACK_TOKENS = 32  # added to the output bound: short sources may grow by more than 30%
TEMPLATE_SLACK_TOKENS = 64  # chat-template tokens around the turns (roles, default system prompt)
MIN_PIECE_TOKENS = 16
DIVERGED_LINES_KEPT = 0.25  # see EditResult.diverged
LOOP_MAX_PERIOD = 16  # longest block of lines (blank ones included) checked for back-to-back repetition


def is_code(filename: str | None) -> bool:
    """Whether `filename` names a code or config file (by suffix), as opposed to prose."""
    if not filename:
        return False
    name = filename.lower()
    return any(name.endswith(suffix) for suffix in CODE_SUFFIXES)


# ---- the prompt -------------------------------------------------------------------------
def build_rewrite_messages(text: str, instruction: str, filename: str | None = None) -> list[dict]:
    """The chat request for a rewrite: a fixed system turn, the document, then the instruction.

        system: You rewrite documents. You always reply with the complete revised document.
        user:   <the text>
        user:   <instruction> in the document above.

    The document comes before the instruction, so two edits of the same text with different
    instructions share the system turn and the document as a prompt prefix, and the second
    request reuses its KV cache. On the tallybook README ("Fix the spelling mistakes",
    greedy), SmolLM2-135M-Instruct copies the document in this form (and still mangles
    parts of it); with the instruction first it looped, with document and instruction in
    one user turn it wandered off into unrelated text, and with an assistant turn between
    them it only said it had made the changes. Qwen2.5-Coder-0.5B-Instruct gives a clean
    rewrite in this form. ("files" and "file" instead of "documents" for code.)
    """
    if not instruction or not instruction.strip():
        raise ValueError(f"the instruction is empty: {instruction!r}")
    kind = "file" if is_code(filename) else "document"
    ask = instruction.strip().rstrip(".")
    return [{"role": "system", "content": f"You rewrite {kind}s. You always reply with the complete revised {kind}."},
            {"role": "user", "content": text},
            {"role": "user", "content": f"{ask} in the {kind} above."}]


# ---- cleaning the answer ----------------------------------------------------------------
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w.+#-]*)\s*$")
_CHATTER_START = re.compile(
    r"^(?:sure|certainly|of course|okay|ok|absolutely|great)\b"
    r"|^(?:here(?:'s| is| are)|below is|this is|i have|i've)\b"
    r"|^(?:the |your |a )?(?:revised|corrected|updated|rewritten|edited|fixed|improved|modified|new)\s+"
    r"(?:document|text|file|version|code|readme|content|markdown)\b",
    re.IGNORECASE)
_CHATTER_WORDS = re.compile(r"revised|corrected|updated|rewritten|edited|fixed|improved|modified|changes",
                            re.IGNORECASE)


def is_fence(line: str) -> bool:
    """A Markdown code-fence line: ``` or ~~~, optionally with a language name."""
    return bool(_FENCE.match(line))


def is_chatter(line: str) -> bool:
    """A line a model puts before its answer: "Here is the revised document:", "Sure! ...".

    Only short lines that end with a colon or mention the revision count, so that a document
    whose first line merely starts with "Here" is not taken for chatter.
    """
    core = line.strip().strip("*_#> ").strip()
    if not core or len(core) > 160:
        return False
    if not _CHATTER_START.search(core):
        return False
    return core.endswith(":") or bool(_CHATTER_WORDS.search(core))


# ---- loops --------------------------------------------------------------------------------
_DIGITS = re.compile(r"\d+")


def _norm(line: str) -> str:
    """A line as loop detection compares it: trailing spaces dropped, every number made 0.

    Small models also loop on a line whose number counts up ("Python 3.30 or newer",
    "Python 3.31 or newer", ...): those lines are the same line here.
    """
    return _DIGITS.sub("0", line.rstrip())


def tail_repeats(lines: Sequence[str], max_period: int = LOOP_MAX_PERIOD) -> dict[int, int]:
    """For each period p, how many trailing lines equal the line p above them (as `_norm` sees them).

    {p: k} with k > 0 only: the last k lines repeat the block of p lines just before them,
    so the tail holds 1 + k // p back-to-back copies of that block.
    """
    n = len(lines)
    out: dict[int, int] = {}
    for p in range(1, min(max_period, n - 1) + 1):
        k = 0
        while k < n - p and _norm(lines[n - 1 - k]) == _norm(lines[n - 1 - k - p]):
            k += 1
        if k:
            out[p] = k
    return out


def count_consecutive(lines: Sequence[str], block: Sequence[str]) -> int:
    """Most back-to-back copies of `block` anywhere in `lines` (0 if it never occurs)."""
    p = len(block)
    block = [_norm(b) for b in block]
    norm = [_norm(x) for x in lines]
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
    `_norm`) more often than `copies_allowed` and than anywhere in `source_lines`. Cutting the returned number of
    lines keeps the first copy.
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


class AnswerCleaner:
    """Cleans a model's answer as it streams; releases only text that will not be taken back.

    feed(delta) -> text safe to show; finish() -> the rest. It drops leading chatter lines and
    an opening fence (unless the source itself starts that way), stops at the fence that
    closes it (`stopped` = "fence") or at a line of the prompt's instruction repeated
    (`echo_lines`; `stopped` = "echo"), stops a loop of repeated lines (`stopped` = "loop", the
    repeats cut, `loop_block` the repeated lines), and strips leading and trailing blank
    lines (the caller puts the source's own back). Lines that might be the start of a repeat
    are held until they are known not to be.
    """

    def __init__(self, source: str, echo_lines: Sequence[str] = (), max_period: int = LOOP_MAX_PERIOD):
        self.source_lines = source.split("\n")
        # lines of the prompt that are not the document (the instruction): a model that
        # repeats one has finished the document
        self._echo = {l.strip() for l in echo_lines if l.strip()} - {l.strip() for l in self.source_lines}
        src_first = next((l for l in self.source_lines if l.strip()), "")
        self._source_starts_fenced = is_fence(src_first)
        self._source_first = src_first.strip()
        self.max_period = max_period
        self.lines: list[str] = []  # complete lines of the cleaned answer
        self._released = 0  # lines of self.lines already released
        self._partial = ""  # incomplete last line
        self._partial_released = 0  # characters of _partial already released
        self._head = True  # still looking at the answer's first lines (chatter / fence)
        self._fenced = False  # the answer opened a fence around the whole document
        self._inner_fence = False  # inside a fence of the document itself
        self._source_fences = sum(is_fence(l) for l in self.source_lines)
        self._body_fences = 0  # fence lines of the document's own code blocks seen in the answer
        self._pending_newlines = ""  # newlines held until text follows them
        self._emitted_any = False
        self._source_set = {l.strip() for l in self.source_lines if l.strip()}
        # A first line ending with ":" that the source does not have, held until the next line
        # shows whether it introduces a fenced answer ("You can rename it like this:").
        self._intro: str | None = None
        self._intro_gap = 0  # blank lines after it
        self.stopped: str | None = None  # "fence", "echo" or "loop"
        self.loop_block: list[str] = []
        self.dropped: list[str] = []  # lines dropped as chatter or fences

    # ---- output with held newlines ----
    def _out(self, s: str) -> str:
        if not s:
            return ""
        body = s.rstrip("\n")
        tail = s[len(body):]
        if not body:
            if self._emitted_any:
                self._pending_newlines += tail
            return ""
        out = (self._pending_newlines if self._emitted_any else "") + body
        self._pending_newlines = tail
        self._emitted_any = True
        return out

    def feed(self, delta: str) -> str:
        if self.stopped or not delta:
            return ""
        text = self._partial + delta
        *complete, self._partial = text.split("\n")
        out = []
        if complete:
            # a partial line that had been released is now complete
            already = self._partial_released
            self._partial_released = 0
            for i, line in enumerate(complete):
                out.append(self._add_line(line, already if i == 0 else 0))
                if self.stopped:
                    self._partial = ""
                    return "".join(out)
        out.append(self._release_partial())
        return "".join(out)

    def _add_line(self, line: str, already_released: int) -> str:
        if self._head:
            if not line.strip():
                self._intro_gap += self._intro is not None
                return ""  # leading blank lines (or blank lines after a held intro)
            if self._intro is not None:
                intro, self._intro = self._intro, None
                if is_fence(line) and not self._fenced:
                    self.dropped.append(intro)  # it introduced the fenced answer: chatter
                else:  # it was the answer's first line
                    self._head = False
                    out = self._add_line(intro, 0)
                    out += "".join(self._add_line("", 0) for _ in range(self._intro_gap))
                    return out + self._add_line(line, already_released)
            if (is_chatter(line) and line.strip() != self._source_first) or (
                    is_fence(line) and not self._source_starts_fenced and not self._fenced):
                if is_fence(line):
                    self._fenced = True
                self.dropped.append(line)
                return ""
            if (line.strip().endswith(":") and line.strip() not in self._source_set and not self._fenced
                    and not self._source_starts_fenced):
                self._intro = line
                return ""
            self._head = False
        if line.strip() in self._echo:
            self.stopped = "echo"
            self.dropped.append(line)
            return self._release_lines(len(self.lines))
        if self._fenced and is_fence(line):
            if self._inner_fence:  # closes a code block of the document
                self._inner_fence = False
            elif _FENCE.match(line).group(2) or self._body_fences < self._source_fences:
                self._inner_fence = True  # ```lang, or a bare fence the source has too: the document's own
                self._body_fences += 2
            else:  # the fence that closes the whole answer
                self.stopped = "fence"
                self.dropped.append(line)
                return self._release_lines(len(self.lines))
        self.lines.append(line)
        if already_released:
            # the line was shown while partial: it is released as it stands
            assert self._released == len(self.lines) - 1, "a line was released past held ones"
            self._released = len(self.lines)
            return self._out(line[already_released:] + "\n")
        loop = find_loop(self.lines, self.source_lines, self.max_period)
        if loop is not None:
            period, cut = loop
            self.loop_block = self.lines[len(self.lines) - cut - period : len(self.lines) - cut]
            del self.lines[len(self.lines) - cut :]
            self.stopped = "loop"
            return self._release_lines(len(self.lines))
        hold = max(tail_repeats(self.lines, self.max_period).values(), default=0)
        if not self._fenced and is_fence(line):
            hold = max(hold, 1)  # maybe a stray closing fence at the very end
        return self._release_lines(len(self.lines) - hold)

    def _release_lines(self, upto: int) -> str:
        if upto <= self._released:
            return ""
        text = "".join(l + "\n" for l in self.lines[self._released : upto])
        self._released = upto
        return self._out(text)

    def _release_partial(self) -> str:
        part = self._partial
        if self._head or not part or self._released < len(self.lines):
            return ""
        if part.lstrip().startswith(("`", "~")):
            return ""  # maybe a fence
        stripped = _norm(part)
        n = len(self.lines)
        for p in range(1, min(self.max_period, n) + 1):
            if _norm(self.lines[n - p]).startswith(stripped):
                return ""  # maybe a repeat of the line p above
        new = part[self._partial_released :]
        self._partial_released = len(part)
        return self._out(new)

    def finish(self) -> str:
        """The rest of the answer once the model has stopped."""
        out = []
        if not self.stopped and self._partial:
            line, already = self._partial, self._partial_released
            self._partial, self._partial_released = "", 0
            if not (self._head and not line.strip()):
                out.append(self._add_line(line, already))
        if not self.stopped and self._intro is not None:  # the answer was that one line
            intro, self._intro = self._intro, None
            self._head = False
            out.append(self._add_line(intro, 0))
        if not self.stopped:
            # a stray closing fence at the end that opens nothing in the document
            if (self.lines and not self._fenced and is_fence(self.lines[-1]) and self._released < len(self.lines)
                    and sum(is_fence(l) for l in self.lines) % 2 == 1):
                self.dropped.append(self.lines.pop())
            out.append(self._release_lines(len(self.lines)))
        return "".join(out)

    @property
    def text(self) -> str:
        """The cleaned answer so far (lines kept), without leading/trailing blank lines."""
        return "\n".join(self.lines).strip("\n")


# ---- resuming after a cut -----------------------------------------------------------------------
def lines_kept(source: str, output: str) -> float:
    """Share of the source's non-blank lines found verbatim, in order, in the output (0..1).

    A rough measure of how much of the text a rewrite kept: a typo fix keeps most lines, a
    model that answered with something else keeps none.
    """
    import difflib

    src = [line.rstrip() for line in source.splitlines() if line.strip()]
    out = [line.rstrip() for line in output.splitlines() if line.strip()]
    if not src:
        return 1.0
    matcher = difflib.SequenceMatcher(None, src, out, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / len(src)


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
    import difflib

    src_lines = source.split("\n")
    starts = [0]
    for line in src_lines:
        starts.append(starts[-1] + len(line) + 1)
    cursor = 0  # first source line not yet matched
    lines = matched = 0
    for line in kept.split("\n"):
        target = line.strip()
        if not target:
            continue
        lines += 1
        for j in range(cursor, min(len(src_lines), cursor + window)):
            candidate = src_lines[j].strip()
            if candidate == target or (candidate and difflib.SequenceMatcher(None, candidate, target).ratio() >= min_ratio):
                cursor = j + 1
                matched += 1
                break
    if not lines or matched < min_matched * lines:
        return 0
    return min(starts[cursor], len(source))


# ---- splitting long texts -------------------------------------------------------------------
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
    piece with none of these is cut at a character. Blank lines stay at the end of the piece before the cut. The spans
    always join back to `text`: text == "".join(text[s:e] for s, e in spans).
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


def output_bound(source_tokens: int, growth: float = DEFAULT_GROWTH, slack: int = OUTPUT_SLACK_TOKENS) -> int:
    """Most tokens a rewrite of a `source_tokens`-token text may emit."""
    return int(math.ceil(growth * source_tokens)) + slack


def piece_budget(n_ctx: int, overhead_tokens: int, growth: float = DEFAULT_GROWTH,
                 slack: int = OUTPUT_SLACK_TOKENS) -> int:
    """Largest source piece (tokens) whose prompt and bounded output fit a context of n_ctx."""
    return int((n_ctx - overhead_tokens - slack) / (1.0 + growth))


def _instruction_lines(messages: list[dict], document: str) -> list[str]:
    """The lines of the request that are not the document (the instruction's wording)."""
    out = []
    for message in messages:
        content = message.get("content") or ""
        at = content.find(document) if document else -1
        rest = content[:at] + "\n" + content[at + len(document):] if at >= 0 else content
        out.extend(l for l in rest.split("\n") if l.strip())
    return out


def _edges(piece: str) -> tuple[str, str, str]:
    """(leading blank lines, core, trailing whitespace) of a piece of source text."""
    core_end = len(piece.rstrip())
    trail = piece[core_end:]
    body = piece[:core_end]
    m = re.match(r"(?:[ \t]*\n)*", body)
    lead = m.group(0) if m else ""
    return lead, body[len(lead):], trail


# ---- results ---------------------------------------------------------------------------------
@dataclass
class PieceResult:
    """One request of a rewrite: the source span it rewrote and how it ended."""
    start: int  # character offsets of the piece in the text
    end: int
    source_tokens: int
    max_tokens: int
    text: str = ""  # the rewritten piece, with the source's leading/trailing blank lines
    finish_reason: str = ""  # "stop", "length" (the output bound), "loop", "empty"
    first_text_ms: float | None = None  # request start to the model's first text
    speculation: dict = field(default_factory=dict)


@dataclass
class EditResult:
    """What a finished rewrite produced.

    `text` is the new text of the region (the whole text when no region was given), exactly
    the concatenation of what was streamed; `document` is the whole text with the region
    replaced. `finish_reason` is "stop" when every piece ended by itself, else the worst of
    "length" (an output hit its bound: the rewrite may be cut short) and "loop" (a loop was
    stopped and cut). `warnings` say which piece and what happened, in words a user can act
    on. `speculation` sums the pieces' stats (same keys as a request's `speculation`).
    """
    text: str
    document: str
    region: tuple[int, int]
    finish_reason: str
    warnings: list[str]
    pieces: list[PieceResult]
    speculation: dict
    lines_kept: float = 1.0  # `lines_kept(source region, text)`

    @property
    def diverged(self) -> bool:
        """Cut short (a loop or the length bound) and keeping under a quarter of the source's
        lines: the model answered with something other than a rewrite. `lookahead rewrite`
        then writes no file unless told to."""
        return self.finish_reason in ("loop", "length") and self.lines_kept < DIVERGED_LINES_KEPT

    def to_dict(self) -> dict:
        return {"text": self.text, "region": list(self.region), "finish_reason": self.finish_reason,
                "warnings": list(self.warnings), "pieces": [vars(p) for p in self.pieces],
                "speculation": self.speculation, "lines_kept": self.lines_kept, "diverged": self.diverged}


def merge_speculation(stats: Sequence[dict]) -> dict:
    """Sum the `speculation` dicts of several requests into one of the same shape."""
    from .stats import SpeculationStats

    return SpeculationStats.merge(SpeculationStats.from_dict(s) for s in stats if s).to_dict()


# ---- the rewrite ---------------------------------------------------------------------------
class Rewrite:
    """A rewrite in progress: iterate it for the new text (str pieces, in order).

    `plan` lists the pieces as (start, end) offsets into the text; `piece` is the index of
    the piece being rewritten now (-1 before the first); `on_piece(index, count, span)`, if
    given, is called as each piece starts. After the loop, `result` holds the EditResult.
    Stopping early (break, an exception, Ctrl-C) closes the model request; `result` stays
    None.
    """

    def __init__(self, fast: Any, text: str, instruction: str, region: tuple[int, int],
                 filename: str | None, plan: list[tuple[int, int]], max_tokens: int | None,
                 growth: float, sampling: dict,
                 on_piece: Callable[[int, int, tuple[int, int]], None] | None):
        self.fast = fast
        self.source = text
        self.instruction = instruction
        self.region = region
        self.filename = filename
        self.plan = plan
        self.max_tokens = max_tokens
        self.growth = growth
        self.sampling = sampling
        self.on_piece = on_piece
        self.piece = -1
        self.result: EditResult | None = None
        self._gen = self._run()

    def __iter__(self) -> "Rewrite":
        return self

    def __next__(self) -> str:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()

    def _run(self) -> Iterator[str]:
        pieces: list[PieceResult] = []
        warnings: list[str] = []
        budget_left = self.max_tokens
        many = len(self.plan) > 1
        for i, (start, end) in enumerate(self.plan):
            self.piece = i
            if self.on_piece is not None:
                self.on_piece(i, len(self.plan), (start, end))
            where = f"piece {i + 1}/{len(self.plan)} (characters {start}-{end})" if many else "the rewrite"
            src = self.source[start:end]
            lead, core, trail = _edges(src)
            if not core.strip() or (budget_left is not None and budget_left <= 0):
                if core.strip():  # out of the caller's max_tokens: what is left stays as it was
                    warnings.append(f"{where}: max_tokens used up; kept the original text")
                pieces.append(PieceResult(start, end, 0, 0, src, "stop" if not core.strip() else "length"))
                yield src
                continue
            n_src = self.fast.count_tokens(core)
            limit = output_bound(n_src, self.growth)
            if budget_left is not None:
                limit = min(limit, budget_left)
            result = PieceResult(start, end, n_src, limit)
            pieces.append(result)
            messages = build_rewrite_messages(core, self.instruction, self.filename)
            cleaner = AnswerCleaner(core, echo_lines=_instruction_lines(messages, core))
            emitted: list[str] = []
            t0 = time.perf_counter()
            # the source is the answer's prediction: a reference whose drafted / accepted tokens
            # the stats count apart (`prediction_drafted`, `prediction_accepted`)
            chunks = self.fast.create_chat_completion(messages, prediction=core, stream=True, max_tokens=limit,
                                                      **self.sampling)
            finish = None
            try:
                for chunk in chunks:
                    choice = chunk["choices"][0]
                    delta = (choice.get("delta") or {}).get("content") or ""
                    if delta and result.first_text_ms is None:
                        result.first_text_ms = 1000 * (time.perf_counter() - t0)
                    finish = choice.get("finish_reason") or finish
                    if chunk.get("speculation"):
                        result.speculation = chunk["speculation"]
                    out = cleaner.feed(delta)
                    if out:
                        out = (lead if not emitted else "") + out
                        emitted.append(out)
                        yield out
                    if cleaner.stopped:
                        break
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
            if cleaner.stopped and not result.speculation:  # closed early: the stream's stats so far
                result.speculation = getattr(chunks, "speculation", None) or {}
            out = cleaner.finish()
            if out:
                out = (lead if not emitted else "") + out
                emitted.append(out)
                yield out
            if budget_left is not None:
                budget_left -= int(result.speculation.get("generated_tokens", 0))
            cut_short = cleaner.stopped == "loop" or (cleaner.stopped is None and finish != "stop")
            rest = ""
            if cut_short and emitted:
                # go on with the source where the rewrite stopped, so that no part of the text is
                # lost (not when no line of the rewrite matched the source: nothing to go on from)
                at = resume_offset(core, cleaner.text)
                rest = core[at:].lstrip("\n") if at > 0 else ""
                if len(cleaner.text) + len(rest) > self.growth * len(core) + 200:
                    rest = ""  # the rewrite and the rest together would outgrow the bound
                if rest:
                    skipped = len(core[at:]) - len(rest)  # blank lines before the rest
                    rest_line = self.source[: start + len(lead) + at + skipped].count("\n") + 1
                    gap = "\n" * (1 + skipped)
                    yield gap + rest
                    emitted.append(gap + rest)
            if cleaner.stopped == "loop":
                result.finish_reason = "loop"
                block = " / ".join(l.strip() for l in cleaner.loop_block if l.strip())[:120]
                warnings.append(f"{where}: stopped a loop of repeated lines ({block!r}) and cut the repeats"
                                + (f"; from line {rest_line} on, the original text is kept" if rest else ""))
            elif cleaner.stopped in ("fence", "echo") or finish == "stop":
                result.finish_reason = "stop"
            else:
                result.finish_reason = "length"
                warnings.append(f"{where}: the output reached its bound of {limit} tokens (source {n_src} tokens)"
                                + (f"; from line {rest_line} on, the original text is kept" if rest else ""))
            if not emitted:
                result.finish_reason = "empty"
                warnings.append(f"{where}: the model returned no text; kept the original")
                yield src
                emitted.append(src)
            elif trail:
                yield trail
                emitted.append(trail)
            result.text = "".join(emitted)
        text = "".join(p.text for p in pieces)
        reasons = {p.finish_reason for p in pieces}
        finish = "loop" if "loop" in reasons else "length" if "length" in reasons else "stop"
        s, e = self.region
        self.result = EditResult(text=text, document=self.source[:s] + text + self.source[e:], region=self.region,
                                 finish_reason=finish, warnings=warnings, pieces=pieces,
                                 speculation=merge_speculation([p.speculation for p in pieces]),
                                 lines_kept=lines_kept(self.source[s:e], text))


def rewrite(fast: Any, text: str, instruction: str, *, region: tuple[int, int] | None = None,
            filename: str | None = None, stream: bool = True, max_tokens: int | None = None,
            growth: float = DEFAULT_GROWTH, piece_tokens: int | None = None,
            on_piece: Callable[[int, int, tuple[int, int]], None] | None = None,
            temperature: float = 0.0, **sampling: Any) -> Rewrite | EditResult:
    """Rewrite `text` (or `text[region[0]:region[1]]`) following `instruction`.

    fast: a `lookahead.Lookahead` (`lookahead.load()` / `lookahead.wrap(llm)`).
    region: (start, end) character offsets of the part to rewrite; the rest is not sent.
    filename: used to tell code from prose (the prompt's wording, where pieces are cut).
    stream: True returns a `Rewrite` to iterate for str pieces (then `.result`); False runs it
        and returns the `EditResult`.
    max_tokens: most tokens to generate over the whole rewrite (default: no total limit; each
        request is bounded by `growth` x its source tokens + 32 either way).
    growth: most output tokens per source token in one request.
    piece_tokens: largest piece in source tokens (default: what fits the context with its
        bounded output).
    on_piece: called as (index, count, (start, end)) when each piece starts.
    temperature and other keyword arguments: sampling arguments of `create_chat_completion`
        (top_k, top_p, min_p, repeat_penalty, seed, stop, speculate, ...). Default greedy.
        `references`: more texts to draft from (other open buffers), for every request.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError(f"the instruction is empty: {instruction!r}")
    if region is None:
        region = (0, len(text))
    try:
        start, end = (int(region[0]), int(region[1]))
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"region must be (start, end) character offsets, got {region!r}") from None
    if not 0 <= start <= end <= len(text):
        raise ValueError(f"region {region!r} is outside the text: need 0 <= start <= end <= {len(text)}")
    if not growth > 0:
        raise ValueError(f"growth must be > 0, got {growth!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens!r}")
    for reserved in ("messages", "prediction", "stream"):
        if reserved in sampling:
            raise ValueError(f"{reserved!r} is set by rewrite itself; do not pass it")

    overhead = sum(fast.count_tokens(m["content"]) for m in build_rewrite_messages("", instruction, filename))
    overhead += TEMPLATE_SLACK_TOKENS
    fits = piece_budget(fast.n_ctx, overhead, growth)
    if fits < MIN_PIECE_TOKENS:
        raise ValueError(f"a context of {fast.n_ctx} tokens leaves {fits} tokens per piece for this "
                         f"instruction ({overhead} tokens of prompt around the text); use a larger n_ctx")
    if piece_tokens is not None:
        if piece_tokens < 1:
            raise ValueError(f"piece_tokens must be >= 1, got {piece_tokens!r}")
        fits = min(fits, piece_tokens)
    spans = split_text(text[start:end], fits, fast.count_tokens, code=is_code(filename))
    plan = [(start + s, start + e) for s, e in spans]
    rw = Rewrite(fast, text, instruction, (start, end), filename, plan, max_tokens, growth,
                 dict(sampling, temperature=temperature), on_piece)
    if stream:
        return rw
    for _ in rw:
        pass
    return rw.result
