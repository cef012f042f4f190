"""The target distribution: hand-computed cases per llama.cpp sampler, validation, speed paths.

An optional last test builds the real chain with llama-cpp-python's own `Llama._init_sampler`
and compares it with target_probs; it is skipped where llama_cpp is not installed.
"""
import math

import numpy as np
import pytest

from lookahead.sampling import (
    SamplingParams,
    apply_penalties,
    recent_window,
    sample_token,
    target_probs,
)

NO_FILTERS = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def as_dict(token_ids, probs):
    return {int(t): float(p) for t, p in zip(token_ids, probs)}


def logits_for(probs):
    """Logits whose softmax is probs (float32, like llama.cpp's)."""
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


# --- top_k ------------------------------------------------------------------------------------

def test_top_k_keeps_the_k_largest_and_renormalises():
    params = SamplingParams(**{**NO_FILTERS, "top_k": 2})
    got = as_dict(*target_probs([1.0, 3.0, 2.0, 0.0], params))
    e = math.e
    assert got.keys() == {1, 2}
    assert got[1] == pytest.approx(e / (e + 1), rel=1e-6)
    assert got[2] == pytest.approx(1 / (e + 1), rel=1e-6)


@pytest.mark.parametrize("top_k", [0, -1, 10])
def test_top_k_off_when_not_positive_or_larger_than_vocab(top_k):
    params = SamplingParams(**{**NO_FILTERS, "top_k": top_k})
    token_ids, probs = target_probs([1.0, 3.0, 2.0, 0.0], params)
    assert sorted(token_ids.tolist()) == [0, 1, 2, 3]


def test_top_k_tie_at_the_cutoff_keeps_the_lower_token_id():
    params = SamplingParams(**{**NO_FILTERS, "top_k": 2})
    token_ids, _ = target_probs([1.0, 2.0, 5.0, 2.0], params)
    assert sorted(token_ids.tolist()) == [1, 2]


# --- top_p ------------------------------------------------------------------------------------

@pytest.mark.parametrize("top_p, kept", [
    (0.0, {0}),        # p = 0 still keeps one token (min_keep = 1)
    (0.4, {0}),        # 0.5 >= 0.4
    (0.7, {0, 1}),     # 0.5 < 0.7, 0.8 >= 0.7: the token that crosses p is included
    (0.9, {0, 1, 2}),
    (1.0, {0, 1, 2}),  # off
])
def test_top_p_keeps_the_token_that_crosses_p(top_p, kept):
    params = SamplingParams(**{**NO_FILTERS, "top_p": top_p})
    got = as_dict(*target_probs(logits_for([0.5, 0.3, 0.2]), params))
    assert got.keys() == kept
    total = sum([0.5, 0.3, 0.2][t] for t in kept)
    for t in kept:
        assert got[t] == pytest.approx([0.5, 0.3, 0.2][t] / total, rel=1e-5)


@pytest.mark.parametrize("top_p, n_kept", [(0.5, 2), (0.75, 3)])
def test_top_p_stops_when_the_mass_equals_p(top_p, n_kept):
    # Four equal logits: the float32 running sums 0.25, 0.5, 0.75 are exact; ">= p" stops there.
    params = SamplingParams(**{**NO_FILTERS, "top_p": top_p})
    token_ids, _ = target_probs(np.zeros(4, dtype=np.float32), params)
    assert len(token_ids) == n_kept


def test_top_p_mass_is_over_the_top_k_survivors():
    # Full vocab: 0.4 < 0.5 would keep two tokens. Over the top_k = 2 survivors: 4/7 >= 0.5 keeps one.
    params = SamplingParams(**{**NO_FILTERS, "top_k": 2, "top_p": 0.5})
    token_ids, probs = target_probs(logits_for([0.4, 0.3, 0.2, 0.1]), params)
    assert token_ids.tolist() == [0] and probs.tolist() == [1.0]


def test_top_p_is_applied_before_temperature():
    # At temperature 1: 0.6 < 0.7 <= 0.9 keeps two; after temp 0.5 it would be 0.78 (one token).
    params = SamplingParams(**{**NO_FILTERS, "temperature": 0.5, "top_p": 0.7})
    got = as_dict(*target_probs(logits_for([0.6, 0.3, 0.1]), params))
    assert got.keys() == {0, 1}
    assert got[0] == pytest.approx(0.36 / 0.45, rel=1e-5)  # (p_i ** 2) renormalised
    assert got[1] == pytest.approx(0.09 / 0.45, rel=1e-5)


# --- min_p ------------------------------------------------------------------------------------

