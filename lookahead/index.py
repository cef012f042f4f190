"""Suffix index over token ids: where did the current suffix of the context occur before?

The index holds several sources of tokens:

* source 0, the *running context* (prompt + output so far). It grows by `extend` with the
  tokens the target emitted (drafts are never indexed, so a rejected draft needs no undo) and
  is emptied by `reset`;
* sources 1.., *reference* texts the caller registers (the file under edit, retrieved
  passages). They are static.

For every source it keeps, for each n in `ngram_sizes`, a table from an n-gram key to the
list of positions where that n-gram *ends* (the continuation starts there). Appending a
token adds one entry per table: O(1) amortised, no rescan. A query looks up the last n tokens
of the context (largest n first), then measures the true match length of the most recent
candidates of each source in one vectorised comparison, capped at `max_match` tokens.

Why not a suffix automaton or pyahocorasick: an Aho-Corasick automaton matches a fixed set
of patterns built up front; here the "patterns" (every suffix of a growing, rolled-back
context) change at every token, and rebuilding costs a scan. Hashed n-gram tables plus a
bounded backward comparison give the same answer (the longest suffix that occurred before,
up to `max_match`) in microseconds, with memory linear in indexed tokens
(`samples/examples/index_bench.py` measures both on your machine).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

CONTEXT = 0  # source id of the running context

_KEY_BITS = 20  # token ids below 2**20 (Gemma's 262k vocabulary fits); keys are exact
MAX_TOKEN_ID = (1 << _KEY_BITS) - 1


def _key(tokens: Sequence[int]) -> int:
    key = 0
    for t in tokens:
        key = (key << _KEY_BITS) | int(t)
    return key


class _Source:
    """Tokens of one source in a growable int32 array, with its n-gram position tables."""

    __slots__ = ("tokens", "size", "tables", "ngram_sizes")

    def __init__(self, ngram_sizes: tuple[int, ...], capacity: int = 1024):
        self.tokens = np.zeros(max(16, capacity), dtype=np.int32)
        self.size = 0
        self.ngram_sizes = ngram_sizes
        self.tables: dict[int, dict[int, list[int]]] = {n: {} for n in ngram_sizes}

    def view(self) -> np.ndarray:
        return self.tokens[: self.size]

    def append(self, token: int) -> None:
        if not 0 <= token <= MAX_TOKEN_ID:
            raise ValueError(f"token id {token} is outside the index's range [0, {MAX_TOKEN_ID}]")
        if self.size == len(self.tokens):
            grown = np.zeros(2 * len(self.tokens), dtype=np.int32)
            grown[: self.size] = self.tokens[: self.size]
            self.tokens = grown
        self.tokens[self.size] = token
        self.size += 1
        end = self.size
        for n in self.ngram_sizes:
            if end >= n:
                key = _key(self.tokens[end - n : end].tolist())
                table = self.tables[n]
                positions = table.get(key)
                if positions is None:
                    table[key] = [end]
                else:
                    positions.append(end)


@dataclass(frozen=True)
class Match:
    """The longest suffix of the context that occurred before, and where.

    `positions[i]` is (source id, position) where the continuation starts, i.e. the tokens
    `source[position - length : position]` equal the last `length` tokens of the context.
    Ordered by preference: most recent occurrence in the context first, then references.
    """

    length: int
    positions: tuple[tuple[int, int], ...]


@dataclass
class Branch:
    """One node of a continuation trie: a token, how many occurrences pass through it."""

    token: int
    count: int
    children: list["Branch"] = field(default_factory=list)


class SuffixIndex:
    """Incremental suffix index over the running context and registered references.

    >>> idx = SuffixIndex()
    >>> idx.extend([1, 2, 3, 4, 1, 2])
    >>> m = idx.query()
    >>> m.length, m.positions
    (2, ((0, 2),))
    >>> idx.continuation(m.positions[0], 3).tolist()
    [3, 4, 1]
    """

    def __init__(
        self,
        ngram_sizes: Iterable[int] = (1, 2, 4),
        max_match: int = 64,
        max_candidates: int = 16,
    ):
        requested = tuple(ngram_sizes)
        sizes = tuple(sorted(set(int(n) for n in requested)))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"ngram_sizes must be positive integers, got {requested}")
        if sizes[-1] * _KEY_BITS > 4096:
            raise ValueError(f"ngram size {sizes[-1]} is too large (max {4096 // _KEY_BITS})")
        if max_match < sizes[-1]:
            raise ValueError(f"max_match must be >= the largest n-gram size {sizes[-1]}, got {max_match}")
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
        self.ngram_sizes = sizes
        self.max_match = int(max_match)
        self.max_candidates = int(max_candidates)
        self._sources: list[_Source] = [_Source(sizes)]
        # Where the output begins in the running context (`begin_output`): None while the
        # whole context counts as output.
        self.output_start: int | None = None

    # ---- building ------------------------------------------------------------------
    def add_reference(self, tokens: Sequence[int]) -> int:
        """Register a static reference text (token ids); returns its source id (>= 1)."""
        src = _Source(self.ngram_sizes, capacity=len(tokens) + 1)
        for t in tokens:
            src.append(int(t))
        self._sources.append(src)
        return len(self._sources) - 1

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the running context."""
        ctx = self._sources[CONTEXT]
        for t in tokens:
            ctx.append(int(t))

    def begin_output(self) -> None:
        """Mark the end of the prompt: the context's tokens from here on are the output."""
        self.output_start = self._sources[CONTEXT].size

    def tie_rank(self, position: tuple[int, int]) -> int:
        """How a continuation from `position` ranks when occurrences disagree evenly: 0 where it
        is the output so far (the model's own recent text), 1 in a reference (a text the
        caller says the output may copy), 2 in the prompt (mostly instructions, seldom copied)."""
        sid, p = position
        if sid != CONTEXT:
            return 1
        return 2 if self.output_start is not None and p < self.output_start else 0

    def reset(self) -> None:
        """Forget the running context (references stay)."""
        self._sources[CONTEXT] = _Source(self.ngram_sizes)
        self.output_start = None

    def __len__(self) -> int:
        return self._sources[CONTEXT].size

    @property
    def n_sources(self) -> int:
        return len(self._sources)

    def context(self) -> np.ndarray:
        return self._sources[CONTEXT].view()

    def source_tokens(self, source: int) -> np.ndarray:
        return self._sources[source].view()

    # ---- querying ------------------------------------------------------------------
    def query(self) -> Match | None:
        """Longest suffix of the context (up to `max_match`) that occurred before.

        Looks in the context itself (excluding the trivial occurrence at its end) and in
        every reference, at the `max_candidates` most recent occurrences per source of the
        longest n-gram key that occurred. Returns None when no suffix of the smallest n-gram
        size occurred before.
        """
        ctx = self._sources[CONTEXT]
        n_ctx = ctx.size
        tail_len = min(self.max_match, n_ctx)
        if tail_len == 0:
            return None
        tail_rev = ctx.tokens[n_ctx - tail_len : n_ctx][::-1]  # [tail_len], last token first
        for n in reversed(self.ngram_sizes):
            if n > n_ctx:
                continue
            key = _key(ctx.tokens[n_ctx - n : n_ctx].tolist())
            best_len = 0
            best: list[tuple[int, int]] = []
            for sid, src in enumerate(self._sources):
                positions = src.tables[n].get(key)
                if not positions:
                    continue
                cand = positions[-self.max_candidates - 1 :] if sid == CONTEXT else positions[-self.max_candidates :]
                if sid == CONTEXT and cand[-1] == n_ctx:
                    cand = cand[:-1]
                    if not cand:
                        continue
                    cand = cand[-self.max_candidates :]
                lengths = _match_lengths(src.tokens, np.asarray(cand), tail_rev, n)
                top = int(lengths.max())
                if top < best_len:
                    continue
                hits = [(sid, p) for p, ln in zip(reversed(cand), reversed(lengths.tolist())) if ln == top]
                if top > best_len:
                    best_len, best = top, hits
                else:
                    best.extend(hits)
            if best:
                return Match(best_len, tuple(best))
        return None

    def sources_containing(self, tokens: Sequence[int]) -> tuple[int, ...]:
        """The sources that hold `tokens` as a run (a run cut by a source's end counts as far
        as it goes): the texts a draft of `tokens` can be said to come from. For the stats; looks at up to `max_candidates` occurrences per source
        of the run's first n-gram."""
        if not len(tokens):
            return ()
        want = np.asarray(tokens)
        n = max(m for m in self.ngram_sizes if m <= len(want)) if min(self.ngram_sizes) <= len(want) else 0
        if n == 0:
            return ()
        key = _key(want[:n].tolist())
        found = []
        for sid, src in enumerate(self._sources):
            for end in (src.tables[n].get(key) or [])[-self.max_candidates :]:
                got = src.tokens[end - n : min(src.size, end - n + len(want))]
                if np.array_equal(got, want[: len(got)]):
                    found.append(sid)
                    break
        return tuple(found)

    def continuation(self, position: tuple[int, int], max_tokens: int, cyclic: bool = False,
                     context_end: int | None = None) -> np.ndarray:
        """The tokens that followed an occurrence, up to `max_tokens` (stops at the source end).

        `cyclic`: an occurrence in the running context whose continuation runs into the
        context's end predicts its own future: the text from `p` to the end repeats (period
        end - p), as in a list or table that keeps its pattern, or a model stuck in a loop.
        `context_end`: read the running context as it was when it held that many tokens (what
        a query made then would have continued with, before later tokens were appended).
        """
        sid, p = position
        src = self._sources[sid]
        size = src.size if sid != CONTEXT or context_end is None else min(src.size, context_end)
        want = max(0, max_tokens)
        end = min(size, p + want)
        out = src.tokens[p:end].copy()
        if cyclic and sid == CONTEXT and end == size and len(out) < want and len(out) > 0:
            out = np.resize(out, want)  # repeats the period
        return out

    def continuation_trie(self, match: Match, depth: int, cyclic: bool = False) -> list[Branch]:
        """Merge the continuations of every occurrence in `match` into a counted trie.

        Branches of each level are ordered by count, ties broken by the preference order of
        `match.positions` (most recent first). `cyclic` as in `continuation`.
        """
        roots: list[Branch] = []
        for pos in match.positions:
            level = roots
            for tok in self.continuation(pos, depth, cyclic=cyclic).tolist():
                for br in level:
                    if br.token == tok:
                        br.count += 1
                        break
                else:
                    br = Branch(tok, 1)
                    level.append(br)
                level = br.children
        _sort_trie(roots)
        return roots


def _sort_trie(level: list[Branch]) -> None:
    level.sort(key=lambda b: -b.count)  # stable: equal counts keep preference order
    for br in level:
        _sort_trie(br.children)


def _match_lengths(tokens: np.ndarray, ends: np.ndarray, tail_rev: np.ndarray, known: int) -> np.ndarray:
    """Length of the common suffix of tokens[:end] and the context, for each end.

    `known` tokens are already known to match (the n-gram key). The comparison is capped at
    len(tail_rev) and at the start of the source.
    """
    cap = len(tail_rev)
    if cap <= known:
        return np.full(len(ends), cap, dtype=np.int64)
    offsets = np.arange(known, cap)  # [m]
    idx = ends[:, None] - 1 - offsets[None, :]  # [k, m]
    valid = idx >= 0
    same = valid & (tokens[np.maximum(idx, 0)] == tail_rev[known:][None, :])
    # first False along each row; all True -> cap
    mismatch = ~same
    first = np.where(mismatch.any(axis=1), mismatch.argmax(axis=1), cap - known)
    return first + known
