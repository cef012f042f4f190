"""SuffixIndex: hand-computed proposer tables, then a seeded property test against brute force.

Positions are (source id, end): the matched tokens are source[end - length : end] and the
continuation starts at `end`. Source 0 is the running context, 1.. the references in the order
they were added. Every table row below says in a comment why the answer is what it is.
"""
import numpy as np
import pytest

from lookahead.index import Branch, Match, SuffixIndex


def build(ctx, refs=(), **kwargs):
    index = SuffixIndex(**kwargs)
    for ref in refs:
        index.add_reference(ref)
    index.extend(ctx)
    return index


# --- query(): hand-computed table --------------------------------------------------------------

# (id, context, references, SuffixIndex kwargs, expected Match or None, continuation of the
#  first position with up to 3 tokens)
QUERY_CASES = [
    ("empty context", [], [], {}, None, None),
    # 3 never occurred before (only the trivial occurrence at the very end).
    ("no match", [1, 2, 3], [], {}, None, None),
    ("single token, no history", [5], [[6, 7]], {}, None, None),
    # The docstring example: [1, 2] ends at 2; before it nothing, so the length stops at 2.
    ("docstring", [1, 2, 3, 4, 1, 2], [], {}, Match(2, ((0, 2),)), [3, 4, 1]),
    # Only the last token occurred before ([6, 1] did not): the 1-gram table answers.
    ("length 1 via 1-grams", [1, 5, 2, 6, 1], [], {}, Match(1, ((0, 1),)), [5, 2, 6]),
    # [7, 8] occurs only in the reference (ends at 2); [1, 7, 8] does not (no 1 there).
    ("only in a reference", [1, 7, 8], [[7, 8, 9, 10]], {}, Match(2, ((1, 2),)), [9, 10]),
    # Suffix [.., 8, 1, 2, 3]. [2, 3] ends at 8 (preceded by 6: length 2) and at 4 (preceded by
    # 1, 2 then 5 vs 8: length 3). The older, longer occurrence wins; the 4-gram [8, 1, 2, 3]
    # never occurred, so this is found through the 2-gram table (3 < largest n-gram 4).
    ("longer older beats shorter recent",
     [5, 1, 2, 3, 9, 6, 2, 3, 8, 1, 2, 3], [], {}, Match(3, ((0, 4),)), [9, 6, 2]),
    # Context [2, 3] ends at 3 with length 2 (1 vs 5 before it); the reference holds [5, 2, 3]
    # (length 3): a longer reference match beats a more recent context match.
    ("longer reference beats context",
     [1, 2, 3, 5, 2, 3], [[5, 2, 3, 4]], {}, Match(3, ((1, 3),)), [4]),
    # Ties: [1, 2] everywhere with length exactly 2 (preceded by 7, 4, 5 or a source start,
    # never by 8). Order: context most recent first, then reference 1 most recent first, then
    # reference 2.
    ("ties: context recent-first, then references in order",
     [1, 2, 7, 1, 2, 8, 1, 2], [[4, 1, 2, 5, 1, 2, 6], [1, 2]], {},
     Match(2, ((0, 5), (0, 2), (1, 6), (1, 3), (2, 2))), [8, 1, 2]),
    # Self-overlap: [7, 7, 7] ends at 3 (one token before the end); [7, 7] at 2 is shorter.
    ("run of one token", [7, 7, 7, 7], [], {}, Match(3, ((0, 3),)), [7]),
    # Suffix [8, 1, 2, 3, 4, 5, 6]: [1..6] ends at 11 (preceded by 6, not 8): length 6;
    # [3, 4, 5, 6] ends at 5 (preceded by 0 vs 2): length 4.
    ("uncapped",
     [0, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4, 5, 6], [], {}, Match(6, ((0, 11),)), [8, 1, 2]),
    # Same context with max_match=4: both occurrences reach the cap, so they tie at 4 and the
    # more recent comes first.
    ("max_match cap makes a tie",
     [0, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4, 5, 6], [], {"max_match": 4},
     Match(4, ((0, 11), (0, 5))), [8, 1, 2]),
    # The cap also bounds matches in a reference that repeats the whole context.
    ("max_match cap in a reference",
     [1, 2, 3, 4, 5, 6], [[1, 2, 3, 4, 5, 6, 9]], {"max_match": 4}, Match(4, ((1, 6),)), [9]),
    # The smallest n-gram size is the minimum match length: [1, 2, 3] occurred before, but with
    # only 4-grams there is nothing to look up.
    ("below the smallest n-gram size", [1, 2, 3, 9, 1, 2, 3], [], {"ngram_sizes": (4,)}, None, None),
    # ... and with (2, 4) a lone repeated token is not a match, but a 3-token one is (via n=2).
    ("min n-gram 2, last token only", [1, 5, 2, 6, 1], [], {"ngram_sizes": (2, 4)}, None, None),
    ("min n-gram 2, length 3", [1, 2, 3, 9, 1, 2, 3], [], {"ngram_sizes": (2, 4)},
     Match(3, ((0, 3),)), [9, 1, 2]),
]


