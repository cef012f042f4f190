"""Reading a candidate from a match: follow the most frequent continuation of its occurrences,
token by token, and say how many of them agree on each token."""
from __future__ import annotations

import numpy as np

from ..index import Match, SuffixIndex


def _follow_majority(index: SuffixIndex, match: Match, depth: int,
                     context_end: int | None = None) -> tuple[list[int], np.ndarray]:
    """Follow the most frequent continuation of the match's occurrences, token by token.

    Returns the tokens and, for each, the fraction of the occurrences still followed that
    agree on it (1.0 where they all agree). Ties go to the preferred (most recent) occurrence.
    `context_end`: as the index was when it held that many context tokens (the match's time).
    """
    if depth == 1 and len(match.positions) > 1:  # one token (the step after a plain decode): count
        counts: dict[int, int] = {}
        for pos in match.positions:
            first = index.continuation(pos, 1, cyclic=True, context_end=context_end)
            if len(first):
                counts[int(first[0])] = counts.get(int(first[0]), 0) + 1
        if not counts:
            return [], np.ones(0)
        token = max(counts, key=counts.__getitem__)  # the first seen among the most frequent
        return [token], np.array([counts[token] / sum(counts.values())])
    conts = [index.continuation(pos, depth, cyclic=True, context_end=context_end) for pos in match.positions]
    if len(conts) == 1:
        return conts[0].tolist(), np.ones(len(conts[0]))
    width = max(len(c) for c in conts)
    table = np.full((len(conts), width), -1, dtype=np.int64)  # [occurrences, depth], -1 = ended
    for row, c in enumerate(conts):
        table[row, : len(c)] = c
    alive = np.arange(len(conts))
    tokens: list[int] = []
    agreement: list[float] = []
    d = 0
    while d < width and len(alive):
        sub = table[alive, d:]  # [alive, width - d]
        lead = sub[0]
        unanimous = (sub == lead).all(axis=0) & (lead >= 0)
        run = int(np.argmin(unanimous)) if not unanimous.all() else len(unanimous)
        tokens.extend(lead[:run].tolist())
        agreement.extend([1.0] * run)
        d += run
        if d >= width:
            break
        col = table[alive, d]
        present = col >= 0
        if not present.any():
            break
        values, first_seen, counts = np.unique(col[present], return_index=True, return_counts=True)
        best = np.flatnonzero(counts == counts.max())
        choice = best[np.argmin(first_seen[best])]  # tie: the most preferred occurrence
        token = int(values[choice])
        tokens.append(token)
        agreement.append(float(counts[choice]) / int(present.sum()))
        alive = alive[col == token]
        d += 1
    return tokens, np.array(agreement)
