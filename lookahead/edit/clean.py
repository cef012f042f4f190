"""Cleaning a model's answer as it streams: chatter and fences around it, an echoed instruction, loops."""
from __future__ import annotations

import re
from typing import Sequence

from .loops import LOOP_MAX_PERIOD, find_loop, norm_line, tail_repeats

_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w.+#-]*)\s*$")
_CHATTER_START = re.compile(
    r"^(?:sure|certainly|of course|okay|ok|absolutely|great)\b"
    r"|^(?:here(?:'s| is| are)|below is|this is|i have|i've)\b"
    r"|^(?:the |your |a )?(?:revised|corrected|updated|rewritten|edited|fixed|improved|modified|new)\s+"
    r"(?:document|text|file|version|code|readme|content|markdown)\b",
    re.IGNORECASE)
_CHATTER_WORDS = re.compile(r"revised|corrected|updated|rewritten|edited|fixed|improved|modified|changes",
                            re.IGNORECASE)


_RULE = re.compile(r"^\s*([-*_])(?:\s*\1){2,}\s*$")
_SIGNOFF = re.compile(
    r"^(?:this (?:should|now|version|revised|corrected|updated)\b|i (?:have|hope|made|fixed|corrected)\b|i've\b"
    r"|all (?:the )?(?:\w+ )?(?:mistakes|errors|typos|changes)\b|let me know\b|hope this\b"
    r"|(?:the )?(?:spelling )?(?:mistakes|errors|typos) (?:have|are)\b|(?:note|changes made)\s*:)",
    re.IGNORECASE)
SIGNOFF_LINES = 2  # most sign-off lines after the document (after a rule, if any)


def is_rule(line: str) -> bool:
    """A Markdown horizontal rule: ---, ***, ___ (spaces between allowed)."""
    return bool(_RULE.match(line))


def is_signoff(line: str) -> bool:
    """A line a model puts after its answer: "This should now be free of spelling mistakes."."""
    core = line.strip().strip("*_#> ").strip()
    return bool(core) and len(core) <= 200 and bool(_SIGNOFF.match(core))


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


class AnswerCleaner:
    """Cleans a model's answer as it streams; releases only text that will not be taken back.

    feed(delta) -> text safe to show; finish() -> the rest. It drops leading chatter lines and
    an opening fence (unless the source itself starts that way), stops at the fence that
    closes it (`stopped` = "fence") or at a line of the prompt's instruction repeated
    (`echo_lines`; `stopped` = "echo"), stops a loop of repeated lines (`stopped` = "loop", the
    repeats cut, `loop_block` the repeated lines), drops a sign-off after the document (a
    horizontal rule and/or a line or two like "This should now be free of spelling
    mistakes.", none of them in the source), and strips leading and trailing blank lines
    (the caller puts the source's own back). Lines that might be the start of a repeat or
    of a sign-off are held until they are known not to be; a line the source does not
    start is shown once it is complete.

    `opened`: the answer is already inside a fence (the prompt ended with the opening one):
    one more opening fence with a language name among its first lines is dropped as a
    repeat of it, and a bare fence closes the answer.
    """

    def __init__(self, source: str, echo_lines: Sequence[str] = (), max_period: int = LOOP_MAX_PERIOD,
                 opened: bool = False):
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
        self._fenced = opened  # the answer opened a fence around the whole document
        self._reopen = opened  # a "```lang" line at the head would repeat the prompt's fence
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
            if self._reopen and is_fence(line) and _FENCE.match(line).group(2):
                self._reopen = False
                self.dropped.append(line)
                return ""
            if ((is_chatter(line) or is_rule(line)) and line.strip() != self._source_first) or (
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
            self._drop_signoff()
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
                self._drop_signoff()
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
        signoff = self._signoff_start()
        if signoff is not None:
            hold = max(hold, len(self.lines) - signoff)
        return self._release_lines(len(self.lines) - hold)

    def _drop_signoff(self) -> None:
        signoff = self._signoff_start()
        if signoff is not None:
            self.dropped.extend(self.lines[signoff:])
            del self.lines[signoff:]

    def _signoff_start(self) -> int | None:
        """Where a sign-off at the end of the lines so far starts (None: there is none): a
        rule and/or up to SIGNOFF_LINES sign-off lines, none of them in the source, after the
        last line that is neither."""
        start, signoffs = None, 0
        for i in range(len(self.lines) - 1, self._released - 1, -1):
            line = self.lines[i]
            if not line.strip():
                continue
            if line.strip() in self._source_set:
                break
            if is_rule(line):
                start = i
                break  # a rule opens the sign-off
            if not is_signoff(line) or signoffs == SIGNOFF_LINES:
                break
            signoffs += 1
            start = i
        return start

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
        if not any(src.startswith(part) for src in self.source_lines):
            return ""  # a new line (an edit, maybe a sign-off): shown once complete
        stripped = norm_line(part)
        n = len(self.lines)
        for p in range(1, min(self.max_period, n) + 1):
            if norm_line(self.lines[n - p]).startswith(stripped):
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
            self._drop_signoff()
            out.append(self._release_lines(len(self.lines)))
        return "".join(out)

    @property
    def text(self) -> str:
        """The cleaned answer so far (lines kept), without leading/trailing blank lines."""
        return "\n".join(self.lines).strip("\n")
