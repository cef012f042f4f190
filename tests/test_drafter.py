"""Drafter: cost curve, acceptance posterior, draft-length choice, proposals on a real index.

Expected values are computed by hand in the comments. `rate_oracle_k` is a deliberately naive
re-statement of the objective (a Python loop over k of E(k) / t(k + 1)) used to cross-check
best_length where hand arithmetic over dozens of k would be unreadable.
"""
import numpy as np
import pytest

from lookahead.drafter import (
    EMPTY_DRAFT,
    SCALE_TOLERANCE,
    AcceptanceModel,
    CostModel,
    Draft,
    Drafter,
    best_length,
)
from lookahead.drafter.follow import _follow_majority
from lookahead.index import Match, SuffixIndex

# A CPU-like verify cost: t(n) in ms for n tokens in one decode (interpolated in between).
STEEP_POINTS = ((1, 11.0), (2, 21.0), (4, 29.0), (8, 43.0), (16, 86.0), (32, 150.0), (64, 293.0))

# The hand-computed cases below use this small prior table (per-token acceptance by
# match-length bucket <=2, <=5, <=11, <=23, more; strength 6), installed by the autouse
# fixture, so that they test the mechanism whatever table ships (tested separately below).
PRIOR = {2: 0.30, 5: 0.50, 11: 0.65, 23: 0.78, 24: 0.88}


@pytest.fixture(autouse=True)
def hand_prior_table(monkeypatch):
    from lookahead.drafter import priors

    monkeypatch.setattr(priors, "_BUCKET_UPPER", (2, 5, 11, 23, 1 << 30))
    monkeypatch.setattr(priors, "_PRIOR_MEAN", ((0.30, 0.50, 0.65, 0.78, 0.88),) * priors.N_KINDS)
    monkeypatch.setattr(priors, "_PRIOR_STRENGTH", 6.0)


def test_shipped_prior_table_is_well_formed(monkeypatch):
    import lookahead.drafter.priors as shipped

    monkeypatch.undo()  # the table as shipped, not the fixture's
    upper = np.array(shipped._BUCKET_UPPER)
    assert upper[0] >= 1 and np.all(np.diff(upper) > 0)
    for table in (shipped._PRIOR_MEAN, shipped._PRIOR_MEAN_SAMPLED):
        mean = np.array(table)
        assert mean.shape == (shipped.N_KINDS, len(upper))  # one row per source kind
        assert np.all((mean > 0) & (mean < 1)) and np.all(np.diff(mean, axis=-1) >= 0)  # longer match, likelier
    assert shipped._PRIOR_STRENGTH > 0


def rate(model, kind, match_length):
    """The posterior mean for one match length."""
    return float(model.rates(kind, np.array([match_length]))[0])


def steep_curve(max_batch=128):
    n = np.arange(max_batch + 1, dtype=np.float64)
    sizes, times = zip(*STEEP_POINTS)
    return np.interp(n, sizes, times)


def steep_cost(max_batch=128):
    cost = CostModel(max_batch=max_batch)
    for n, ms in STEEP_POINTS:
        cost.observe(n, ms)
    return cost


def linear_cost(t1, slope, max_batch=128):
    """t(n) = t1 + slope * (n - 1), from two observations."""
    cost = CostModel(max_batch=max_batch)
    cost.observe(1, t1)
    cost.observe(max_batch, t1 + slope * (max_batch - 1))
    return cost


def expected_tokens(confidences):
    """E(k) = 1 + sum_i prod_{j<=i} c_j, by a plain loop."""
    total, survive = 1.0, 1.0
    for c in confidences:
        survive *= c
        total += survive
    return total


def rate_oracle_k(confidences, cost_curve):
    """argmax over k of E(k) / t(k + 1) by a plain loop (first k on ties)."""
    best_k, best_rate = 0, 1.0 / cost_curve[1]
    for k in range(1, min(len(confidences), len(cost_curve) - 2) + 1):
        rate = expected_tokens(confidences[:k]) / cost_curve[k + 1]
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


# --- best_length -------------------------------------------------------------------------------

def test_best_length_tiny_case_by_hand():
    confidences = np.array([0.5, 0.8])
    # E(0) = 1, E(1) = 1 + 0.5 = 1.5, E(2) = 1.5 + 0.5 * 0.8 = 1.9.
    # Flat t = 10: rates 0.100, 0.150, 0.190 -> k = 2.
    k, e = best_length(confidences, np.array([10.0, 10.0, 10.0, 10.0]))
    assert k == 2 and e == pytest.approx(1.9)
    # t(1..3) = 10, 14, 20: rates 0.1000, 0.1071, 0.0950 -> k = 1.
    k, e = best_length(confidences, np.array([10.0, 10.0, 14.0, 20.0]))
    assert k == 1 and e == pytest.approx(1.5)


def test_best_length_min_gain():
    confidences = np.array([0.5, 0.8])
    curve = np.array([10.0, 10.0, 14.0, 20.0])
    # k = 1 beats a plain decode by (1.5 / 14) / (1 / 10) = 1.0714.
    assert best_length(confidences, curve, min_gain=1.07) == (1, pytest.approx(1.5))
    assert best_length(confidences, curve, min_gain=1.08) == (0, 1.0)
    assert best_length(confidences, curve, min_gain=1.0)[0] == 1


def test_best_length_weak_evidence_on_a_steep_curve_drafts_nothing():
    # c = 0.5: E(k) = 2 - 0.5**k < 2, so every k loses to 1 / t(1) = 0.0909:
    # k = 1: 1.5 / 21 = 0.0714, k = 3: 1.875 / 29 = 0.0647, k = 7: 1.99 / 43 = 0.0463.
    assert best_length(np.full(64, 0.5), steep_curve()) == (0, 1.0)


def test_best_length_strong_evidence_on_a_steep_curve_drafts_several():
    # c = 0.97: E(7) = 1 + 0.97 (1 - 0.97**7) / 0.03 = 7.2086, t(8) = 43 -> 0.1676 tokens/ms;
    # neighbours: E(6) / t(7) = 6.4004 / 39.5 = 0.1620 and E(8) / t(9) = 7.9922 / 48.375 = 0.1652
    # (t interpolated: 3.5 ms/token on 4..8, 5.375 ms/token on 8..16). Plain decode: 0.0909.
    k, e = best_length(np.full(64, 0.97), steep_curve())
    assert k == 7
    assert e == pytest.approx(1 + 0.97 * (1 - 0.97**7) / 0.03)
    assert k == rate_oracle_k([0.97] * 64, steep_curve())


def test_best_length_flat_gpu_curve_drafts_long():
    curve = 10 + 0.05 * np.arange(129, dtype=np.float64)  # t(n) = 10 + 0.05 n
    # With c = 0.7 the k-th token adds 0.7**k expected tokens for 0.05 ms; at ~0.31 tokens/ms
    # that pays while 0.7**k > ~0.0155, i.e. up to k = 11 (0.7**11 = 0.0198, 0.7**12 = 0.0138):
    # rates E(10)/t(11) = 0.30971, E(11)/t(12) = 0.31011, E(12)/t(13) = 0.30996.
    # Note: NOT >= 16 -- at c = 0.7 the survival probability is already 1.4% at token 12.
    k, e = best_length(np.full(64, 0.7), curve)
    assert k == 11
    assert e == pytest.approx(1 + 0.7 * (1 - 0.7**11) / 0.3)
    # c = 0.9 keeps paying much longer (0.9**30 = 0.042): 30 tokens.
    assert best_length(np.full(64, 0.9), curve)[0] == 30 == rate_oracle_k([0.9] * 64, curve)
    # A perfectly flat curve drafts everything available: E(k) grows with every k (by 0.5**k,
    # still far above float resolution at k = 20).
    assert best_length(np.full(20, 0.5), np.full(129, 10.0))[0] == 20


