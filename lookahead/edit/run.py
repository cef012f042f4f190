"""The rewrite itself: plan the pieces, run one request per piece, stream its cleaned text, sum up."""
from __future__ import annotations

import re
import time
from typing import Any, Callable, Generator, Iterator

from .clean import AnswerCleaner
from .prompt import answer_prefix, build_rewrite_messages, instruction_lines, is_code
from .result import EditResult, PieceResult, lines_kept, merge_speculation
from .split import (DEFAULT_GROWTH, ended_offset, output_bound, piece_budget, resume_offset, skipped_head,
                    split_text)

TEMPLATE_SLACK_TOKENS = 64  # chat-template tokens around the turns (roles, default system prompt)
MIN_PIECE_TOKENS = 16
TAIL_MIN_LINES = 2  # source lines left after an answer that ended early, to keep them
TAIL_MIN_LINES_REPLACED = 4  # the same when the answer ended in lines of its own
HEAD_LOOK_LINES = 3  # answer lines looked at to tell whether it skipped the source's first lines

OnPiece = Callable[[int, int, tuple[int, int]], None]


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
                 growth: float, sampling: dict, on_piece: OnPiece | None):
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
        """Each piece of the plan in turn, then the result."""
        pieces: list[PieceResult] = []
        warnings: list[str] = []
        budget_left = self.max_tokens  # of the caller's max_tokens, over the whole rewrite
        count = len(self.plan)
        for i, (start, end) in enumerate(self.plan):
            self.piece = i
            if self.on_piece is not None:
                self.on_piece(i, count, (start, end))
            where = f"piece {i + 1}/{count} (characters {start}-{end})" if count > 1 else "the rewrite"
            piece = yield from self._piece(where, start, end, budget_left, warnings)
            pieces.append(piece)
            if budget_left is not None:
                budget_left -= int(piece.speculation.get("generated_tokens", 0))
        self.result = self._result(pieces, warnings)

    def _piece(self, where: str, start: int, end: int, budget_left: int | None,
               warnings: list[str]) -> Generator[str, None, PieceResult]:
        """One piece: its new text, streamed; returns how it went (and adds its warnings)."""
        src = self.source[start:end]
        lead, core, trail = _edges(src)
        if not core.strip():  # blank: nothing to rewrite
            yield src
            return PieceResult(start, end, 0, 0, src, "stop")
        if budget_left is not None and budget_left <= 0:  # what is left stays as it was
            warnings.append(f"{where}: max_tokens used up; kept the original text")
            yield src
            return PieceResult(start, end, 0, 0, src, "length")
        n_src = self.fast.count_tokens(core)
        limit = output_bound(n_src, self.growth)
        if budget_left is not None:
            limit = min(limit, budget_left)
        result = PieceResult(start, end, n_src, limit)
        emitted: list[str] = []
        cleaner, finish, head = yield from self._answer(core, lead, result, emitted, warnings, where)
        cut_short = cleaner.stopped == "loop" or (cleaner.stopped is None and finish != "stop")
        rest, rest_line = "", None
        if emitted:
            rest, rest_line = self._rest_of_source(start, lead, core, head + cleaner.text, ended=not cut_short)
        if rest:
            yield rest
            emitted.append(rest)
        result.finish_reason, warning = _ending(cleaner, finish, result, rest_line,
                                                ended_early=bool(rest) and not cut_short)
        if warning:
            warnings.append(f"{where}: {warning}")
        if not emitted:
            result.finish_reason = "empty"
            warnings.append(f"{where}: the model returned no text; kept the original")
            yield src
            emitted.append(src)
        elif trail:
            yield trail
            emitted.append(trail)
        result.text = "".join(emitted)
        return result

    def _answer(self, core: str, lead: str, result: PieceResult, emitted: list[str],
                warnings: list[str], where: str) -> Generator[str, None, tuple[AnswerCleaner, str | None, str]]:
        """The model's answer for one piece, cleaned as it streams (the piece's leading blank
        lines before the first text, and the source's first lines if the answer skipped
        them); adds it to `emitted` and the stats to `result`. Returns the cleaner and the
        request's finish reason, and the source lines put back in front."""
        messages = build_rewrite_messages(core, self.instruction, self.filename)
        prefix = answer_prefix(core, self.filename)
        cleaner = AnswerCleaner(core, echo_lines=instruction_lines(messages, core), opened=bool(prefix))
        head = _HeadCheck(core)
        t0 = time.perf_counter()
        # the source is the answer's prediction: a reference whose drafted / accepted tokens
        # the stats count apart (`prediction_drafted`, `prediction_accepted`)
        extra = {"answer_prefix": prefix} if prefix else {}  # the fence the cleaner was told is open
        chunks = self.fast.create_chat_completion(messages, prediction=core, stream=True,
                                                  max_tokens=result.max_tokens, **extra, **self.sampling)
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
                out = head.feed(cleaner.feed(delta))
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
        out = head.feed(cleaner.finish()) + head.finish()
        if out:
            out = (lead if not emitted else "") + out
            emitted.append(out)
            yield out
        if head.kept_lines:
            line = self.source[: result.start + len(lead)].count("\n") + 1
            last = line + head.kept_lines - 1
            warnings.append(f"{where}: the answer left out the text's first lines; lines {line}-{last} "
                            f"of the original are kept")
        return cleaner, finish, head.kept

    def _rest_of_source(self, start: int, lead: str, core: str, kept: str,
                        ended: bool = False) -> tuple[str, int | None]:
        """The source after where a rewrite stopped, so that no part of the text is lost:
        (the text to add, with the newlines before it; its first line in the whole text), or
        ("", None) when no line of the rewrite matched the source (nothing to go on from) or
        the rewrite and the rest together would outgrow the bound.

        `ended`: the answer ended by itself rather than being cut short. Small models often
        stop right after the part they changed ("the bug is in chunked": the file up to
        chunked's fix, then the closing fence); `ended_offset` says where the untouched rest
        starts, and it is kept when it has at least `TAIL_MIN_LINES` non-blank lines
        (`TAIL_MIN_LINES_REPLACED` when the answer ended in lines of its own), so that a
        last paragraph the instruction rewrote is not mistaken for a missing one.
        """
        if ended:
            at, replaced = ended_offset(core, kept, code=is_code(self.filename))
            rest = core[at:].lstrip("\n") if at > 0 else ""
            need = TAIL_MIN_LINES_REPLACED if replaced else TAIL_MIN_LINES
            if sum(1 for l in rest.split("\n") if l.strip()) < need:
                return "", None
        else:
            at = resume_offset(core, kept)
            rest = core[at:].lstrip("\n") if at > 0 else ""
        if not rest or len(kept) + len(rest) > self.growth * len(core) + 200:
            return "", None
        skipped = len(core[at:]) - len(rest)  # blank lines before the rest
        line = self.source[: start + len(lead) + at + skipped].count("\n") + 1
        return "\n" * (1 + skipped) + rest, line

    def _result(self, pieces: list[PieceResult], warnings: list[str]) -> EditResult:
        text = "".join(p.text for p in pieces)
        reasons = {p.finish_reason for p in pieces}
        finish = "loop" if "loop" in reasons else "length" if "length" in reasons else "stop"
        s, e = self.region
        return EditResult(text=text, document=self.source[:s] + text + self.source[e:], region=self.region,
                          finish_reason=finish, warnings=warnings, pieces=pieces,
                          speculation=merge_speculation([p.speculation for p in pieces]),
                          lines_kept=lines_kept(self.source[s:e], text),
                          length_ratio=len(text) / max(1, e - s))