@pytest.mark.parametrize(
    "ctx, refs, kwargs, expected, continuation",
    [case[1:] for case in QUERY_CASES],
    ids=[case[0] for case in QUERY_CASES],
)
def test_query_table(ctx, refs, kwargs, expected, continuation):
    index = build(ctx, refs, **kwargs)
    match = index.query()
    assert match == expected
    if expected is not None:
        assert index.continuation(match.positions[0], 3).tolist() == continuation
        # every reported position really is an occurrence of the matched suffix
        for sid, end in match.positions:
            src = index.source_tokens(sid)
            assert src[end - match.length : end].tolist() == list(ctx[len(ctx) - match.length :])


def test_max_candidates_bounds_the_occurrences_examined():
    # Documented bound: only the most recent `max_candidates` occurrences of the looked-up
    # n-gram are measured. Suffix [3, 1, 2]: [1, 2] ends at 6 (preceded by 4: length 2) and at
    # 3 (preceded by 3: length 3). With one candidate the older, longer one is not examined.
    ctx = [3, 1, 2, 4, 1, 2, 3, 1, 2]
    assert build(ctx).query() == Match(3, ((0, 3),))
    assert build(ctx, max_candidates=1).query() == Match(2, ((0, 6),))


def test_largest_ngram_is_looked_up_first():
    # The last token 5 also ends 20 recent [9, 5] pairs (length 1 each). The 4-gram
    # [2, 3, 4, 5] finds the old occurrence ending at 5 (length 5) although it is far outside
    # the 16 most recent occurrences of the 1-gram [5].
    ctx = [1, 2, 3, 4, 5] + [9, 5] * 20 + [1, 2, 3, 4, 5]
    assert build(ctx).query() == Match(5, ((0, 5),))


def test_continuation_stops_at_source_end_and_clamps_counts():
    index = build([1, 2, 3, 4, 1, 2], [[9, 8, 7]])
    assert index.continuation((0, 2), 10).tolist() == [3, 4, 1, 2]
    assert index.continuation((0, 2), 0).tolist() == []
    assert index.continuation((0, 2), -3).tolist() == []
    assert index.continuation((1, 1), 5).tolist() == [8, 7]
    assert index.continuation((1, 3), 5).tolist() == []


def test_cyclic_continuation_repeats_the_period_of_the_context_only():
    index = build([1, 2, 3, 4, 1, 2], [[9, 8, 7]])
    # the occurrence ending at 2 continues 3 4 1 2 up to the end, then that period again
    assert index.continuation((0, 2), 10, cyclic=True).tolist() == [3, 4, 1, 2, 3, 4, 1, 2, 3, 4]
    assert index.continuation((0, 4), 5, cyclic=True).tolist() == [1, 2, 1, 2, 1]
    assert index.continuation((0, 2), 3, cyclic=True).tolist() == [3, 4, 1]  # not at the end: unchanged
    assert index.continuation((0, 6), 4, cyclic=True).tolist() == []  # nothing follows the end itself
    assert index.continuation((1, 1), 5, cyclic=True).tolist() == [8, 7]  # references are not cyclic


