"""What a rewrite returns: each piece's result, the whole result, and how much of the source it kept."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Sequence

from ..stats import SpeculationStats

DIVERGED_LINES_KEPT = 0.25  # see EditResult.diverged
DIVERGED_LENGTH = 0.5


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
    length_ratio: float = 1.0  # characters of `text` per character of the source region

    @property
    def diverged(self) -> bool:
        """Keeping under a quarter of the source's lines, and either cut short (a loop or the
        length bound) or under half the source's length: the model answered with something
        other than a rewrite (a loop, an explanation). A translation, which keeps no line
        but keeps the length, is not. `lookahead rewrite` then writes no file unless told to."""
        if self.lines_kept >= DIVERGED_LINES_KEPT:
            return False
        return self.finish_reason in ("loop", "length") or self.length_ratio < DIVERGED_LENGTH

    def to_dict(self) -> dict:
        return {"text": self.text, "region": list(self.region), "finish_reason": self.finish_reason,
                "warnings": list(self.warnings), "pieces": [vars(p) for p in self.pieces],
                "speculation": self.speculation, "lines_kept": self.lines_kept, "length_ratio": self.length_ratio,
                "diverged": self.diverged}


def lines_kept(source: str, output: str) -> float:
    """Share of the source's non-blank lines found verbatim, in order, in the output (0..1).

    A rough measure of how much of the text a rewrite kept: a typo fix keeps most lines, a
    model that answered with something else keeps none.
    """
    src = [line.rstrip() for line in source.splitlines() if line.strip()]
    out = [line.rstrip() for line in output.splitlines() if line.strip()]
    if not src:
        return 1.0
    matcher = difflib.SequenceMatcher(None, src, out, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / len(src)


def merge_speculation(stats: Sequence[dict]) -> dict:
    """Sum the `speculation` dicts of several requests into one of the same shape."""
    return SpeculationStats.merge(SpeculationStats.from_dict(s) for s in stats if s).to_dict()
