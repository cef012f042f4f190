"""The Drafter: at every step, the draft that pays best, from the suffix index's longest match,
the acceptance estimates and the cost curve; and what it learns from each step's outcome.

The length policy is `best_length`: the k maximising E(k) / t(k + 1) (see the package doc).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..index import CONTEXT, Match, SuffixIndex
from ..sequences import agreeing_prefix
from .acceptance import AcceptanceModel
from .cost import CostModel
from .draft import EMPTY_DRAFT, Candidate, Draft
from .follow import _follow_majority
from .priors import CONTEXT_KIND
from .rejoin import Rejoining
from .tree import propose_tree


@dataclass
class _Pending:
    """The last step's candidate, to be compared with the tokens the target emitted."""

    index: SuffixIndex
    at: int  # context length when it was proposed
    candidate: Candidate | None  # None: not built yet (no draft could pay); built from `match`
    drafted: int  # how many of its tokens were drafted (record() accounts for those)
    match: Match | None = None
    kind: int = CONTEXT_KIND
    last: int = -1  # the context's last token then (whether the candidate starts after a sentence's end)


# A sentence's last token: ., ! or ?, then closing quotes or brackets, then whitespace or nothing.
_SENTENCE_END = re.compile(rb'[.!?]["\')\]*]*\s*$')


def sentence_break(prev: bytes, piece: bytes) -> bool:
    """Whether a token with text `piece` starts a new sentence after one with text `prev`:
    `prev` ends a sentence and whitespace separates them ("ok." then " The"; not "os." then
    "path", nor "8." then "50")."""
    return (bool(_SENTENCE_END.search(prev))
            and (prev[-1:].isspace() or piece[:1].isspace()))


def best_length(confidences: np.ndarray, cost_curve: np.ndarray, min_gain: float = 1.02) -> tuple[int, float]:
    """The draft length k (0..len(confidences)) maximising E(k) / t(k + 1), and E(k).

    `confidences[i]` is the probability that draft token i is accepted given tokens < i were.
    Returns (0, 1.0) unless some k beats a plain decode by the factor `min_gain`.
    """
    k_max = min(len(confidences), len(cost_curve) - 2)
    if k_max <= 0:
        return 0, 1.0
    survive = np.cumprod(confidences[:k_max])  # [k_max] P(first i+1 tokens accepted)
    expected = 1.0 + np.concatenate(([0.0], np.cumsum(survive)))  # [k_max + 1] E(k)
    rate = expected / cost_curve[1 : k_max + 2]  # [k_max + 1]
    k = int(np.argmax(rate))
    if k == 0 or rate[k] < min_gain * rate[0]:
        return 0, 1.0
    return k, float(expected[k])