def test_best_length_is_bounded_by_the_curve_and_the_evidence():
    # A curve for max_batch = 3 allows a decode of 3 tokens: at most 2 draft tokens.
    assert best_length(np.full(10, 0.9), np.full(4, 10.0))[0] == 2
    assert best_length(np.array([]), np.full(129, 10.0)) == (0, 1.0)
    assert best_length(np.full(5, 0.9), np.full(2, 10.0)) == (0, 1.0)  # max_batch = 1
    assert best_length(np.zeros(8), np.full(129, 10.0)) == (0, 1.0)  # E(k) = 1: nothing gained


# --- CostModel ---------------------------------------------------------------------------------

def test_cost_prior_without_observations():
    cost = CostModel(max_batch=16)
    # t(n) = 10 (1 + 0.4 (n - 1)): 10, 14, ..., 50 at n = 11; index 0 mirrors t(1).
    assert cost.cost_ms(1) == pytest.approx(10.0)
    assert cost.cost_ms(2) == pytest.approx(14.0)
    assert cost.cost_ms(11) == pytest.approx(50.0)
    assert cost.curve()[0] == cost.curve()[1]
    assert not cost.calibrated


def test_cost_interpolation_and_extrapolation():
    cost = steep_cost(max_batch=128)
    assert cost.calibrated
    assert [cost.cost_ms(n) for n, _ in STEEP_POINTS] == [ms for _, ms in STEEP_POINTS]
    assert cost.cost_ms(3) == pytest.approx(25.0)  # (21 + 29) / 2
    assert cost.cost_ms(6) == pytest.approx(36.0)  # 29 + 2 * 3.5
    assert cost.cost_ms(12) == pytest.approx(64.5)  # 43 + 4 * 5.375
    assert cost.cost_ms(48) == pytest.approx(221.5)  # 150 + 16 * 4.46875
    # beyond 64: half the slope from 32 (the largest size <= 64 / 2), (293 - 150) / 32 / 2
    assert cost.cost_ms(100) == pytest.approx(293 + 36 * 4.46875 / 2)
    assert cost.cost_ms(128) == pytest.approx(436.0)
    # out-of-range sizes are clamped to 1..max_batch
    assert cost.cost_ms(0) == pytest.approx(11.0)
    assert cost.cost_ms(10_000) == pytest.approx(436.0)


def test_cost_extrapolation_slope_spans_the_upper_half_of_the_sizes_seen():
    # Two sizes timed close together (25 and 26 tokens) give a slope that is mostly noise:
    # the slope is taken from the largest size at most half the largest (8), not from 25.
    cost = CostModel(max_batch=64)
    for n, ms in {1: 70.0, 8: 174.0, 25: 540.0, 26: 541.0}.items():
        cost.observe(n, ms)
    slope = (541.0 - 174.0) / (26 - 8) / 2
    assert cost.cost_ms(64) == pytest.approx(541.0 + 38 * slope)


def test_a_long_draft_is_tried_once_and_then_priced_as_timed():
    # Calibration times sizes up to 16; a long, surely accepted candidate is then drafted
    # longer than the carried-on slope would allow, and once timed its size is priced as
    # measured: the drafter keeps it only if it paid.
    def drafted_length(cost):
        index = SuffixIndex()
        text = list(range(100, 400))
        index.extend(text + text[:40])
        drafter = Drafter(cost, max_draft=64)
        for _ in range(3):  # confidence from a run of fully accepted drafts
            drafter.acceptance.update(drafter._classify(index, index.query())[1], 40, 16, 16)
        return len(drafter.propose(index, 64))

    cost = CostModel(max_batch=128)
    for n, ms in {1: 70.0, 2: 80.0, 4: 130.0, 8: 240.0, 16: 400.0}.items():
        cost.observe(n, ms)
    first = drafted_length(cost)
    assert first >= 48  # explored far past the largest timed size (22 with the slope carried on as timed)
    cost.observe(first + 1, 400.0 * (first + 1) / 16 * 1.5)  # timed: far dearer per token
    assert drafted_length(cost) <= 16


def test_cost_prior_slope_when_only_one_size_was_seen():
    cost = CostModel(max_batch=32)
    cost.observe(1, 20.0)
    # slope = prior_slope * t(1) = 0.4 * 20 = 8 ms/token
    assert cost.cost_ms(1) == pytest.approx(20.0)
    assert cost.cost_ms(6) == pytest.approx(60.0)
    assert not cost.calibrated

    only_four = CostModel(max_batch=32)
    only_four.observe(4, 40.0)
    # below the smallest seen size: proportional (40 * n / 4); beyond: 0.4 * 40 / 4 = 4 ms/token
    assert [only_four.cost_ms(n) for n in (1, 2, 3, 4, 5, 10)] == pytest.approx([10, 20, 30, 40, 44, 64])


def test_cost_windowed_median_update():
    cost = CostModel(max_batch=8, window=3)
    cost.observe(4, 40.0)
    assert cost.cost_ms(4) == pytest.approx(40.0)  # first observation taken as is
    cost.observe(4, 500.0)  # a spike (another process took the core)
    assert cost.cost_ms(4) == pytest.approx(270.0)  # median of two = their mean
    cost.observe(4, 42.0)
    assert cost.cost_ms(4) == pytest.approx(42.0)  # median of 40, 500, 42: the spike is ignored
    cost.observe(4, 44.0)  # window of 3: 500, 42, 44
    cost.observe(4, 46.0)  # 42, 44, 46: the spike has left the window
    assert cost.cost_ms(4) == pytest.approx(44.0)
    assert not cost.calibrated  # still one size
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        CostModel(window=0)


@pytest.mark.parametrize(
    "n_tokens, ms", [(0, 5.0), (9, 5.0), (-1, 5.0), (2, 0.0), (2, -3.0), (2, float("nan")), (2, float("inf"))]
)
def test_cost_ignores_bad_observations(n_tokens, ms):
    cost = CostModel(max_batch=8)
    cost.observe(1, 10.0)
    before = cost.curve().copy()
    cost.observe(n_tokens, ms)
    np.testing.assert_array_equal(cost.curve(), before)
    assert not cost.calibrated


def test_cost_curve_is_monotone():
    cost = CostModel(max_batch=16)
    cost.observe(2, 30.0)  # noisy: dearer than 4 tokens -> capped at 20
    cost.observe(4, 20.0)
    curve = cost.curve()
    assert cost.cost_ms(1) == pytest.approx(10.0)  # 20 * 1 / 2
    assert [cost.cost_ms(n) for n in (2, 3, 4, 10)] == pytest.approx([20, 20, 20, 20])  # slope 0
    assert np.all(np.diff(curve[1:]) >= 0)


def test_one_slow_outlier_does_not_raise_the_rest_of_the_curve():
    # Seen in a saved curve from a busy machine: t(2) timed once at 297 ms among t(1) = 8 and
    # t(4..16) = 25..54. Raising every larger size to 297 would have switched drafting off in
    # every later process that restored it.
    cost = CostModel(max_batch=32)
    for n, ms in {1: 8.2, 2: 297.4, 3: 30.3, 4: 25.6, 8: 31.1, 16: 54.1}.items():
        cost.observe(n, ms)
    assert cost.cost_ms(2) == pytest.approx(25.6) and cost.cost_ms(8) == pytest.approx(31.1)
    assert cost.cost_ms(16) == pytest.approx(54.1) and cost.cost_ms(1) == pytest.approx(8.2)
    assert np.all(np.diff(cost.curve()[1:]) >= 0)