def test_min_p_is_relative_to_the_top_probability():
    # threshold 0.1 * 0.5 = 0.05: 0.04 goes, 0.2 and 0.26 stay.
    params = SamplingParams(**{**NO_FILTERS, "min_p": 0.1})
    got = as_dict(*target_probs(logits_for([0.5, 0.2, 0.04, 0.26]), params))
    assert got.keys() == {0, 1, 3}
    assert got[3] == pytest.approx(0.26 / 0.96, rel=1e-5)


def test_min_p_is_applied_before_temperature():
    # After temp 2, token 2 would be at sqrt(0.04 / 0.5) = 0.28 of the max and would survive.
    params = SamplingParams(**{**NO_FILTERS, "min_p": 0.1, "temperature": 2.0})
    token_ids, _ = target_probs(logits_for([0.5, 0.2, 0.04, 0.26]), params)
    assert sorted(token_ids.tolist()) == [0, 1, 3]


def test_min_p_zero_is_off():
    params = SamplingParams(**NO_FILTERS)
    token_ids, _ = target_probs(logits_for([0.98, 0.01, 0.01]), params)
    assert len(token_ids) == 3


# --- typical ----------------------------------------------------------------------------------

@pytest.mark.parametrize("typical_p, kept", [
    (0.2, {1}),     # the most typical token (p = 0.3), not the most likely one
    (0.5, {0, 1}),  # 0.3 <= 0.5 < 0.8
    (1.0, {0, 1, 2}),
])
def test_typical_keeps_tokens_closest_to_the_entropy(typical_p, kept):
    # H = 1.0297 nats; |-ln p - H| = 0.337, 0.174, 0.580 -> order 1, 0, 2.
    params = SamplingParams(**{**NO_FILTERS, "typical_p": typical_p})
    token_ids, _ = target_probs(logits_for([0.5, 0.3, 0.2]), params)
    assert set(token_ids.tolist()) == kept


@pytest.mark.parametrize("typical_p, n_kept", [(0.5, 3), (0.75, 4)])
def test_typical_needs_the_mass_to_exceed_p(typical_p, n_kept):
    # Four equal logits: running sums 0.25, 0.5, 0.75 are exact; typical wants "> p", not ">=".
    params = SamplingParams(**{**NO_FILTERS, "typical_p": typical_p})
    token_ids, _ = target_probs(np.zeros(4, dtype=np.float32), params)
    assert len(token_ids) == n_kept


# --- temperature ------------------------------------------------------------------------------

def test_temperature_divides_the_logits():
    params = SamplingParams(**{**NO_FILTERS, "temperature": 0.5})
    got = as_dict(*target_probs([0.0, math.log(2.0)], params))
    assert got[0] == pytest.approx(0.2, rel=1e-6) and got[1] == pytest.approx(0.8, rel=1e-6)


def test_negative_temperature_is_the_full_softmax_without_filters():
    params = SamplingParams(temperature=-1.0, top_k=1, top_p=0.1, min_p=0.9)
    got = as_dict(*target_probs(logits_for([0.5, 0.3, 0.2]), params))
    assert got == pytest.approx({0: 0.5, 1: 0.3, 2: 0.2}, rel=1e-6)


def test_default_params_chain():
    # 0.8 / 40 / 0.95 / 0.05. top_p: 0.7, 0.9, 0.93, 0.96 >= 0.95 keeps four tokens; min_p then
    # drops the 0.03s (< 0.05 * 0.7 = 0.035); temperature 0.8 sharpens the two left: p ** 1.25.
    probs = [0.7, 0.2, 0.03, 0.03, 0.02, 0.02]
    got = as_dict(*target_probs(logits_for(probs), SamplingParams()))
    sharpened = np.array([0.7, 0.2]) ** 1.25
    assert got == pytest.approx(dict(zip([0, 1], sharpened / sharpened.sum())), rel=1e-5)


# --- greedy -----------------------------------------------------------------------------------

def test_greedy_takes_the_first_of_tied_maxima_without_the_rng():
    params = SamplingParams(temperature=0.0)
    assert sample_token([1.0, 3.0, 3.0, 2.0, 0.0], params, rng=None) == 1
    token_ids, probs = target_probs([1.0, 3.0, 3.0, 2.0, 0.0], params)
    assert token_ids.tolist() == [1] and probs.tolist() == [1.0]


def test_greedy_sees_the_penalties():
    params = SamplingParams(temperature=0.0, repeat_penalty=1.1)
    assert sample_token([2.0, 1.9], params, rng=None) == 0
    assert sample_token([2.0, 1.9], params, rng=None, recent_tokens=(0,)) == 1  # 2 / 1.1 < 1.9


# --- penalties --------------------------------------------------------------------------------