def _ending(cleaner: AnswerCleaner, finish: str | None, piece: PieceResult,
            rest_line: int | None, ended_early: bool = False) -> tuple[str, str | None]:
    """How a piece's request ended ("loop", "stop" or "length") and what to warn of, if anything."""
    kept = f"; from line {rest_line} on, the original text is kept" if rest_line is not None else ""
    if ended_early:  # the answer ended by itself, and the source's rest was kept
        return "stop", f"the answer ended before the end of the text{kept}"
    if cleaner.stopped == "loop":
        block = " / ".join(l.strip() for l in cleaner.loop_block if l.strip())[:120]
        return "loop", f"stopped a loop of repeated lines ({block!r}) and cut the repeats{kept}"
    if cleaner.stopped in ("fence", "echo") or finish == "stop":
        return "stop", None
    return "length", (f"the output reached its bound of {piece.max_tokens} tokens "
                      f"(source {piece.source_tokens} tokens){kept}")


class _HeadCheck:
    """Holds an answer's first lines until it is known whether they skipped the source's
    first lines (`skipped_head`); if so, puts those back in front. feed(text) -> text to
    release; finish() -> the rest; `kept_lines`: source lines put back (0: none)."""

    def __init__(self, source: str, look: int = HEAD_LOOK_LINES):
        self.source = source
        self.look = look
        self.held: str | None = ""  # None once released
        self.kept = ""  # the source lines put back
        self.kept_lines = 0

    def feed(self, text: str) -> str:
        if self.held is None:
            return text
        self.held += text
        complete = self.held[: self.held.rfind("\n") + 1]
        if sum(1 for l in complete.split("\n") if l.strip()) >= self.look:
            return self.finish()
        return ""

    def finish(self) -> str:
        if self.held is None:
            return ""
        held, self.held = self.held, None
        at = skipped_head(self.source, held, look=self.look) if held.strip() else 0
        self.kept = self.source[:at]
        self.kept_lines = self.kept.count("\n")
        return self.kept + held