def test_cost_observe_invalidates_the_cached_curve():
    cost = CostModel(max_batch=8)
    cost.observe(1, 10.0)
    assert cost.cost_ms(2) == pytest.approx(14.0)
    cost.observe(2, 11.0)
    assert cost.cost_ms(2) == pytest.approx(11.0)


def test_cost_shape_is_kept_apart_from_the_scale():
    # t(8) timed early in a request (t(1) = 10 ms), t(16) late, where attention has made
    # every decode 1.5x dearer (t(1) = 15): each size keeps its ratio to t(1) when it was timed.
    cost = CostModel(max_batch=32)
    cost.observe(1, 10.0)
    cost.observe(8, 40.0)
    for _ in range(cost.window):
        cost.observe(1, 15.0)
    cost.observe(16, 90.0)
    assert cost.cost_ms(1) == pytest.approx(15.0)
    assert cost.cost_ms(8) == pytest.approx(60.0)  # 4 x 15, not the 40 timed at t(1) = 10
    assert cost.cost_ms(16) == pytest.approx(90.0)
    # back to the start of a request: the whole curve follows the scale, the shape stays
    for _ in range(cost.window):
        cost.observe(1, 10.0)
    assert [cost.cost_ms(n) for n in (1, 8, 16)] == pytest.approx([10.0, 40.0, 60.0])


def test_cost_timings_before_any_one_token_decode_take_its_scale():
    cost = CostModel(max_batch=16)
    cost.observe(4, 40.0)  # no t(1) yet: kept as timed
    assert cost.cost_ms(4) == pytest.approx(40.0)
    cost.observe(1, 16.0)  # -> the ratio 40 / 16
    cost.observe(1, 8.0)
    cost.observe(1, 8.0)  # scale: median 8
    assert cost.cost_ms(1) == pytest.approx(8.0)
    assert cost.cost_ms(4) == pytest.approx(20.0)


def test_cost_curve_follows_the_scale_only_past_its_tolerance():
    cost = CostModel(max_batch=16, window=1)
    cost.observe(1, 10.0)
    cost.observe(8, 30.0)
    curve = cost.curve()
    cost.observe(1, 10.0 * (1 + SCALE_TOLERANCE / 2))
    assert cost.curve() is curve  # nothing the drafter decides on changed
    cost.observe(1, 10.0 * (1 + 2 * SCALE_TOLERANCE))
    assert cost.curve() is not curve
    assert cost.cost_ms(8) == pytest.approx(30.0 * (1 + 2 * SCALE_TOLERANCE))


def test_padded_batches_cost_what_their_class_costs():
    # padding (12, 16): 1..11 each its own size, 12..16 cost t(16), 17..32 t(32), ...
    cost = CostModel(max_batch=100, padding=(12, 16))
    for n, ms in ((1, 100.0), (8, 240.0), (13, 480.0), (20, 670.0), (40, 850.0)):
        cost.observe(n, ms)  # 13 is kept as 16, 20 as 32, 40 as 48
    assert cost.to_dict()["ms"] == {"1": 100.0, "8": 240.0, "16": 480.0, "32": 670.0, "48": 850.0}
    curve = cost.curve()
    assert curve[11] == pytest.approx(240.0 + 3 * (480.0 - 240.0) / 8)  # below the padding: interpolated
    assert curve[12] == curve[16] == pytest.approx(480.0)
    assert curve[17] == curve[31] == curve[32] == pytest.approx(670.0)
    assert curve[33] == curve[48] == pytest.approx(850.0)
    # past the largest class seen: extrapolated at the class tops, t(64) for 49..64
    assert curve[49] == curve[64] > curve[48]
    assert curve[97] == curve[100]  # the last class is cut at max_batch


def test_on_a_padded_curve_a_long_match_fills_the_class_it_pays_for():
    # what a request has timed: its drafts of 46 and 64 (batches of 47 and 65)
    points = ((1, 88.0), (8, 237.0), (11, 351.0), (16, 490.0), (47, 846.0), (65, 1331.0))
    padded, unpadded = CostModel(max_batch=128, padding=(12, 16)), CostModel(max_batch=128)
    for n, ms in points:
        padded.observe(n, ms)
        unpadded.observe(n, ms)
    # Unpadded, a batch of 64 is priced between 47 and 65, near t(65): a certain copy of 64
    # tokens (the drafter's default most) drafts 46 again (47 / 846 = 0.056 tokens a ms,
    # against 64 / 1304 = 0.049). Padded, 47 stands for 48 and 65 for the 80 class, and 64 is
    # interpolated between them (1088 ms): 63 drafted, 64 / 1088 = 0.059.
    assert best_length(np.full(64, 1.0), unpadded.curve()) == (46, 47.0)
    assert best_length(np.full(64, 1.0), padded.curve()) == (63, 64.0)
    # weaker evidence (0.9 a token): the top of a small class, never a size inside one
    k, _ = best_length(np.full(64, 0.9), padded.curve())
    assert k + 1 in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 32, 48, 64)


@pytest.mark.parametrize("padding", [(1, 16), (12, 0), (12.0, 16), "12:16"])
def test_cost_model_rejects_bad_padding(padding):
    with pytest.raises(ValueError, match="padding must be"):
        CostModel(padding=padding)


def test_cost_model_rejects_bad_max_batch():
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        CostModel(max_batch=0)


# --- AcceptanceModel ---------------------------------------------------------------------------

@pytest.mark.parametrize("match_length, prior", [(1, 0.30), (2, 0.30), (3, 0.50), (5, 0.50), (6, 0.65),
                                                 (11, 0.65), (12, 0.78), (23, 0.78), (24, 0.88), (500, 0.88)])
def test_acceptance_prior_by_bucket(match_length, prior):
    model = AcceptanceModel()
    assert rate(model, False, match_length) == pytest.approx(prior)
    assert rate(model, True, match_length) == pytest.approx(prior)


def test_acceptance_update_counts_only_tested_tokens():
    model = AcceptanceModel()
    # Match of 4, draft of 6, first 3 accepted: accepted tokens had match lengths 4, 5 (bucket
    # <=5) and 6 (bucket <=11); the 4th (length 7, bucket <=11) was rejected; tokens 5 and 6
    # were never tested and count for nothing.
    model.update(False, 4, drafted=6, accepted=3)
    # bucket <=5: (2 + 0.5 * 6) / (2 + 0 + 6) = 5 / 8
    assert rate(model, False, 4) == pytest.approx(5 / 8)
    # bucket <=11: (1 + 0.65 * 6) / (1 + 1 + 6) = 4.9 / 8
    assert rate(model, False, 9) == pytest.approx(4.9 / 8)
    # untouched: other buckets and the reference kind
    assert rate(model, False, 20) == pytest.approx(0.78)
    assert rate(model, True, 4) == pytest.approx(0.50)
    assert model.accepted.sum() == 3 and model.rejected.sum() == 1


def test_acceptance_update_full_accept_and_first_reject():
    model = AcceptanceModel()
    model.update(True, 1, drafted=2, accepted=2)  # lengths 1, 2: both bucket <=2, no rejection
    assert rate(model, True, 1) == pytest.approx((2 + 1.8) / (2 + 6))
    model.update(True, 1, drafted=5, accepted=0)  # one rejection at length 1, nothing else
    assert rate(model, True, 1) == pytest.approx((2 + 1.8) / (3 + 6))
    assert model.rejected.sum() == 1
    assert rate(model, False, 1) == pytest.approx(0.30)


# --- _follow_majority --------------------------------------------------------------------------

def test_follow_majority_single_occurrence_agrees_fully():
    index = SuffixIndex()
    index.extend([1, 2, 3, 4, 1, 2])
    tokens, agreement = _follow_majority(index, index.query(), depth=5)
    assert tokens == [3, 4, 1, 2, 3]  # runs into the context's end: the period 3 4 1 2 repeats
    assert agreement.tolist() == [1.0] * 5