def test_penalties_divide_positive_and_multiply_negative_logits():
    params = SamplingParams(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = apply_penalties([2.0, -2.0, 1.0, 0.5], [0, 1, 0], params)
    # token 0 (count 2): 2 / 2 - (2 * 0.5 + 0.25) = -0.25; token 1 (count 1): -2 * 2 - 0.75 = -4.75
    np.testing.assert_allclose(got, [-0.25, -4.75, 1.0, 0.5], rtol=1e-6)
    assert got.dtype == np.float32


def test_penalties_use_only_the_last_penalty_last_n_tokens():
    params = SamplingParams(repeat_penalty=2.0, penalty_last_n=2)
    got = apply_penalties([1.0, 1.0, 1.0], [0, 1, 2], params)
    np.testing.assert_allclose(got, [1.0, 0.5, 0.5])


def test_neutral_penalties_change_nothing_and_return_a_copy():
    logits = np.array([1.0, -1.0], dtype=np.float32)
    got = apply_penalties(logits, [0, 1], SamplingParams())
    np.testing.assert_array_equal(got, logits)
    assert got is not logits


def test_penalty_token_outside_the_vocab_is_an_error():
    with pytest.raises(ValueError, match="recent token 7"):
        apply_penalties([1.0, 2.0], [7], SamplingParams(repeat_penalty=1.1))


def test_recent_window():
    params = SamplingParams(repeat_penalty=1.1, penalty_last_n=3)
    assert recent_window([1, 2, 3, 4, 5], params) == (3, 4, 5)
    assert recent_window([1, 2, 3, 4, 5], SamplingParams()) == ()  # penalties unused
    assert recent_window([1, 2], SamplingParams(repeat_penalty=1.1, penalty_last_n=0)) == ()


def test_uses_penalties():
    assert not SamplingParams().uses_penalties
    assert SamplingParams(presence_penalty=0.1).uses_penalties
    assert not SamplingParams(repeat_penalty=1.3, penalty_last_n=0).uses_penalties
    assert not SamplingParams(repeat_penalty=1.3, penalty_last_n=-1).uses_penalties  # clamped to 0


# --- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("top_p", 1.5, "top_p must be in [0, 1], got 1.5"),
    ("min_p", -0.1, "min_p must be in [0, 1], got -0.1"),
    ("typical_p", float("nan"), "typical_p must be in [0, 1], got nan"),
    ("temperature", float("nan"), "temperature must be a finite number, got nan"),
    ("temperature", float("inf"), "temperature must be a finite number, got inf"),
    ("repeat_penalty", 0.0, "repeat_penalty must be a finite number > 0, got 0.0"),
    ("frequency_penalty", float("nan"), "frequency_penalty must be a finite number, got nan"),
    ("top_k", 2.5, "top_k must be an integer (<= 0 means no top-k), got 2.5"),
    ("penalty_last_n", 8.0, "penalty_last_n must be an integer (<= 0 means no penalties), got 8.0"),
])
def test_validation_names_the_bad_value(field, value, message):
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    assert str(error.value) == message


def test_greedy_property():
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=-1.0).greedy


def test_logits_must_be_one_row():
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        target_probs(np.zeros((2, 2)), SamplingParams())


# --- large vocabularies: the fast paths give what a plain full sort gives -------------------------

def reference_top_p_min_p(logits, top_p, min_p):
    """Straightforward float32 top_p then min_p over the full vocab (top_k off, temperature 1)."""
    e = np.exp(logits - logits.max())
    probs = e / np.cumsum(e)[-1]
    order = np.argsort(-logits, kind="stable")
    reached = np.cumsum(probs[order]) >= np.float32(top_p)
    kept = order[: int(np.argmax(reached)) + 1 if reached.any() else order.size]
    return set(kept[logits[kept] >= logits.max() + np.log(np.float32(min_p))].tolist()) if min_p > 0 \
        else set(kept.tolist())


@pytest.mark.parametrize("top_p, min_p", [(0.95, 0.05), (0.9, 0.0), (0.5, 0.0), (0.999, 0.01)])
def test_top_p_head_search_equals_a_full_sort(top_p, min_p):
    rng = np.random.default_rng(7)
    for scale in (0.5, 2.0, 4.0):
        logits = (rng.standard_normal(20000) * scale).astype(np.float32)
        params = SamplingParams(**{**NO_FILTERS, "top_p": top_p, "min_p": min_p})
        token_ids, probs = target_probs(logits, params)
        assert set(token_ids.tolist()) == reference_top_p_min_p(logits, top_p, min_p)
        assert probs.sum() == pytest.approx(1.0)


def test_large_vocab_defaults():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(262144) * 3).astype(np.float32)
    token_ids, probs = target_probs(logits, SamplingParams())
    assert 1 <= len(token_ids) <= 40 and probs.sum() == pytest.approx(1.0)
    assert int(token_ids[np.argmax(probs)]) == int(np.argmax(logits))