def test_continuation_as_of_an_earlier_context_length():
    index = build([1, 2, 3, 4, 1, 2])
    index.extend([7, 7])  # emitted after a query made at length 6
    # As the query saw it: [3, 4, 1, 2] ran into the end, so it repeats; not the 7s added since
    assert index.continuation((0, 2), 6, cyclic=True, context_end=6).tolist() == [3, 4, 1, 2, 3, 4]
    assert index.continuation((0, 2), 6, cyclic=True).tolist() == [3, 4, 1, 2, 7, 7]
    assert index.continuation((0, 2), 6, context_end=6).tolist() == [3, 4, 1, 2]
    assert index.continuation((0, 2), 6, context_end=99).tolist() == [3, 4, 1, 2, 7, 7]  # capped at the size


def test_continuation_is_a_copy():
    index = build([1, 2, 3, 1, 2])
    cont = index.continuation((0, 2), 3)
    cont[:] = 0
    assert index.context().tolist() == [1, 2, 3, 1, 2]


# --- continuation_trie ------------------------------------------------------------------------

def trie_as_tuples(level):
    return [(b.token, b.count, trie_as_tuples(b.children)) for b in level]


def test_trie_orders_by_count_before_recency():
    # [1, 2] ends at 10, 6 and 2 (each preceded by something other than 8: length 2).
    # Continuations (depth 2): end 10 -> [8, 1], end 6 -> [7, 3], end 2 -> [7, 4].
    ctx = [1, 2, 7, 4, 1, 2, 7, 3, 1, 2, 8, 1, 2]
    index = build(ctx)
    match = index.query()
    assert match == Match(2, ((0, 10), (0, 6), (0, 2)))
    trie = index.continuation_trie(match, depth=2)
    # 7 is followed twice, so it leads although 8 is the most recent; below 7 the tie keeps
    # preference order (3 came from the more recent occurrence).
    assert trie_as_tuples(trie) == [
        (7, 2, [(3, 1, []), (4, 1, [])]),
        (8, 1, [(1, 1, [])]),
    ]
    assert isinstance(trie[0], Branch)


def test_trie_ties_keep_preference_order_not_token_order():
    index = SuffixIndex()
    for ref in ([1, 5], [1, 9], [1, 2]):
        index.add_reference(ref)
    match = Match(1, ((1, 1), (2, 1), (3, 1)))
    assert trie_as_tuples(index.continuation_trie(match, depth=3)) == [
        (5, 1, []), (9, 1, []), (2, 1, []),
    ]


def test_trie_skips_empty_continuations():
    index = build([1, 2, 3], [[1, 2]])
    match = Match(2, ((0, 2), (1, 2)))  # the reference continuation is empty (ends at its end)
    assert trie_as_tuples(index.continuation_trie(match, depth=1)) == [(3, 1, [])]


# --- reset / references -------------------------------------------------------------------------

def test_reset_forgets_context_keeps_references():
    index = build([1, 2, 3, 1, 2], [[7, 1, 2, 9]])
    assert index.query() == Match(2, ((0, 2), (1, 3)))
    index.reset()
    assert len(index) == 0 and index.query() is None and index.n_sources == 2
    index.extend([1, 2])
    assert index.query() == Match(2, ((1, 3),))


def test_add_reference_returns_increasing_ids():
    index = SuffixIndex()
    assert index.n_sources == 1
    assert index.add_reference([1, 2]) == 1
    assert index.add_reference(np.array([3, 4], dtype=np.int64)) == 2
    assert index.add_reference([]) == 3
    assert index.source_tokens(2).tolist() == [3, 4]
    assert index.source_tokens(3).tolist() == []
    # a match reports the id add_reference returned: [3, 4] is only in source 2
    index.extend([9, 3, 4])
    assert index.query() == Match(2, ((2, 2),))


def test_growth_past_initial_capacity():
    # The context array starts at 1024 slots; a 3000-token context must keep every table right.
    rng = np.random.RandomState(0)
    block = rng.randint(0, 1000, size=1500).tolist()
    index = build(block + block)
    match = index.query()
    assert match.length == 64  # capped at max_match
    assert match.positions == ((0, 1500),)


# --- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ngram_sizes": ()}, r"ngram_sizes must be positive integers, got \(\)"),
        ({"ngram_sizes": (0, 2)}, r"got \(0, 2\)"),
        ({"ngram_sizes": (1, 205)}, r"ngram size 205 is too large \(max 204\)"),
        ({"ngram_sizes": (1, 2, 4), "max_match": 3}, r"largest n-gram size 4, got 3"),
        ({"max_candidates": 0}, r"max_candidates must be >= 1, got 0"),
    ],
)
def test_constructor_errors_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SuffixIndex(**kwargs)