def test_follow_majority_tie_goes_to_most_recent():
    # [1, 2] ends at 5 (then 4, 1, 2) and at 2 (then 3, 1, 2): a 1-1 split on the first token,
    # won by the more recent occurrence even though its token (4) is the larger id.
    index = SuffixIndex()
    index.extend([1, 2, 3, 1, 2, 4, 1, 2])
    match = index.query()
    assert match == Match(2, ((0, 5), (0, 2)))
    tokens, agreement = _follow_majority(index, match, depth=3)
    assert tokens == [4, 1, 2]
    assert agreement.tolist() == [0.5, 1.0, 1.0]


def test_follow_majority_counts_beat_recency():
    # Continuations (depth 3): end 10 -> [8, 1, 2], end 6 -> [7, 3, 1], end 2 -> [7, 4, 1].
    # Token 1: 7 by 2 of 3. Token 2: the two 7-rows split 3 / 4 -> the more recent (3), 1 of 2.
    # Token 3: one row left -> 1, unanimous.
    index = SuffixIndex()
    index.extend([1, 2, 7, 4, 1, 2, 7, 3, 1, 2, 8, 1, 2])
    match = index.query()
    assert match == Match(2, ((0, 10), (0, 6), (0, 2)))
    tokens, agreement = _follow_majority(index, match, depth=3)
    assert tokens == [7, 3, 1]
    assert agreement == pytest.approx([2 / 3, 1 / 2, 1.0])


def test_follow_majority_ended_occurrences_leave_the_vote():
    # Continuations: [5] (source ends), [5, 6, 7], [4, 6, 7].
    # Token 1: 5 by 2 of 3. Token 2: only one of the two 5-rows continues -> 6, 1 of 1.
    index = SuffixIndex()
    for ref in ([1, 5], [1, 5, 6, 7], [1, 4, 6, 7]):
        index.add_reference(ref)
    match = Match(1, ((1, 1), (2, 1), (3, 1)))
    tokens, agreement = _follow_majority(index, match, depth=4)
    assert tokens == [5, 6, 7]
    assert agreement == pytest.approx([2 / 3, 1.0, 1.0])


def test_follow_majority_of_one_token_is_the_first_token_of_a_longer_one():
    # The one-token path (a dict count, used for the free evidence after a plain decode) must
    # pick what the general path picks first, with the same agreement and the same tie-breaks.
    # Half the cases have a reference and the prompt marked, so that even splits go by tie rank.
    rng = np.random.default_rng(7)
    for case in range(300):
        index = SuffixIndex()
        if case % 2:
            index.add_reference(rng.integers(0, 4, size=int(rng.integers(4, 20))).tolist())
        index.extend(rng.integers(0, 4, size=int(rng.integers(8, 60))).tolist())
        if case % 2:
            index.begin_output()
            index.extend(rng.integers(0, 4, size=int(rng.integers(1, 20))).tolist())
        match = index.query()
        if match is None:
            continue
        one_tokens, one_agreement = _follow_majority(index, match, 1)
        longer_tokens, longer_agreement = _follow_majority(index, match, 3)
        assert one_tokens == longer_tokens[:1]
        assert one_agreement.tolist() == pytest.approx(longer_agreement[:1].tolist())


def test_follow_majority_unanimous_prefix_then_split():
    # Continuations: [1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 5, 9].
    # Token 1: unanimous. Token 2: 2 vs 5, two each -> 2 (preferred row first), 2 of 4.
    # Token 3: 3 vs 4 -> 3, 1 of 2.
    index = SuffixIndex()
    for ref in ([0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 5, 6], [0, 1, 5, 9]):
        index.add_reference(ref)
    match = Match(1, ((1, 1), (2, 1), (3, 1), (4, 1)))
    tokens, agreement = _follow_majority(index, match, depth=3)
    assert tokens == [1, 2, 3]
    assert agreement == pytest.approx([1.0, 0.5, 0.5])
    # A majority not led by the preferred row: continuations [9, 9], [8, 7], [8, 6].
    index = SuffixIndex()
    for ref in ([0, 9, 9], [0, 8, 7], [0, 8, 6]):
        index.add_reference(ref)
    tokens, agreement = _follow_majority(index, Match(1, ((1, 1), (2, 1), (3, 1))), depth=2)
    assert tokens == [8, 7]
    assert agreement == pytest.approx([2 / 3, 0.5])


def test_follow_majority_split_prefers_output_then_reference_then_prompt():
    # Prompt [1, 2, 3, 9, 1] (output begins after it), reference [1, 2, 4]; the suffix [1]
    # occurs at context end 1 (in the prompt, then 2, 3) and reference end 1 (then 2, 4).
    # Token 1: unanimous 2. Token 2: 3 (prompt) against 4 (reference), one each: the
    # reference wins, though the prompt's occurrence is preferred by recency.
    index = SuffixIndex()
    ref = index.add_reference([1, 2, 4])
    index.extend([1, 2, 3, 9, 1])
    index.begin_output()
    match = Match(1, ((0, 1), (ref, 1)))
    assert [index.tie_rank(p) for p in match.positions] == [2, 1]
    tokens, agreement = _follow_majority(index, match, depth=2)
    assert tokens == [2, 4]
    assert agreement == pytest.approx([1.0, 0.5])
    # Output tokens [2, 5, 1]: the occurrence at context end 5 (the prompt's last token) is
    # followed by the model's own text, and wins a three-way split.
    index.extend([2, 5, 1])
    match = Match(1, ((0, 5), (ref, 1), (0, 1)))
    assert [index.tie_rank(p) for p in match.positions] == [0, 1, 2]
    tokens, agreement = _follow_majority(index, match, depth=2)
    assert tokens == [2, 5]
    assert agreement == pytest.approx([1.0, 1 / 3])
    # Without begin_output the whole context ranks as output: recency decides, as before.
    index = SuffixIndex()
    ref = index.add_reference([1, 2, 4])
    index.extend([1, 2, 3, 9, 1])
    assert _follow_majority(index, Match(1, ((0, 1), (ref, 1))), depth=2)[0] == [2, 3]
    # A one-token count splits evenly between the prompt's 7 and the reference's 8.
    index = SuffixIndex()
    ref = index.add_reference([6, 8])
    index.extend([6, 7, 6])
    index.begin_output()
    tokens, agreement = _follow_majority(index, Match(1, ((0, 1), (ref, 1))), depth=1)
    assert tokens == [8]
    assert agreement == pytest.approx([0.5])
    index.reset()
    assert index.output_start is None


# --- Drafter.propose / record ------------------------------------------------------------------

SEQ = list(range(100, 140))  # 40 distinct tokens
REPEAT = SEQ + SEQ[:10]  # suffix SEQ[:10] matches at end 10 with length 10 (39 != 139 before it)


def repeat_index():
    index = SuffixIndex()
    index.extend(REPEAT)
    assert index.query() == Match(10, ((0, 10),))
    return index


@pytest.mark.parametrize("limit, n_tokens", [(1, 1), (3, 3), (16, 16), (40, 40), (100, 64)])
def test_propose_flat_curve_drafts_the_continuation(limit, n_tokens):
    drafter = Drafter(linear_cost(10.0, 0.0))  # constant cost: any extra token is free
    draft = drafter.propose(repeat_index(), limit)
    # 40 tokens up to the end of the context, then the same period again; max_draft 64
    continuation = (SEQ[10:] + SEQ[:10]) * 2
    assert draft.tokens == continuation[:n_tokens]
    assert draft.match_length == 10 and not draft.from_reference