def _edges(piece: str) -> tuple[str, str, str]:
    """(leading blank lines, core, trailing whitespace) of a piece of source text."""
    core_end = len(piece.rstrip())
    trail = piece[core_end:]
    body = piece[:core_end]
    m = re.match(r"(?:[ \t]*\n)*", body)
    lead = m.group(0) if m else ""
    return lead, body[len(lead):], trail


def rewrite(fast: Any, text: str, instruction: str, *, region: tuple[int, int] | None = None,
            filename: str | None = None, stream: bool = True, max_tokens: int | None = None,
            growth: float = DEFAULT_GROWTH, piece_tokens: int | None = None, on_piece: OnPiece | None = None,
            temperature: float = 0.0, **sampling: Any) -> Rewrite | EditResult:
    """Rewrite `text` (or `text[region[0]:region[1]]`) following `instruction`.

    fast: a `lookahead.Lookahead` (`lookahead.load()` / `lookahead.wrap(llm)`).
    region: (start, end) character offsets of the part to rewrite; the rest is not sent.
    filename: used to tell code from prose (the prompt's wording, where pieces are cut, and a
        code file's answer opening with its code fence).
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
    start, end = _checked_region(text, instruction, region, growth, max_tokens, sampling)
    plan = _plan(fast, text, start, end, instruction, filename, growth, piece_tokens)
    rw = Rewrite(fast, text, instruction, (start, end), filename, plan, max_tokens, growth,
                 dict(sampling, temperature=temperature), on_piece)
    if stream:
        return rw
    for _ in rw:
        pass
    return rw.result


def _checked_region(text: Any, instruction: Any, region: Any, growth: float, max_tokens: int | None,
                    sampling: dict) -> tuple[int, int]:
    """The region as (start, end) once the arguments are checked; a ValueError names a bad one."""
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
    for reserved in ("messages", "prediction", "stream", "answer_prefix"):
        if reserved in sampling:
            raise ValueError(f"{reserved!r} is set by rewrite itself; do not pass it")
    return start, end


def _plan(fast: Any, text: str, start: int, end: int, instruction: str, filename: str | None, growth: float,
          piece_tokens: int | None) -> list[tuple[int, int]]:
    """The pieces of text[start:end], as offsets into text: each fits the context with its
    prompt and its bounded output (and `piece_tokens`, if given)."""
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
    return [(start + s, start + e) for s, e in spans]