class Drafter(Rejoining):
    """Proposes a draft from the suffix index, sized by the cost model; learns per request.

    The engine calls `propose` before every target pass and `record` after it, on the same
    index, which it extends with the emitted tokens in between; `reset` starts a new request.
    """

    def __init__(self, cost: CostModel, max_draft: int = 64, min_gain: float = 1.1, sampled: bool = False,
                 tree_width: int = 1, is_stop: Callable[[int], bool] | None = None,
                 piece: Callable[[int], bytes] | None = None):
        """`is_stop(token)`: whether the token ends generation (the target's end-of-generation
        tokens). A draft never goes past one: the tokens after it could not be emitted, and a
        copy of a prompt document runs on into the chat template's end-of-turn token and the
        next turn's text. `piece(token)`: the token's bytes as the text shows them; with it, a
        candidate token that starts a new sentence (`sentence_break`) is accepted with at most
        the request's rate there (AcceptanceModel.boundary_rate): a quoted sentence is often
        where a copy stops."""
        if max_draft < 0:
            raise ValueError(f"max_draft must be >= 0, got {max_draft}")
        if tree_width < 1:
            raise ValueError(f"tree_width must be >= 1, got {tree_width}")
        self.cost = cost
        self.max_draft = int(max_draft)
        self.min_gain = float(min_gain)
        self.sampled = bool(sampled)
        self.tree_width = int(tree_width)  # most branches (leaves) one draft may have
        self.is_stop = is_stop
        self._stops: dict[int, bool] = {}  # is_stop's answers so far (a C call each)
        self.piece = piece
        self._pieces: dict[int, bytes] = {}  # piece's answers so far
        self._threshold_curve: np.ndarray | None = None  # the curve `_threshold` was computed for
        self._threshold = 0.0
        self.reset()

    def reset(self) -> None:
        """Start a new request: forget acceptance history (the cost curve is kept)."""
        self.acceptance = AcceptanceModel(sampled=self.sampled)
        self._pending: _Pending | None = None
        self._reset_rejoin()
        # How much dearer a batch of 2+ tokens is, against one token, than the cost curve says,
        # right now: the backend's figure (llama.cpp: > 1 while another process holds the cores
        # and decodes run with fewer threads than the curve was measured with), which the
        # engine passes on at every step.
        self.batch_cost_factor = 1.0

    def _curve(self) -> np.ndarray:
        """The cost curve drafts are sized by: the measured one, batches scaled by the backend's
        current batch cost factor."""
        curve = self.cost.curve()
        if self.batch_cost_factor != 1.0:
            curve = curve.copy()
            curve[2:] *= self.batch_cost_factor
        return curve

    # ---- proposing -------------------------------------------------------------------
    def propose(self, index: SuffixIndex, limit: int, tree: bool = True) -> Draft:
        """The draft to verify next, at most `limit` tokens; EMPTY_DRAFT when none pays.

        `tree=False` forces a chain even with tree_width > 1 (the engine's first pass).
        """
        self._learn(index)
        limit = min(limit, self.max_draft, self.cost.max_batch - 1)
        if limit <= 0:
            return EMPTY_DRAFT
        match = index.query()
        if tree and self.tree_width > 1 and match is not None and len(match.positions) > 1:
            return propose_tree(index, match, limit, self.acceptance, self._curve(), self.tree_width,
                                self.min_gain, None if self.is_stop is None else self._is_stop)
        if match is None:
            return EMPTY_DRAFT
        match, kind = self._classify(index, match)
        last = int(index.context()[-1])
        if not self._may_pay(match, kind):
            # No draft of this match can pay, whatever its tokens: skip building the candidate
            # (following the occurrences is most of a step's drafting time); `_learn` builds
            # the few tokens it compares with the emitted ones.
            self._pending = _Pending(index, len(index), None, 0, match, kind, last)
            return EMPTY_DRAFT
        cand = self._candidate(index, match, limit, kind)
        if cand is None:
            return EMPTY_DRAFT
        self._pending = _Pending(index, len(index), cand, 0, match, kind, last)
        # Each accepted token lengthens the matched suffix, so later draft tokens are backed
        # by a longer match: use the bucket of the length they will have.
        rates = self.acceptance.rates(cand.kind, cand.match_length + np.arange(len(cand.tokens)))
        if self.piece is not None:
            after = self._after_boundary(last, cand.tokens)
            if any(after):
                rates = np.where(after, np.minimum(rates, self.acceptance.boundary_rate()), rates)
        k, expected = best_length(rates * cand.agreement, self._curve(), self.min_gain)
        self._pending.drafted = k
        if k == 0:
            return EMPTY_DRAFT
        return Draft(cand.tokens[:k], cand.match_length, cand.source != CONTEXT, expected, kind=cand.kind,
                     source=cand.source, sources=index.sources_containing(cand.tokens[:k]))

    def _may_pay(self, match: Match, kind: int) -> bool:
        """Whether some draft of `match` could beat a plain decode by `min_gain`.

        An upper bound that needs no candidate: the first token is accepted with probability
        at most c1 (its bucket's estimate; agreement only lowers it) and every later one with
        at most 1, so E(k) <= 1 + c1 * k. No k pays when c1 is below the least c1 for which
        (1 + c1 * k) / t(k + 1) reaches min_gain / t(1) for some k: the threshold depends on
        the curve alone and is kept until the curve changes.
        """
        curve = self._curve()
        if self._threshold_curve is not curve:
            k = np.arange(1, min(self.max_draft, len(curve) - 2) + 1)
            need = (self.min_gain * curve[k + 1] / curve[1] - 1.0) / k if len(k) else np.array([np.inf])
            self._threshold = float(need.min())
            self._threshold_curve = curve
        return self.acceptance.rate(kind, match.length) >= self._threshold

    def candidate(self, index: SuffixIndex, limit: int) -> Candidate | None:
        """What `propose` would weigh, untruncated (the simulator's oracle drafts from it).

        Like `propose`, it first learns from the tokens emitted since the last call; call
        `note_drafted` afterwards if some of its tokens are then drafted."""
        self._learn(index)
        limit = min(limit, self.max_draft, self.cost.max_batch - 1)
        match = index.query() if limit > 0 else None
        if match is None:
            return None
        match, kind = self._classify(index, match)
        cand = self._candidate(index, match, limit, kind)
        if cand is not None:
            self._pending = _Pending(index, len(index), cand, 0, match, kind, int(index.context()[-1]))
        return cand

    def note_drafted(self, drafted: int) -> None:
        """After `candidate`: its first `drafted` tokens were drafted (and passed to `record`)."""
        if self._pending is not None:
            self._pending.drafted = drafted

    def _candidate(self, index: SuffixIndex, match: Match, limit: int, kind: int,
                   context_end: int | None = None) -> Candidate | None:
        tokens, agreement = _follow_majority(index, match, limit, context_end)
        spans: tuple = ()
        if self._rules_by_first and tokens:
            tokens, agreement, spans = self._substitute(tokens, agreement, limit)
        end = self._through_stop(tokens)
        if end < len(tokens):
            tokens, agreement = tokens[:end], agreement[:end]
        if not tokens:
            return None
        return Candidate(tokens, agreement, match.length, kind, *match.positions[0], substituted=spans)

    def _is_stop(self, token: int) -> bool:
        known = self._stops.get(token)
        if known is None:
            known = self._stops[token] = bool(self.is_stop(token))
        return known

    def _after_boundary(self, last: int, tokens: Sequence[int]) -> list[bool]:
        """[i]: token i of a candidate starts a new sentence (`sentence_break`; the token
        before token 0 is `last`, the context's last token); empty without `piece`."""
        if self.piece is None:
            return []
        known = self._pieces
        out = []
        prev = known.get(last)
        if prev is None:
            prev = known[last] = bytes(self.piece(last))
        for token in tokens:
            text = known.get(token)
            if text is None:
                text = known[token] = bytes(self.piece(token))
            out.append(sentence_break(prev, text))
            prev = text
        return out

    def _through_stop(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` a draft may hold: up to and with the first stop token."""
        if self.is_stop is not None:
            for i, token in enumerate(tokens):
                if self._is_stop(token):
                    return i + 1
        return len(tokens)

    # ---- learning ----------------------------------------------------------------------
    def record(self, draft: Draft, accepted: int, path: list[int] | None = None) -> None:
        """The verifier accepted `accepted` tokens (for a tree: the nodes in `path`)."""
        if not len(draft):
            return
        if draft.parents is None:
            self.acceptance.update(draft.kind, draft.match_length, len(draft), accepted)
            pending = self._pending
            if self.piece is not None and pending is not None and pending.candidate is not None:
                after = self._after_boundary(pending.last, draft.tokens)
                self.acceptance.update_boundaries(after, accepted, len(draft))
            return
        # A tree: the walk went `accepted` levels deep; it failed at the next level only if
        # the node it stopped at had children to offer.
        last = path[-1] if path else -1
        failed = last in draft.parents
        self.acceptance.update(draft.kind, draft.match_length, accepted + int(failed), accepted)

    def _learn(self, index: SuffixIndex) -> None:
        """Compare the last step's candidate with the tokens the target emitted since.

        Free evidence: a candidate that was not drafted (or the token after a draft that was
        accepted whole) is confirmed or refuted by the emitted tokens without any verify cost.
        `record` has already counted the drafted tokens.
        """
        pending, self._pending = self._pending, None
        if pending is None or pending.index is not index or len(index) <= pending.at:
            return
        emitted = index.context()[pending.at :]
        cand, skip = pending.candidate, pending.drafted
        if cand is None:  # skipped by propose: only the tokens that can be compared are needed
            cand = self._candidate(index, pending.match, len(emitted), pending.kind, context_end=pending.at)
            if cand is None:
                return
        agree = agreeing_prefix(cand.tokens, emitted)
        tested = min(len(cand.tokens), len(emitted))
        if agree < tested:
            self._note_departure(cand, agree, pending.at)
        if agree >= skip and tested > skip:  # the positions past what record() counted
            self.acceptance.update(cand.kind, cand.match_length + skip, tested - skip, agree - skip)
            if self.piece is not None:
                after = self._after_boundary(pending.last, cand.tokens[:tested])[skip:]
                self.acceptance.update_boundaries(after, agree - skip, tested - skip)