# --- the real llama.cpp chain, built by llama-cpp-python itself (installed: a missing one fails) ------

def llama_cpp_probs(logits, params, generated):
    """Survivors and probabilities of Llama._init_sampler's chain applied to one logits row."""
    import ctypes
    import types

    import llama_cpp
    from llama_cpp.llama import Llama

    owner = types.SimpleNamespace(_n_vocab=logits.size, last_n_tokens_size=params.penalty_last_n,
                                  _seed=1234, _model=None)
    sampler = Llama._init_sampler(
        owner, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p, typical_p=params.typical_p,
        temp=params.temperature, repeat_penalty=params.repeat_penalty,
        frequency_penalty=params.frequency_penalty, presence_penalty=params.presence_penalty)
    for token in generated:
        sampler.accept(int(token))
    data = (llama_cpp.llama_token_data * logits.size)()
    for i, logit in enumerate(logits.tolist()):
        data[i].id, data[i].logit, data[i].p = i, logit, 0.0
    cur = llama_cpp.llama_token_data_array(data=data, size=logits.size, selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(sampler.sampler, ctypes.byref(cur))
    if params.greedy:
        return {data[cur.selected].id: 1.0}
    return {data[i].id: data[i].p for i in range(cur.size)}


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(**NO_FILTERS),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(top_k=0, top_p=0.8, min_p=0.0),
    SamplingParams(top_k=0, top_p=1.0, min_p=0.1),
    SamplingParams(typical_p=0.7),
    SamplingParams(top_k=0, typical_p=0.5, min_p=0.0),
    SamplingParams(temperature=-1.0),
    SamplingParams(repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.5, penalty_last_n=8),
    SamplingParams(temperature=0.0, repeat_penalty=1.3),
], ids=repr)
def test_matches_llama_cpp_sampler_chain(params):
    rng = np.random.default_rng(11)
    for n_vocab, scale in ((12, 2.0), (300, 3.0), (2000, 1.5)):
        for _ in range(5):
            logits = (rng.standard_normal(n_vocab) * scale).astype(np.float32)  # no exact ties
            generated = rng.integers(0, n_vocab, size=12).tolist()
            expected = llama_cpp_probs(logits, params, generated)
            got = as_dict(*target_probs(logits, params, recent_window(generated, params)))
            assert got.keys() == expected.keys()
            assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("params", [
    SamplingParams(**{**NO_FILTERS, "top_p": 0.5}),
    SamplingParams(**{**NO_FILTERS, "top_p": 0.75}),
    SamplingParams(**{**NO_FILTERS, "typical_p": 0.5}),
    SamplingParams(**{**NO_FILTERS, "top_k": 3}),
], ids=repr)
def test_matches_llama_cpp_on_ties_up_to_which_tied_tokens(params):
    # With tied logits at a cutoff, llama.cpp's choice among them is unspecified (std::sort /
    # std::partial_sort); the number kept and the probabilities must still agree.
    logits = np.zeros(4, dtype=np.float32)
    expected = llama_cpp_probs(logits, params, [])
    token_ids, probs = target_probs(logits, params)
    assert len(token_ids) == len(expected)
    assert sorted(probs) == pytest.approx(sorted(expected.values()), abs=1e-6)


@pytest.mark.parametrize("scale, k", [(1.0, 40), (3.0, 40), (30.0, 5), (0.01, 40), (3.0, 1000)])
def test_largest_fast_path_equals_a_stable_full_sort(scale, k):
    from lookahead.sampling import _largest

    rng = np.random.default_rng(int(scale * 100) + k)
    logits = np.round(rng.standard_normal(49152) * scale, 1).astype(np.float32)  # many exact ties
    assert _largest(logits, k).tolist() == np.argsort(-logits, kind="stable")[:k].tolist()


@pytest.mark.parametrize("shape", ["peaked", "tied-bulk", "masked"])
def test_largest_on_a_model_like_vocabulary(shape):
    """A real vocabulary's logits: a few tokens far above a dense bulk (the k-th largest
    20 logits below the max), a bulk of exact ties, or most of it masked to -inf."""
    from lookahead.sampling import _largest

    rng = np.random.default_rng(7)
    logits = np.round(rng.standard_normal(151936), 1).astype(np.float32)
    if shape == "peaked":
        logits[rng.choice(logits.size, 5, replace=False)] = [30.0, 28.5, 28.5, 26.0, 25.0]
    elif shape == "tied-bulk":
        logits[:] = 0.0
        logits[rng.choice(logits.size, 30, replace=False)] = 1.0
    else:
        logits[rng.random(logits.size) < 0.999] = -np.inf
    for k in (1, 40, 200):
        assert _largest(logits, k).tolist() == np.argsort(-logits, kind="stable")[:k].tolist(), k
