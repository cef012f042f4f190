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
part of the text is lost. So does an answer that ended by itself after copying the source
up to some line, with two or more source lines left (a small model's habit of stopping
right after the part it changed), and an answer that left out the source's first lines
(a module docstring) gets them back in front; both add a warning. A request that returns
no text keeps the original. A text longer
than the context is rewritten in pieces cut at natural boundaries (Markdown headings,
blank-line paragraphs, top-level definitions in code; lines, then spaces, only when a single
block is too long), each piece with its own source as the reference, streamed in order.

The prompt puts the document first and the instruction after it, so two edits of the same
document with different instructions share the document's tokens as a prompt prefix and the
second request reuses their KV cache (`speculation["reused_prompt_tokens"]`). The answer to a
code file's rewrite starts with its code fence (`answer_prefix()`, sent as
`create_chat_completion`'s `answer_prefix`), so the model answers with the file, not a sentence.

The package is pure text logic plus calls to the wrapper (`fast.create_chat_completion`,
`fast.count_tokens`, `fast.n_ctx`); it imports no backend. Its modules, each one job:

    prompt.py   the chat turns a rewrite sends, how its answer starts, which files are code
    clean.py    the answer cleaned as it streams (chatter, fences, an echoed instruction)
    loops.py    loop detection: lines repeated back to back more often than in the source
    split.py    where a text is cut into pieces, where a rewrite cut short resumes, what it skipped
    result.py   PieceResult, EditResult, lines_kept, the pieces' stats merged
    run.py      `rewrite` and `Rewrite`: the pieces run one request each, streamed in order
"""
from __future__ import annotations

from .clean import AnswerCleaner, is_chatter, is_fence
from .loops import LOOP_MAX_PERIOD, copies_allowed, count_consecutive, find_loop, tail_repeats
from .prompt import CODE_SUFFIXES, answer_prefix, build_rewrite_messages, instruction_lines, is_code
from .result import DIVERGED_LINES_KEPT, EditResult, PieceResult, lines_kept, merge_speculation
from .run import MIN_PIECE_TOKENS, TEMPLATE_SLACK_TOKENS, Rewrite, rewrite
from .split import (DEFAULT_GROWTH, OUTPUT_SLACK_TOKENS, ended_offset, output_bound, piece_budget,
                    resume_offset, skipped_head, split_text)

__all__ = [
    "AnswerCleaner", "CODE_SUFFIXES", "DEFAULT_GROWTH", "DIVERGED_LINES_KEPT", "EditResult", "LOOP_MAX_PERIOD",
    "MIN_PIECE_TOKENS", "OUTPUT_SLACK_TOKENS", "PieceResult", "Rewrite", "TEMPLATE_SLACK_TOKENS",
    "answer_prefix", "build_rewrite_messages", "copies_allowed", "count_consecutive", "find_loop", "instruction_lines",
    "is_chatter", "is_code", "is_fence", "lines_kept", "merge_speculation", "output_bound", "piece_budget",
    "resume_offset", "rewrite", "skipped_head", "ended_offset", "split_text", "tail_repeats",
]
