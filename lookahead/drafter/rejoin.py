"""Drafting through an edit: rejoining a source after the output departs from it, and learning
the substitution the edit made so that the next occurrence is drafted with it.

Rejoining: when the output has copied a source for a while and then departs from it (a
renamed word, a changed line), the suffix match right after the change is short, and short
matches are weak evidence in general. But a short match whose occurrence lies just after the
point where the copy left the source (within the tokens emitted since, plus REJOIN_SLACK) is
the output rejoining its source: it is followed alone and has its own, higher, prior row
(REJOIN_KIND), measured like the others.

Learned substitutions: at a rejoin the drafter also knows what the change was, the source's
tokens between the two points (at most MAX_RULE_TOKENS) and the output's tokens instead. A
rename or a changed path recurs: every later candidate that holds the same source tokens gets
the output's tokens in their place, so the draft runs through the next edit point instead of
failing at it. Deletions are not learned, and a substitution the target contradicts is
dropped for the rest of the request (an edit made once, a number that counts up); a wrong one
only ever costs a rejected draft, as the verifier keeps the output exact.

The tunables below are read at call time from this module (patch them here, not on the
package).
"""
from __future__ import annotations

import numpy as np

from ..index import CONTEXT, Match, SuffixIndex
from .draft import Candidate
from .priors import CONTEXT_KIND, REFERENCE_KIND, REJOIN_KIND

# A copy of at least REJOIN_RUN tokens that departs from its source leaves an anchor there;
# for the next REJOIN_WINDOW tokens, a match shorter than REJOIN_BELOW whose text starts from
# 2 tokens before the anchor to REJOIN_SLACK tokens past it (plus the tokens emitted since) is
# a rejoin.
REJOIN_RUN = 8
REJOIN_SLACK = 32
REJOIN_BELOW = 16
REJOIN_WINDOW = 64
MAX_RULE_TOKENS = 6  # longest source or output span a learned substitution may have (a name, a path)
MAX_RULES = 16  # substitutions kept per request, the newest

Spans = tuple[tuple[int, int, tuple[int, ...]], ...]  # (start, end, rule) per substitution made


class Rejoining:
    """The Drafter's rejoin and substitution state, per request, and what it does with it.

    A mixin of `Drafter`: it holds the anchor and the rules, classifies each match (a rejoin
    or its source's kind), rewrites candidates with the rules, and learns from each step where
    a candidate parted from the emitted tokens.
    """

    def _reset_rejoin(self) -> None:
        # Where the last copy left its source: (source, position there, context length then).
        self._anchor: tuple[int, int, int] | None = None
        # Learned substitutions: source tokens -> the output's tokens in their place.
        self.rules: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._rules_by_first: dict[int, list[tuple[int, ...]]] = {}  # the newest first
        self._contradicted: set[tuple[int, ...]] = set()  # keys of rules the target contradicted

    def _classify(self, index: SuffixIndex, match: Match) -> tuple[Match, int]:
        """The match to follow and its kind: a rejoin (that occurrence alone) or its source's."""
        anchor = self._anchor
        if anchor is not None and match.length < REJOIN_BELOW:
            source, left_at, context_length = anchor
            since = len(index) - context_length
            if since > REJOIN_WINDOW:
                self._anchor = None
            else:
                for sid, p in match.positions:
                    if sid == source and left_at - 2 <= p - match.length <= left_at + since + REJOIN_SLACK:
                        if match.length >= 2:
                            self._learn_rule(index, sid, left_at, p - match.length, context_length,
                                             len(index) - match.length)
                        return Match(match.length, ((sid, p),)), REJOIN_KIND
        return match, CONTEXT_KIND if match.positions[0][0] == CONTEXT else REFERENCE_KIND

    def _note_departure(self, cand: Candidate, agree: int, at: int) -> None:
        """The emitted tokens (from context length `at` on) parted from `cand` after `agree`
        of its tokens: drop a substitution the target overruled there, and anchor a rejoin
        where a long enough copy left its source."""
        for start, end, key in cand.substituted:
            if start <= agree < end:  # the target wrote something else than the substitution
                self._forget_rule(key)
        if cand.match_length + agree >= REJOIN_RUN:  # a copy left its source here
            self._anchor = (cand.source, cand.position + _source_offset(cand.substituted, agree), at + agree)

    def _learn_rule(self, index: SuffixIndex, source: int, left_at: int, rejoined_at: int, context_left: int,
                    context_rejoined: int) -> None:
        """The output replaced source[left_at:rejoined_at] by context[context_left:context_rejoined]."""
        if not (left_at < rejoined_at <= left_at + MAX_RULE_TOKENS
                and context_left < context_rejoined <= context_left + MAX_RULE_TOKENS):
            return  # (a deletion is not learned: dropping a token wherever it recurs is rarely right)
        key = tuple(index.source_tokens(source)[left_at:rejoined_at].tolist())
        value = tuple(index.context()[context_left:context_rejoined].tolist())
        if key == value or self.rules.get(key) == value or key in self._contradicted:
            return
        self.rules.pop(key, None)
        self.rules[key] = value
        while len(self.rules) > MAX_RULES:
            del self.rules[next(iter(self.rules))]
        self._index_rules()

    def _forget_rule(self, key: tuple[int, ...]) -> None:
        """The target wrote something else where the rule for `key` applied: drop it for the
        rest of the request (an edit the model does not repeat, or a number that counts up)."""
        self._contradicted.add(key)
        if self.rules.pop(key, None) is not None:
            self._index_rules()

    def _index_rules(self) -> None:
        self._rules_by_first = {}
        for key in reversed(self.rules):
            self._rules_by_first.setdefault(key[0], []).append(key)

    def _substitute(self, tokens: list[int], agreement: np.ndarray, limit: int
                    ) -> tuple[list[int], np.ndarray, Spans]:
        """Apply the learned substitutions to a candidate's tokens; also where each one landed:
        (start, end, rule) in the returned tokens."""
        out: list[int] = []
        agree: list[float] = []
        spans: list[tuple[int, int, tuple[int, ...]]] = []
        i = 0
        while i < len(tokens) and len(out) < limit:
            for key in self._rules_by_first.get(tokens[i], ()):
                if tuple(tokens[i : i + len(key)]) == key:
                    replacement = self.rules[key]
                    spans.append((len(out), len(out) + len(replacement), key))
                    out.extend(replacement)
                    agree.extend([float(agreement[i])] * len(replacement))
                    i += len(key)
                    break
            else:
                out.append(tokens[i])
                agree.append(float(agreement[i]))
                i += 1
        if not spans:
            return tokens, agreement, ()
        return out[:limit], np.array(agree[:limit]), tuple(spans)


def _source_offset(substituted: Spans, i: int) -> int:
    """Where candidate token i came from, counted from the candidate's source position, given
    the substitutions made in it ((start, end, rule) each; a token inside one maps to its start)."""
    shift = 0
    for start, end, key in substituted:
        if i < end:
            return min(i, start) + shift
        shift += len(key) - (end - start)
    return i + shift