def test_constructor_error_names_the_value_from_an_iterator():
    # A generator is consumed once: the message must still show what was asked for.
    with pytest.raises(ValueError, match=r"got \(0, 1\)"):
        SuffixIndex(ngram_sizes=(n for n in (0, 1)))


@pytest.mark.parametrize("bad_token", [1 << 20, -1])
def test_out_of_range_token_ids_are_rejected(bad_token):
    # n-gram keys pack each token into 20 bits: an id outside [0, 2**20) would collide with
    # another key ((1 << 20) | 0 reads as the 2-gram [1, 0]), so it must be refused by name.
    index = SuffixIndex(ngram_sizes=(2,), max_match=2)
    index.extend([1, 0, 5])
    with pytest.raises(ValueError, match=rf"token id {bad_token} is outside the index's range \[0, 1048575\]"):
        index.extend([bad_token])
    with pytest.raises(ValueError, match=rf"token id {bad_token}"):
        index.add_reference([7, bad_token])
    assert index.context().tolist() == [1, 0, 5]  # the refused token was not added
    assert index.n_sources == 1


# --- property test: incremental == brute force == fresh index --------------------------------------

def brute_force_query(ctx, refs, min_len, max_match):
    """For L from the cap down: does ctx[-L:] end at an earlier context position or in a reference?"""
    n = len(ctx)
    for length in range(min(max_match, n), min_len - 1, -1):
        suffix = ctx[n - length :]
        hits = [(0, end) for end in range(n - 1, length - 1, -1) if ctx[end - length : end] == suffix]
        for sid, ref in enumerate(refs, start=1):
            hits += [(sid, end) for end in range(len(ref), length - 1, -1) if ref[end - length : end] == suffix]
        if hits:
            return Match(length, tuple(hits))
    return None


@pytest.mark.parametrize(
    "ngram_sizes, max_match",
    [((1, 2, 4), 12), ((1, 2, 4), 4), ((2, 3), 6), ((1,), 8)],
)
@pytest.mark.parametrize("seed", range(6))
def test_incremental_matches_brute_force(ngram_sizes, max_match, seed):
    rng = np.random.RandomState(seed)
    vocab = int(rng.randint(2, 5))
    refs = [rng.randint(0, vocab, size=int(rng.randint(0, 30))).tolist() for _ in range(rng.randint(0, 3))]
    # max_candidates large enough that every occurrence is examined: query() must be exact.
    exact = SuffixIndex(ngram_sizes, max_match=max_match, max_candidates=10_000)
    default = SuffixIndex(ngram_sizes, max_match=max_match)
    for ref in refs:
        exact.add_reference(ref)
        default.add_reference(ref)
    ctx: list[int] = []
    for step in range(60):
        new = rng.randint(0, vocab, size=int(rng.randint(1, 6))).tolist()
        ctx += new
        exact.extend(new)
        default.extend(new)
        where = f"seed={seed} step={step} ctx={ctx} refs={refs}"
        assert exact.context().tolist() == ctx, where
        expected = brute_force_query(ctx, refs, min(ngram_sizes), max_match)
        assert exact.query() == expected, where
        fresh = build(ctx, refs, ngram_sizes=ngram_sizes, max_match=max_match)
        assert default.query() == fresh.query(), where
        if step == 30:  # reset keeps the references and starts the context afresh
            exact.reset()
            default.reset()
            ctx = []


def test_sources_containing_a_run():
    idx = SuffixIndex()
    idx.extend([9, 1, 2, 3, 4, 5])
    file = idx.add_reference([7, 1, 2, 3, 4, 5, 6])
    other = idx.add_reference([1, 2, 8])
    assert idx.sources_containing([1, 2, 3, 4, 5]) == (0, file)
    assert idx.sources_containing([4, 5, 6]) == (0, file)  # the context's run ends with it: as far as it goes
    assert idx.sources_containing([1, 2]) == (0, file, other)
    assert idx.sources_containing([2, 8, 9]) == (other,)  # cut by the reference's end
    assert idx.sources_containing([3, 9]) == ()
    assert idx.sources_containing([]) == ()
