"""Tree drafts: where a match's occurrences continue differently, a draft of several branches
verified in one decode (a backend with sequence ids), sized by the cost curve like a chain."""
from __future__ import annotations

import heapq
import itertools
from typing import Callable

import numpy as np

from ..index import CONTEXT, Branch, Match, SuffixIndex
from .acceptance import AcceptanceModel
from .draft import EMPTY_DRAFT, Draft
from .priors import CONTEXT_KIND, REFERENCE_KIND


def propose_tree(index: SuffixIndex, match: Match, limit: int, acceptance: AcceptanceModel, curve: np.ndarray,
                 tree_width: int, min_gain: float, is_stop: Callable[[int], bool] | None = None) -> Draft:
    """Best-first tree over the occurrences' continuations, sized by the cost curve.

    A node's probability of being reached is the product, along its path, of the
    acceptance estimate for its match length times the share of its parent's occurrences
    that continue with it. Nodes are added in decreasing probability (a parent always
    before its children), never more than `tree_width` leaves; the prefix of that order
    with the best E / t(n + 1) is the draft, if it beats a plain decode by `min_gain`.
    Nothing follows a token for which `is_stop` is true.
    """
    roots = index.continuation_trie(match, limit, cyclic=True)
    if not roots:
        return EMPTY_DRAFT
    kind = CONTEXT_KIND if match.positions[0][0] == CONTEXT else REFERENCE_KIND
    rates = acceptance.rates(kind, match.length + np.arange(limit))  # by depth - 1
    limit = min(limit, len(curve) - 2)
    # Frontier: (-reach, push order, depth, parent's place in the draft, branch). Siblings
    # are pushed in the trie's order (count, then preference), so equal reaches go to it.
    heap: list[tuple[float, int, int, int, Branch]] = []
    order = itertools.count()

    def push(children: list[Branch], parent: int, parent_reach: float, depth: int) -> None:
        parent_count = sum(b.count for b in children) if parent < 0 else draft_counts[parent]
        for br in children:
            reach = parent_reach * rates[depth - 1] * br.count / parent_count
            heapq.heappush(heap, (-reach, next(order), depth, parent, br))

    tokens: list[int] = []
    parents: list[int] = []
    draft_counts: list[int] = []
    has_child: set[int] = set()
    leaves = 0
    expected = 1.0
    best_rate, best_n, best_expected = 1.0 / curve[1], 0, 1.0
    push(roots, -1, 1.0, 1)
    while heap and len(tokens) < limit:
        neg_reach, _, depth, parent, br = heapq.heappop(heap)
        new_leaf = parent < 0 or parent in has_child  # else it extends its parent's branch
        if new_leaf and leaves >= tree_width:
            continue
        leaves += int(new_leaf)
        has_child.add(parent)
        tokens.append(br.token)
        parents.append(parent)
        draft_counts.append(br.count)
        expected += -neg_reach
        rate = expected / curve[len(tokens) + 1]
        if rate > best_rate:
            best_rate, best_n, best_expected = rate, len(tokens), expected
        if is_stop is None or not is_stop(br.token):  # nothing follows a stop token
            push(br.children, len(tokens) - 1, -neg_reach, depth + 1)
    if best_n == 0 or best_rate < min_gain / curve[1]:
        return EMPTY_DRAFT
    chosen_parents = tuple(parents[:best_n])
    if all(p == i - 1 for i, p in enumerate(chosen_parents)):
        chosen_parents = None  # a chain: verified and rolled back like a linear draft
    return Draft(tokens[:best_n], match.length, kind == REFERENCE_KIND, best_expected, chosen_parents, kind,
                 source=match.positions[0][0])