def test_propose_expected_tokens_uses_the_length_buckets():
    # Match length 10: draft tokens sit at lengths 10, 11 (prior 0.65) and 12 (prior 0.78).
    draft = Drafter(linear_cost(10.0, 0.0)).propose(repeat_index(), 3)
    assert draft.expected_tokens == pytest.approx(1 + 0.65 + 0.65**2 + 0.65**2 * 0.78)  # 2.40205


def test_propose_multiplies_agreement_into_confidence():
    # Match of 2 (prior 0.30), then lengths 3, 4 (prior 0.50); tokens [7, 3, 1] with agreement
    # [2/3, 1/2, 1] (see test_follow_majority_counts_beat_recency): c = [0.2, 0.25, 0.5],
    # E(3) = 1 + 0.2 + 0.05 + 0.025 = 1.275.
    index = SuffixIndex()
    index.extend([1, 2, 7, 4, 1, 2, 7, 3, 1, 2, 8, 1, 2])
    draft = Drafter(linear_cost(10.0, 0.0)).propose(index, 3)
    assert draft.tokens == [7, 3, 1]
    assert draft.expected_tokens == pytest.approx(1.275)


@pytest.mark.parametrize(
    "drafter_kwargs, cost_kwargs, n_tokens",
    [({"max_draft": 4}, {}, 4), ({"max_draft": 0}, {}, 0), ({}, {"max_batch": 6}, 5), ({}, {"max_batch": 1}, 0)],
)
def test_propose_limit_caps(drafter_kwargs, cost_kwargs, n_tokens):
    drafter = Drafter(linear_cost(10.0, 0.0, **cost_kwargs), **drafter_kwargs)
    assert len(drafter.propose(repeat_index(), 100)) == n_tokens
    assert len(drafter.propose(repeat_index(), 0)) == 0
    assert len(drafter.propose(repeat_index(), -5)) == 0


def test_propose_nothing_without_a_match():
    index = SuffixIndex()
    index.extend([1, 2, 3])
    assert Drafter(linear_cost(10.0, 0.0)).propose(index, 8) == EMPTY_DRAFT
    assert Drafter(linear_cost(10.0, 0.0)).propose(SuffixIndex(), 8) == EMPTY_DRAFT


def test_propose_steep_curve_short_match_no_history_drafts_nothing():
    index = SuffixIndex()
    index.extend([5, 1, 2, 7, 1, 2])  # match of 2 at end 3: continuation [7, 1, 2]
    # prior 0.30 for the first token: E(1) / t(2) = 1.3 / 21 = 0.062 < 1 / 11 = 0.091
    assert len(Drafter(steep_cost()).propose(index, 8)) == 0
    # the same evidence on a free curve does draft (so the zero above is the curve's doing)
    assert Drafter(linear_cost(10.0, 0.0)).propose(index, 8).tokens == [7, 1, 2, 7, 1, 2, 7, 1]


def test_drafts_stop_at_an_end_of_generation_token():
    """A copy of a prompt document runs on into the chat template: its end-of-turn token,
    then the next turn. Nothing after an end-of-generation token can be emitted, so the
    draft ends with it."""
    stop = SEQ[15]
    drafter = Drafter(linear_cost(10.0, 0.0), is_stop={stop}.__contains__)
    draft = drafter.propose(repeat_index(), 40)
    assert draft.tokens == SEQ[10:16]  # through the stop token, not past it
    # without it, the same draft runs to the limit
    assert Drafter(linear_cost(10.0, 0.0)).propose(repeat_index(), 40).tokens == SEQ[10:] + SEQ[:10]
    # a stop token first: a draft of that token alone
    first = Drafter(linear_cost(10.0, 0.0), is_stop={SEQ[10]}.__contains__).propose(repeat_index(), 40)
    assert first.tokens == [SEQ[10]]


@pytest.mark.parametrize("prev, piece, brk", [
    (b"ok.", b" The", True), (b".\n\n", b"The", True), (b"done!", b"\n", True), (b'said."', b" He", True),
    (b"why?)", b" So", True), (b"os.", b"path", False), (b"8.", b"50", False), (b" times", b".", False),
    (b".", b"", False), (b" the", b" end", False), (b"", b" The", False),
])
def test_sentence_break_needs_a_sentence_end_and_a_space(prev, piece, brk):
    from lookahead.drafter.policy import sentence_break

    assert sentence_break(prev, piece) is brk


def test_a_candidate_token_starting_a_sentence_gets_at_most_the_boundary_rate(monkeypatch):
    from lookahead.drafter import priors

    monkeypatch.setattr(priors, "_PRIOR_BOUNDARY", 0.4)
    monkeypatch.setattr(priors, "_BOUNDARY_STRENGTH", 1.0)
    pieces = {SEQ[14]: b" ok."}  # every other token: a word with its space
    piece = lambda t: pieces.get(t, b" w")  # noqa: E731
    draft = Drafter(linear_cost(10.0, 0.0), piece=piece).propose(repeat_index(), 8)
    assert draft.tokens == SEQ[10:18]
    # match lengths 10, 11 (prior 0.65), then 0.78; SEQ[15] starts a sentence: min(0.78, 0.4)
    c = np.cumprod([0.65, 0.65, 0.78, 0.78, 0.78, 0.4, 0.78, 0.78])
    assert draft.expected_tokens == pytest.approx(1 + c.sum())
    plain = Drafter(linear_cost(10.0, 0.0)).propose(repeat_index(), 8)
    assert plain.expected_tokens == pytest.approx(1 + np.cumprod([0.65, 0.65] + [0.78] * 6).sum())


def test_the_boundary_rate_learns_from_verified_tokens_only():
    model = AcceptanceModel()
    after = [False, True, False, True]
    model.update_boundaries(after, accepted=1, tested=4)  # token 1, a sentence's start, refuted
    assert (model.boundary_accepted, model.boundary_rejected) == (0, 1)
    model.update_boundaries(after, accepted=3, tested=4)  # token 1 kept, token 3 refuted
    assert (model.boundary_accepted, model.boundary_rejected) == (1, 2)
    model.update_boundaries(after, accepted=4, tested=4)
    assert (model.boundary_accepted, model.boundary_rejected) == (3, 2)
    model.update_boundaries(after, accepted=0, tested=4)  # refuted before any boundary: no evidence
    assert (model.boundary_accepted, model.boundary_rejected) == (3, 2)


def test_a_copy_through_sentence_ends_lifts_the_boundary_rate():
    """A draft accepted through a sentence's start is evidence (record), and so is the emitted
    text continuing through one after a draft (the free evidence at the next step)."""
    piece = lambda t: b" ok." if t == SEQ[14] else b" w"  # noqa: E731
    drafter = Drafter(linear_cost(10.0, 0.0), piece=piece)
    index = repeat_index()
    before = drafter.acceptance.boundary_rate()
    draft = drafter.propose(index, 8)
    drafter.record(draft, len(draft), None)
    assert drafter.acceptance.boundary_accepted == 1 and drafter.acceptance.boundary_rate() > before
    index.extend(SEQ[10:19])  # the draft, then the bonus token
    drafter.propose(index, 8)
    assert drafter.acceptance.boundary_accepted == 1  # the bonus token starts no sentence


def test_propose_from_a_reference():
    index = SuffixIndex()
    index.add_reference(SEQ)
    index.extend([1, 2, 3] + SEQ[:10])
    draft = Drafter(linear_cost(10.0, 0.0)).propose(index, 5)
    assert draft.tokens == SEQ[10:15]
    assert draft.match_length == 10 and draft.from_reference


def full_accepts(drafter, times, n_tokens=30, match_length=10):
    for _ in range(times):
        drafter.record(Draft(list(range(n_tokens)), match_length, False, 1.0), n_tokens)


