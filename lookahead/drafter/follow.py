"""Reading a candidate from a match: follow the most frequent continuation of its occurrences,
token by token, and say how many of them agree on each token."""
from __future__ import annotations

import numpy as np

from ..index import Match, SuffixIndex


def _follow_majority(index: SuffixIndex, match: Match, depth: int,
                     context_end: int | None = None) -> tuple[list[int], np.ndarray]:
    """Follow the most frequent continuation of the match's occurrences, token by token.

    Returns the tokens and, for each, the fraction of the occurrences still followed that
    agree on it (1.0 where they all agree). An even split goes to the occurrence of best
    `index.tie_rank` (the output so far, then references, then the prompt), and among those
    to the preferred (most recent) one.
    `context_end`: as the index was when it held that many context tokens (the match's time).
    """
    if depth == 1 and len(match.positions) > 1:  # one token (the step after a plain decode): count
        counts: dict[int, int] = {}
        firsts: list[tuple[int, tuple[int, int]]] = []  # (token, occurrence), in preference order
        for pos in match.positions:
            first = index.continuation(pos, 1, cyclic=True, context_end=context_end)
            if len(first):
                token = int(first[0])
                counts[token] = counts.get(token, 0) + 1
                firsts.append((token, pos))
        if not counts:
            return [], np.ones(0)
        top = max(counts.values())
        tied = [(t, pos) for t, pos in firsts if counts[t] == top]
        token = min(tied, key=lambda tp: index.tie_rank(tp[1]))[0] if len(tied) > 1 else tied[0][0]
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
        values, counts = np.unique(col[present], return_counts=True)
        best = values[counts == counts.max()]
        if len(best) == 1:
            token = int(best[0])
        else:  # an even split: the best-ranked occurrence among the tied, the most preferred of those
            tied = np.flatnonzero(present & np.isin(col, best))  # in preference order
            token = int(col[min(tied, key=lambda i: index.tie_rank(match.positions[alive[i]]))])
        tokens.append(token)
        agreement.append(float(counts[values == token][0]) / int(present.sum()))
        alive = alive[col == token]
        d += 1
    return tokens, np.array(agreement)
