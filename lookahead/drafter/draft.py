"""What the drafter hands out and weighs: a Draft (the tokens to verify next, a chain or a
tree, and the evidence behind them) and a Candidate (a continuation it may draft from)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..index import CONTEXT
from .priors import CONTEXT_KIND, REFERENCE_KIND


@dataclass(frozen=True)
class Draft:
    """What the drafter proposes for one step: a chain (or a tree) of tokens and the evidence
    behind it."""

    tokens: list[int]
    match_length: int
    from_reference: bool
    expected_tokens: float  # E(k): expected tokens emitted by the pass, bonus included
    # A tree: parents[j] is the node that token j follows (-1: the last emitted token), in
    # topological order. None: a chain (token j follows token j - 1).
    parents: tuple[int, ...] | None = None
    kind: int = -1  # CONTEXT_KIND, REFERENCE_KIND or REJOIN_KIND; -1: from from_reference
    source: int = CONTEXT  # index source of the preferred occurrence (stats per reference)
    # The index sources that hold the drafted tokens (`SuffixIndex.sources_containing`): a
    # prediction repeated in the prompt backs a copy as much as the prompt does. For the
    # stats only; empty: `source` alone.
    sources: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind < 0:
            object.__setattr__(self, "kind", REFERENCE_KIND if self.from_reference else CONTEXT_KIND)

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft([], 0, False, 1.0)


@dataclass(frozen=True)
class Candidate:
    """A continuation the drafter may draft, and the evidence behind it."""

    tokens: list[int]
    agreement: np.ndarray  # [len(tokens)] share of the occurrences that agree on each token
    match_length: int
    kind: int  # CONTEXT_KIND, REFERENCE_KIND or REJOIN_KIND
    source: int = CONTEXT  # index source of the preferred occurrence
    position: int = 0  # where in that source its continuation starts
    substituted: tuple[tuple[int, int, tuple[int, ...]], ...] = ()  # learned substitutions: (start, end, rule)