def test_record_full_acceptances_lengthen_drafts_on_a_steep_curve():
    drafter = Drafter(steep_cost())
    # prior 0.65 at length 10: E(1) / t(2) = 1.65 / 21 = 0.079 < 0.091 -> no draft
    assert len(drafter.propose(repeat_index(), 64)) == 0
    full_accepts(drafter, 10)  # 10 drafts x 30 tokens from a match of 10, all accepted
    # bucket <=11: 20 accepted -> (20 + 3.9) / 26 = 0.9192; bucket <=23: 120 -> 124.68 / 126
    # = 0.9895; bucket >23: 160 -> 165.28 / 166 = 0.9957.
    rates = [rate(drafter.acceptance, False, 10 + i) for i in range(40)]
    assert rates[0] == pytest.approx(23.9 / 26)
    assert rates[2] == pytest.approx(124.68 / 126)
    assert rates[14] == pytest.approx(165.28 / 166)
    draft = drafter.propose(repeat_index(), 64)
    assert len(draft) == rate_oracle_k(rates, steep_cost().curve()) == 31
    assert draft.tokens == (SEQ[10:] + SEQ[:10])[:31]


def test_record_moves_drafts_both_ways_on_a_gpu_curve():
    def propose_len(drafter):
        return len(drafter.propose(repeat_index(), 64))

    prior_rates = [0.65, 0.65] + [0.78] * 12 + [0.88] * 26  # match lengths 10 .. 49
    curve = linear_cost(10.05, 0.05).curve()  # t(n) = 10 + 0.05 n
    fresh = Drafter(linear_cost(10.05, 0.05))
    assert propose_len(fresh) == rate_oracle_k(prior_rates, curve) == 16

    trusted = Drafter(linear_cost(10.05, 0.05))
    full_accepts(trusted, 10)
    assert propose_len(trusted) == 64  # everything available (the period repeats past 40)

    burned = Drafter(linear_cost(10.05, 0.05))
    for _ in range(5):  # first token rejected every time: one rejection each at length 10
        burned.record(Draft(list(range(30)), 10, False, 1.0), 0)
    # bucket <=11: 3.9 / (5 + 6) = 0.3545, other buckets untouched
    burned_rates = [3.9 / 11] * 2 + prior_rates[2:]
    assert propose_len(burned) == rate_oracle_k(burned_rates, curve) == 12

    burned.reset()  # a new request forgets the history but keeps the cost curve
    assert propose_len(burned) == 16


def test_record_ignores_empty_drafts_and_keeps_kinds_apart():
    drafter = Drafter(linear_cost(10.0, 0.0))
    drafter.record(EMPTY_DRAFT, 0)
    assert drafter.acceptance.accepted.sum() == 0 and drafter.acceptance.rejected.sum() == 0
    drafter.record(Draft([1, 2], 3, True, 1.0), 1)
    assert rate(drafter.acceptance, True, 3) == pytest.approx((1 + 3) / (2 + 6))
    assert rate(drafter.acceptance, False, 3) == pytest.approx(0.5)


def test_drafter_rejects_negative_max_draft():
    with pytest.raises(ValueError, match="max_draft must be >= 0, got -1"):
        Drafter(CostModel(), max_draft=-1)


# --- tree drafts ------------------------------------------------------------------------------
# Context: the suffix [1, 2, 3] occurred twice before, continuing [10, 11, 12] (older) and
# [20, 21, 22] (newer). Match length 3 (bucket <= 5: prior 0.50; then 0.65 from length 6).
FORK = [1, 2, 3, 10, 11, 12, 7, 1, 2, 3, 20, 21, 22, 8, 1, 2, 3]


def fork_index(extra=()):
    index = SuffixIndex()
    index.extend(list(extra) + FORK)
    return index


def check_topological(draft):
    assert draft.parents is not None and len(draft.parents) == len(draft.tokens)
    assert all(-1 <= p < j for j, p in enumerate(draft.parents))


def test_tree_drafts_stop_at_an_end_of_generation_token():
    # FORK's branches [10, 11, 12, ...] and [20, 21, 22, ...]; 11 ends generation.
    drafter = Drafter(linear_cost(10.0, 0.0), tree_width=2, is_stop={11}.__contains__)
    draft = drafter.propose(fork_index(), 64)
    check_topological(draft)
    assert 11 in draft.tokens and 20 in draft.tokens
    stop = draft.tokens.index(11)
    assert stop not in draft.parents  # nothing follows the stop token
    assert 12 not in draft.tokens
    # without it, that branch goes on
    assert 12 in Drafter(linear_cost(10.0, 0.0), tree_width=2).propose(fork_index(), 64).tokens


def test_tree_on_a_flat_curve_takes_both_branches():
    drafter = Drafter(linear_cost(10.0, 0.0), tree_width=2)  # extra tokens are free
    draft = drafter.propose(fork_index(), 64)
    check_topological(draft)
    roots = [draft.tokens[j] for j, p in enumerate(draft.parents) if p == -1]
    assert roots == [20, 10]  # equal counts: the newer occurrence first
    # each branch is followed down its own occurrence
    def branch(first):
        j = draft.tokens.index(first)
        out = [first]
        while True:
            kids = [c for c, p in enumerate(draft.parents) if p == j]
            if not kids:
                return out
            j = kids[0]
            out.append(draft.tokens[j])
    assert branch(20)[:5] == [20, 21, 22, 8, 1]
    assert branch(10)[:5] == [10, 11, 12, 7, 1]
    # E = 1 + sum of reach probabilities; the first level: 0.5 * 1/2 each
    assert draft.expected_tokens > 1.5


def test_tree_width_one_is_the_chain_drafter():
    chain = Drafter(linear_cost(10.0, 0.0)).propose(fork_index(), 64)
    assert chain.parents is None and chain.tokens[:3] == [20, 21, 22]
    forced = Drafter(linear_cost(10.0, 0.0), tree_width=4).propose(fork_index(), 64, tree=False)
    assert forced == chain


def test_tree_never_has_more_leaves_than_its_width():
    extra = [1, 2, 3, 30, 31, 32, 9]  # a third, oldest continuation
    for width in (2, 3):
        draft = Drafter(linear_cost(10.0, 0.0), tree_width=width).propose(fork_index(extra), 64)
        check_topological(draft)
        leaves = [j for j in range(len(draft)) if j not in draft.parents]
        assert len(leaves) == width
    wide = Drafter(linear_cost(10.0, 0.0), tree_width=3).propose(fork_index(extra), 64)
    assert sorted(draft_tok for draft_tok, p in zip(wide.tokens, wide.parents) if p == -1) == [10, 20, 30]


def test_tree_on_a_steep_curve_drafts_nothing_from_weak_evidence():
    # reach of each first token 0.5 * 1/2 = 0.25: no branch pays for a second row at t(2) = 21 ms
    assert Drafter(steep_cost(), tree_width=4).propose(fork_index(), 64) == EMPTY_DRAFT


def test_one_occurrence_gives_a_chain_even_with_tree_width():
    draft = Drafter(linear_cost(10.0, 0.0), tree_width=4).propose(repeat_index(), 64)
    assert draft.parents is None and draft.tokens[:3] == SEQ[10:13]


def test_tree_size_follows_the_cost_curve():
    """Growing a tree stops where the next node's reach no longer pays its row."""
    lengths = [len(Drafter(linear_cost(10.0, slope), tree_width=2).propose(fork_index(), 64))
               for slope in (0.1, 0.5, 1.0, 3.0)]
    print("tree sizes for slopes 0.1, 0.5, 1, 3 ms per token:", lengths)
    assert lengths[0] > lengths[1] > lengths[2] > 0 and lengths[3] == 0  # 3 ms: 1.25 / 13 < 1 / 10


def test_record_tree_counts_a_failure_only_where_the_tree_offered_a_child():
    tree = Draft([20, 10, 21], 3, False, 2.0, parents=(-1, -1, 0))
    drafter = Drafter(linear_cost(10.0, 0.0), tree_width=2)
    drafter.record(tree, 0, [])  # the root's children both missed: one rejection at length 3
    assert drafter.acceptance.rejected[0].sum() == 1 and drafter.acceptance.accepted[0].sum() == 0
    drafter.reset()
    drafter.record(tree, 1, [1])  # took 10, a leaf: one acceptance, no test at the next level
    assert drafter.acceptance.rejected[0].sum() == 0 and drafter.acceptance.accepted[0].sum() == 1
    drafter.reset()
    drafter.record(tree, 1, [0])  # took 20, whose child 21 then missed
    assert drafter.acceptance.rejected[0].sum() == 1 and drafter.acceptance.accepted[0].sum() == 1


def test_tree_width_must_be_positive():
    with pytest.raises(ValueError, match="tree_width must be >= 1, got 0"):
        Drafter(linear_cost(10.0, 0.0), tree_width=0)


# --- CostModel persistence ----------------------------------------------------------------------

def test_cost_model_round_trips_through_json():
    import json

    cost = steep_cost(max_batch=128)
    cost.observe(2, 25.0)  # window median of 21 and 25: 23
    saved = json.loads(json.dumps(cost.to_dict()))
    assert saved == {"max_batch": 128, "ms": {"1": 11.0, "2": 23.0, "4": 29.0, "8": 43.0, "16": 86.0,
                                                "32": 150.0, "64": 293.0}}
    restored = CostModel.from_dict(saved)
    assert restored.calibrated and restored.max_batch == 128
    np.testing.assert_allclose(restored.curve(), cost.curve())
    # a different max_batch (another context size): the points are kept where they fit
    small = CostModel.from_dict(saved, max_batch=16)
    assert small.max_batch == 16 and small.cost_ms(16) == pytest.approx(86.0)


def test_restored_curve_is_kept_when_real_decodes_agree():
    restored = CostModel.from_dict(steep_cost().to_dict())
    for n, ms in ((1, 12.0), (8, 40.0), (1, 10.5)):  # within 1.5x of 11 and 43
        restored.observe(n, ms)
    assert not restored.needs_calibration
    # the untouched sizes keep their shape, t(64) / t(1) = 293 / 11; the scale is the median
    # of 11, 12, 10.5 (the curve follows it once it moved by more than SCALE_TOLERANCE)
    assert restored.cost_ms(64) / restored.cost_ms(1) == pytest.approx(293.0 / 11.0)
    assert restored.cost_ms(1) == pytest.approx(11.0, rel=SCALE_TOLERANCE)


def test_restored_curve_is_dropped_when_its_shape_disagrees():
    restored = CostModel.from_dict(steep_cost().to_dict())
    restored.observe(1, 30.0)  # the scale of this process: t(8) should be 43 / 11 * 30 = 117
    restored.observe(8, 300.0)  # 2.56x the restored shape: another machine, build or setting
    restored.observe(1, 31.0)
    restored.observe(16, 20.0)  # a spike the other way
    assert not restored.needs_calibration  # two checks are not enough yet
    restored.observe(4, 250.0)  # median of the ratios 2.56, 0.08, 3.1 = 2.56 > 1.5
    assert restored.needs_calibration and not restored.calibrated
    assert restored.to_dict()["ms"] == {}
    restored.observe(1, 30.0)  # from here on it learns as a fresh model (no more probation)
    restored.observe(2, 60.0)
    assert restored.calibrated and restored.cost_ms(2) == pytest.approx(60.0)


def test_restored_curve_follows_a_machine_that_is_slower_as_a_whole():
    """t(1) 2.7x the saved one (a busier machine, a longer context) with the same shape: the
    curve is kept, at this process's scale; the restored t(1) does not linger in the median."""
    restored = CostModel.from_dict(steep_cost().to_dict())
    for n, ms in ((1, 30.0), (8, 117.0), (1, 31.0), (16, 240.0), (1, 30.0), (4, 80.0)):
        restored.observe(n, ms)
    assert not restored.needs_calibration
    assert restored.cost_ms(1) == pytest.approx(30.0)
    assert restored.cost_ms(64) / restored.cost_ms(1) == pytest.approx(293.0 / 11.0)


def test_restored_curve_keeps_no_batch_timing_taken_before_this_process_has_a_scale():
    restored = CostModel.from_dict(steep_cost().to_dict())
    restored.observe(8, 500.0)  # no t(1) of this process yet: nothing to hold it against
    assert restored.to_dict()["ms"]["8"] == 43.0 and not restored.needs_calibration
    restored.observe(1, 11.0)
    restored.observe(8, 43.0)
    assert restored.cost_ms(8) == pytest.approx(43.0)


def test_a_restored_curve_keeps_its_points_in_their_padded_classes():
    # a curve saved before padding was known (sizes inside classes): each lands in its class
    saved = {"max_batch": 128, "ms": {"1": 100.0, "8": 240.0, "15": 480.0, "47": 850.0}}
    restored = CostModel.from_dict(saved, padding=(12, 16))
    assert restored.to_dict()["ms"] == {"1": 100.0, "8": 240.0, "16": 480.0, "48": 850.0}
    assert restored.cost_ms(40) == restored.cost_ms(48) == pytest.approx(850.0)
    restored.observe(1, 100.0)  # this process's scale
    restored.observe(33, 860.0)  # a real decode in the 48 class checks the restored figure
    assert restored._checks == [pytest.approx(860.0 / 850.0)]


@pytest.mark.parametrize("data", [{}, {"ms": {}}, {"max_batch": 8, "ms": [1, 2]}, {"max_batch": "x", "ms": {}},
                                  None, {"max_batch": 8, "ms": {"one": 3.0}}])
def test_from_dict_names_what_is_wrong(data):
    with pytest.raises(ValueError, match="not a saved cost curve"):
        CostModel.from_dict(data)


def test_from_dict_skips_unusable_points():
    restored = CostModel.from_dict({"max_batch": 8, "ms": {"1": 10.0, "2": -1.0, "99": 5.0, "4": float("inf")}})
    assert restored.to_dict() == {"max_batch": 8, "ms": {"1": 10.0}}


# --- free evidence -------------------------------------------------------------------------------

def test_a_declined_candidate_is_still_evidence():
    # Steep curve, match of 10 (prior 0.65): no draft. The engine then emits one token.
    drafter = Drafter(steep_cost())
    index = repeat_index()
    assert len(drafter.propose(index, 64)) == 0
    index.extend([SEQ[10]])  # the token the candidate predicted
    drafter.propose(index, 64)  # learns before proposing: one acceptance at length 10
    assert drafter.acceptance.accepted[0].sum() == 1 and drafter.acceptance.rejected[0].sum() == 0
    assert rate(drafter.acceptance, 0, 10) == pytest.approx((1 + 0.65 * 6) / (1 + 6))
    index.extend([7])  # the candidate now predicted SEQ[12] at length 11
    drafter.propose(index, 64)
    assert drafter.acceptance.rejected[0].sum() == 1
    assert rate(drafter.acceptance, 0, 11) == pytest.approx((1 + 0.65 * 6) / (2 + 6))


def test_free_evidence_does_not_double_count_a_draft():
    drafter = Drafter(linear_cost(10.0, 0.0))
    index = repeat_index()
    draft = drafter.propose(index, 5)
    assert draft.tokens == SEQ[10:15]
    drafter.record(draft, 5)  # all five accepted (lengths 10..14)
    index.extend(SEQ[10:16])  # ... and the bonus token (the candidate, capped at 5, had no sixth)
    drafter.propose(index, 5)
    # record() counted 5 and the free evidence nothing more
    assert drafter.acceptance.accepted[0].sum() == 5 and drafter.acceptance.rejected[0].sum() == 0
    # a draft rejected part-way: record() counts the rejection, the emitted correction adds nothing
    drafter = Drafter(linear_cost(10.0, 0.0))
    index = repeat_index()
    draft = drafter.propose(index, 5)
    drafter.record(draft, 2)
    index.extend(SEQ[10:12] + [7])
    drafter.propose(index, 5)
    assert drafter.acceptance.accepted[0].sum() == 2 and drafter.acceptance.rejected[0].sum() == 1


def test_free_evidence_needs_the_same_growing_index():
    drafter = Drafter(steep_cost())
    drafter.propose(repeat_index(), 64)
    drafter.propose(repeat_index(), 64)  # another index: nothing to compare
    other = repeat_index()
    drafter.propose(other, 64)
    drafter.propose(other, 64)  # nothing emitted in between
    assert drafter.acceptance.accepted.sum() == 0 and drafter.acceptance.rejected.sum() == 0


def test_candidate_and_note_drafted_feed_the_same_learning():
    drafter = Drafter(steep_cost())
    index = repeat_index()
    cand = drafter.candidate(index, 8)
    assert cand.tokens == (SEQ[10:] + SEQ[:10])[:8] and cand.match_length == 10 and cand.kind == 0
    drafter.note_drafted(3)  # a caller drafted three of them and recorded them itself
    drafter.record(Draft(cand.tokens[:3], 10, False, 1.0), 3)
    index.extend(SEQ[10:14])
    assert drafter.candidate(index, 8).match_length == 14
    assert drafter.acceptance.accepted[0].sum() == 4  # 3 recorded + the bonus token, free
    assert drafter.candidate(SuffixIndex(), 8) is None


def test_draft_names_the_source_it_copies_from():
    index = SuffixIndex()
    index.add_reference([9, 9])
    index.add_reference(SEQ)
    index.extend([1, 2, 3] + SEQ[:10])
    draft = Drafter(linear_cost(10.0, 0.0)).propose(index, 5)
    assert draft.source == 2 and draft.kind == 1 and draft.from_reference
    assert Drafter(linear_cost(10.0, 0.0)).propose(repeat_index(), 5).source == 0


def test_a_contended_drafter_prices_batches_higher():
    cost = CostModel(max_batch=16)
    for n, ms in {1: 8.0, 2: 12.0, 8: 27.0, 16: 45.0}.items():
        cost.observe(n, ms)
    drafter = Drafter(cost)
    assert np.array_equal(drafter._curve(), cost.curve())
    drafter.batch_cost_factor = 1.4  # the llama.cpp adapter's, while contended
    assert drafter._curve()[1] == cost.curve()[1]
    assert drafter._curve()[8] == pytest.approx(27.0 * 1.4)
    # a draft worth it on the quiet curve is declined on the contended one
    confidences = np.full(8, 0.8)
    assert best_length(confidences, cost.curve(), 1.1)[0] > 0
    assert best_length(confidences, drafter._curve(), 1.1)[0] == 0
    drafter.reset()
    assert drafter.batch_cost_factor == 1.0


# --- rejoining a source after an edit point, and learned substitutions ------------------------

def _step_through(drafter, index, output, limit=40):
    """Feed `output` one token at a time as the engine would after plain decodes; the
    candidate before each token."""
    cands = []
    for token in output:
        cands.append(drafter.candidate(index, limit))
        index.extend([token])
    return cands


def test_a_short_match_just_after_where_a_copy_left_its_source_is_a_rejoin():
    from lookahead.drafter import CONTEXT_KIND, REJOIN_KIND

    source = list(range(100, 160))
    index = SuffixIndex()
    index.extend([1, *source, 2])
    drafter = Drafter(steep_cost())
    # Copy 100..119, write 500 501 instead of 120, then go on with 121 122 123
    cands = _step_through(drafter, index, [*source[:20], 500, 501, 121, 122, 123])
    assert cands[10].kind == CONTEXT_KIND and cands[10].tokens[:3] == [110, 111, 112]
    # after 121 (a match of 1) and 121 122 (of 2), near the anchor at 120: rejoins
    assert cands[23].kind == REJOIN_KIND and cands[23].tokens[:2] == [122, 123]
    assert cands[24].kind == REJOIN_KIND and cands[24].match_length == 2
    # the change was learned: 120 -> 500 501
    assert drafter.rules == {(120,): (500, 501)}


def test_a_match_far_from_the_anchor_is_not_a_rejoin():
    from lookahead.drafter import CONTEXT_KIND

    source = list(range(100, 200))
    index = SuffixIndex()
    index.extend([1, *source, 2])
    drafter = Drafter(steep_cost())
    # Copy 100..119, write 500, then jump to 180 181 182 (60 tokens on, beyond the slack)
    cands = _step_through(drafter, index, [*source[:20], 500, 180, 181, 182])
    assert cands[-1].kind == CONTEXT_KIND and not drafter.rules


def test_a_learned_substitution_is_drafted_at_the_next_occurrence():
    # The source mentions 7 twice; the output renamed the first to 8 8 and rejoined.
    source = [*range(100, 120), 7, *range(120, 140), 7, *range(140, 150)]
    index = SuffixIndex()
    index.extend([1, *source, 2])
    drafter = Drafter(linear_cost(10.0, 0.0))  # flat: everything that matches is drafted
    output = [*range(100, 120), 8, 8, *range(120, 130)]
    _step_through(drafter, index, output)
    assert drafter.rules == {(7,): (8, 8)}
    cand = drafter.candidate(index, 20)
    # 130..139 from the source, then 8 8 where the source has 7, then the source again
    assert cand.tokens == [*range(130, 140), 8, 8, *range(140, 148)]
    assert cand.substituted == ((10, 12, (7,)),)
    draft = drafter.propose(index, 20)
    assert draft.tokens[10:12] == [8, 8]


def test_a_substitution_the_target_contradicts_is_forgotten():
    source = [*range(100, 120), 7, *range(120, 140), 7, *range(140, 150)]
    index = SuffixIndex()
    index.extend([1, *source, 2])
    drafter = Drafter(linear_cost(10.0, 0.0))
    _step_through(drafter, index, [*range(100, 120), 8, 8, *range(120, 140)])
    assert drafter.rules == {(7,): (8, 8)}
    # This time the output keeps the 7: the candidate said 8, so the rule goes
    _step_through(drafter, index, [7, 140])
    assert drafter.rules == {}
    # ... for the rest of the request: the same change seen again is not learned again
    drafter._learn_rule(index, 0, 21, 22, len(index) - 3, len(index) - 1)
    assert drafter.rules == {}


def test_a_deletion_is_not_learned():
    from lookahead.drafter import REJOIN_KIND

    source = [*range(100, 120), 7, *range(120, 140)]
    index = SuffixIndex()
    index.extend([1, *source, 2])
    drafter = Drafter(linear_cost(10.0, 0.0))
    # the output drops the 7 and rejoins at once: a rejoin, but no rule
    cands = _step_through(drafter, index, [*range(100, 120), *range(120, 126)])
    assert cands[-1].kind == REJOIN_KIND and drafter.rules == {}


def test_source_offset_maps_candidate_tokens_back_through_substitutions():
    from lookahead.drafter.rejoin import _source_offset

    spans = ((2, 4, (7,)), (6, 6, (9, 9)))  # 7 -> two tokens at 2..3; 9 9 -> nothing at 6
    assert [_source_offset(spans, i) for i in range(9)] == [0, 1, 2, 2, 3, 4, 7, 8, 9]
    assert [_source_offset((), i) for i in range(3)] == [0, 1, 2]
