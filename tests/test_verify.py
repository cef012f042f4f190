"""The verifier: forced-logit cases, then seeded distribution tests against target_probs.

Distribution tests use a chi-square goodness-of-fit test at alpha = 1e-4 (a correct verifier
fails a given test about once in 10,000 seeds; the seeds are fixed, so runs are repeatable).
Categories expected to hold fewer than 5 samples are pooled. p-values come from the
Wilson-Hilferty normal approximation of the chi-square tail: at a true tail of 1e-4 it reports
1.6e-4 (1 degree of freedom), 1.4e-4 (2), 1.2e-4 (9), 0.97e-4 (19), so the effective alpha stays
within 0.9e-4 .. 1.6e-4. The power tests run deliberately broken verifiers through the same
check and require p < 1e-8.
"""
import math
from collections import Counter

import numpy as np
import pytest

from lookahead import verify
from lookahead.sampling import SamplingParams, recent_window, sample_token, target_probs
from lookahead.verify import Verdict, verify_draft, verify_draft_with_probs, verify_tree

ALPHA = 1e-4
N_VOCAB = 10
N_SAMPLES = 8000
N_POWER = 3000  # enough: the broken rules below land far below p = 1e-8
NO_FILTERS = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
PENALTIES = dict(repeat_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.2, penalty_last_n=4)

SETTINGS = {
    "t1.0": SamplingParams(**NO_FILTERS),
    "t0.7_top_k5": SamplingParams(**{**NO_FILTERS, "temperature": 0.7, "top_k": 5}),
    "top_p0.8": SamplingParams(**{**NO_FILTERS, "top_p": 0.8}),
    "min_p0.1": SamplingParams(**{**NO_FILTERS, "min_p": 0.1}),
    "defaults": SamplingParams(),
    "defaults_penalties": SamplingParams(**PENALTIES),
}


# --- helpers ----------------------------------------------------------------------------------

def forced_rows(tokens, n_vocab=N_VOCAB):
    """One row per token: +100 at it, -100 elsewhere (so the target picks it under any params)."""
    rows = np.full((len(tokens), n_vocab), -100.0, dtype=np.float32)
    rows[np.arange(len(tokens)), tokens] = 100.0
    return rows


class RecordingRows:
    """logits_rows that remember which rows were read."""

    def __init__(self, rows):
        self.rows = rows
        self.read = []

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        self.read.append(i)
        return self.rows[i]


def chi_square_pvalue(observed: Counter, expected: dict) -> float:
    """Goodness of fit of observed counts (outcome -> count) to expected (outcome -> prob)."""
    if any(outcome not in expected or expected[outcome] == 0 for outcome in observed):
        return 0.0  # an impossible outcome was produced
    n = sum(observed.values())
    outcomes = [o for o in expected if expected[o] > 0]
    counts = np.array([observed.get(o, 0) for o in outcomes], dtype=float)
    means = n * np.array([expected[o] for o in outcomes])
    small = means < 5
    if small.any():  # pool the rare outcomes into one category
        counts = np.append(counts[~small], counts[small].sum())
        means = np.append(means[~small], means[small].sum())
    dof = len(means) - 1
    if dof < 1:
        return 1.0
    stat = float(np.sum((counts - means) ** 2 / means))
    # Wilson-Hilferty: (X / k) ** (1/3) is about normal with mean 1 - 2/(9k), variance 2/(9k).
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def output_distribution(rows, tree_tokens, tree_parents, params, generated=()):
    """Exact distribution of Verdict.tokens, by enumeration over target_probs (no verify code)."""
    distribution = {}

    def walk(node, prefix, prob):
        window = recent_window(list(generated) + prefix, params)
        kids = {tree_tokens[j]: j for j in range(len(tree_tokens)) if tree_parents[j] == node}
        for token, p in zip(*target_probs(rows[node + 1], params, window)):
            token = int(token)
            if p == 0:
                continue
            if token in kids:
                walk(kids[token], prefix + [token], prob * p)
            else:
                distribution[tuple(prefix + [token])] = prob * p

    walk(-1, [], 1.0)
    return distribution


def random_rows(rng, n_rows, scale=1.5):
    return (rng.standard_normal((n_rows, N_VOCAB)) * scale).astype(np.float32)


def ranked(row, rank):
    return int(np.argsort(-row, kind="stable")[rank])


def linear_case(rng, n_draft=3):
    """Random rows and a draft alternating the top and the second token of each row."""
    rows = random_rows(rng, n_draft + 1)
    draft = [ranked(rows[i], i % 2) for i in range(n_draft)]
    return rows, draft


def tree_case(rng):
    """A branching tree: two root children, two children under the first, one under the second,
    and one under node 2 (depth 3)."""
    parents = [-1, -1, 0, 0, 1, 2]
    rows = random_rows(rng, len(parents) + 1)
    tokens = []
    for node, parent in enumerate(parents):
        rank = sum(1 for earlier in parents[:node] if earlier == parent)  # distinct among siblings
        tokens.append(ranked(rows[parent + 1], rank))
    return rows, tokens, parents


GENERATED = [1, 4, 4, 7, 2]  # earlier output, for the penalty windows


# --- forced logits ----------------------------------------------------------------------------

@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.0)], ids=["sampled", "greedy"])
def test_empty_draft_gives_only_the_bonus_token(params):
    verdict = verify_draft(forced_rows([7]), [], params, np.random.default_rng(0))
    assert verdict == Verdict(accepted=0, tokens=[7], path=[])


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.0)], ids=["sampled", "greedy"])
def test_full_acceptance_adds_the_bonus_token(params):
    verdict = verify_draft(forced_rows([3, 5, 2, 9]), [3, 5, 2], params, np.random.default_rng(0))
    assert verdict == Verdict(accepted=3, tokens=[3, 5, 2, 9], path=[0, 1, 2])


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.0)], ids=["sampled", "greedy"])
def test_first_mismatch_emits_the_target_token_and_stops(params):
    rows = forced_rows([3, 4, 0, 0])
    rows[2:] = np.nan  # never to be looked at
    recording = RecordingRows(rows)
    verdict = verify_draft(recording, [3, 5, 2], params, np.random.default_rng(0))
    assert verdict == Verdict(accepted=1, tokens=[3, 4], path=[0])
    assert recording.read == [0, 1]


def test_mismatch_on_the_first_token():
    rows = forced_rows([6, 0, 0])
    rows[1:] = np.nan
    verdict = verify_draft(rows, [3, 5], SamplingParams(temperature=0.0), np.random.default_rng(0))
    assert verdict == Verdict(accepted=0, tokens=[6], path=[])


def test_penalty_window_of_row_i_is_generated_plus_draft_prefix():
    params = SamplingParams(temperature=0.0, repeat_penalty=2.0)
    rows = np.zeros((3, N_VOCAB), dtype=np.float32)
    rows[0, [5, 6]] = [3.0, 2.0]  # 5 was generated: 3 / 2 < 2, so the target says 6
    rows[1, [6, 7]] = [3.0, 2.0]  # 6 is now in the window too: the target says 7
    verdict = verify_draft(rows, [6, 6], params, np.random.default_rng(0), generated=[5])
    assert verdict == Verdict(accepted=1, tokens=[6, 7], path=[0])


def test_tree_follows_the_branch_the_target_picks():
    #        root
    #       /    \
    #    0:3      1:5
    #    /  \       \
    #  2:1  3:2     4:8
    tokens, parents = [3, 5, 1, 2, 8], [-1, -1, 0, 0, 1]
    rows = forced_rows([5, 0, 0, 0, 0, 4])  # row 0: root -> 5; row 2 (after node 1) -> 4
    rows[[1, 3, 4, 5]] = np.nan  # rows of nodes off the taken path
    rows[2] = forced_rows([4])[0]
    recording = RecordingRows(rows)
    verdict = verify_tree(recording, tokens, parents, SamplingParams(), np.random.default_rng(0))
    assert verdict == Verdict(accepted=1, tokens=[5, 4], path=[1])
    assert recording.read == [0, 2]


def test_tree_leaf_reached_samples_the_bonus_from_the_leaf_row():
    tokens, parents = [3, 5, 1, 2, 8], [-1, -1, 0, 0, 1]
    rows = forced_rows([3, 2, 0, 0, 9, 0])  # root -> 3 (node 0) -> 2 (node 3, a leaf) -> bonus 9
    verdict = verify_tree(rows, tokens, parents, SamplingParams(temperature=0.0), np.random.default_rng(0))
    assert verdict == Verdict(accepted=2, tokens=[3, 2, 9], path=[0, 3])


def test_with_probs_forced_accept_and_reject():
    q = np.full((2, N_VOCAB), 1.0 / N_VOCAB)
    rng = np.random.default_rng(0)
    accepted = verify_draft_with_probs(forced_rows([3, 5, 9]), [3, 5], q, SamplingParams(), rng)
    assert accepted == Verdict(accepted=2, tokens=[3, 5, 9], path=[0, 1])
    rows = forced_rows([3, 6, 0])
    rows[2] = np.nan
    rejected = verify_draft_with_probs(rows, [3, 5], q, SamplingParams(), rng)
    assert rejected == Verdict(accepted=1, tokens=[3, 6], path=[0])  # residual is all on 6


@pytest.mark.parametrize("call, message", [
    (lambda: verify_draft(forced_rows([1, 2]), [1, 2], SamplingParams(), None),
     r"logits_rows must have len\(tree_tokens\) \+ 1 = 3 rows, got 2"),
    (lambda: verify_tree(forced_rows([1, 2, 3]), [1, 2], [-1, 1], SamplingParams(), None),
     r"tree_parents\[1\] must be in \[-1, 1\), got 1"),
    (lambda: verify_tree(forced_rows([1, 2, 3]), [1, 2], [-1], SamplingParams(), None),
     r"tree_parents must have len\(tree_tokens\) = 2 entries, got 1"),
    (lambda: verify_tree(forced_rows([1, 2, 3]), [4, 4], [-1, -1], SamplingParams(), None),
     r"nodes 0 and 1 are siblings with the same token 4"),
    (lambda: verify_draft_with_probs(forced_rows([1, 2]), [1], np.ones((2, N_VOCAB)), SamplingParams(), None),
     r"draft_probs must have len\(draft\) = 1 rows, got 2"),
    (lambda: verify_draft_with_probs(forced_rows([1, 2]), [1], np.ones((1, 4)), SamplingParams(), None),
     r"draft_probs\[0\] must have shape \(10,\) like the logits, got \(4,\)"),
])
def test_bad_shapes_are_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- distributions ----------------------------------------------------------------------------

def run(n, one_verdict):
    return Counter(tuple(one_verdict().tokens) for _ in range(n))


def assert_first_token_follows_row_0(observed: Counter, rows, params) -> None:
    """The first emitted token alone (outputs are token tuples), against row 0's target_probs."""
    first = Counter()
    for tokens, count in observed.items():
        first[tokens[0]] += count
    token_ids, probs = target_probs(rows[0], params, recent_window(GENERATED, params))
    assert chi_square_pvalue(first, dict(zip(token_ids.tolist(), probs))) > ALPHA


@pytest.mark.parametrize("name", list(SETTINGS))
def test_linear_draft_output_is_distributed_as_the_target(name):
    params = SETTINGS[name]
    rng = np.random.default_rng(20240 + list(SETTINGS).index(name))
    rows, draft = linear_case(rng)
    expected = output_distribution(rows, draft, list(range(-1, len(draft) - 1)), params, GENERATED)
    observed = run(N_SAMPLES, lambda: verify_draft(rows, draft, params, rng, GENERATED))
    assert chi_square_pvalue(observed, expected) > ALPHA
    assert_first_token_follows_row_0(observed, rows, params)


@pytest.mark.parametrize("name", ["t1.0", "defaults", "defaults_penalties"])
def test_tree_output_is_distributed_as_the_target(name):
    params = SETTINGS[name]
    rng = np.random.default_rng(777 + list(SETTINGS).index(name))
    rows, tokens, parents = tree_case(rng)
    expected = output_distribution(rows, tokens, parents, params, GENERATED)
    observed = run(N_SAMPLES, lambda: verify_tree(rows, tokens, parents, params, rng, GENERATED))
    assert chi_square_pvalue(observed, expected) > ALPHA


def prefix_of_two(rows, verdict_tokens, params, rng, generated):
    """The first two output tokens, continuing with plain sampling when the verdict is shorter."""
    tokens = list(verdict_tokens)
    while len(tokens) < 2:
        window = recent_window(list(generated) + tokens, params)
        tokens.append(sample_token(rows[len(tokens)], params, rng, window))
    return tuple(tokens[:2])


def plain_two_token_distribution(rows, params, generated):
    distribution = {}
    for x, p_x in zip(*target_probs(rows[0], params, recent_window(generated, params))):
        window = recent_window(list(generated) + [int(x)], params)
        for y, p_y in zip(*target_probs(rows[1], params, window)):
            distribution[(int(x), int(y))] = p_x * p_y
    return distribution


def random_draft_probs(rng, n_rows):
    """Draft distributions unlike the target's, with some exact zeros."""
    q = rng.dirichlet(np.full(N_VOCAB, 0.7), size=n_rows)
    q[:, 0] = 0.0
    return q / q.sum(axis=1, keepdims=True)


def sample_with_probs(rows, draft_probs, params, rng, generated, verifier=verify_draft_with_probs):
    draft = [int(rng.choice(N_VOCAB, p=q_row)) for q_row in draft_probs]
    verdict = verifier(rows, draft, draft_probs, params, rng, generated)
    return prefix_of_two(rows, verdict.tokens, params, rng, generated)


@pytest.mark.parametrize("name", ["t1.0", "t0.7_top_k5", "defaults", "defaults_penalties"])
def test_draft_with_probs_output_is_distributed_as_the_target(name):
    params = SETTINGS[name]
    rng = np.random.default_rng(4242 + list(SETTINGS).index(name))
    rows = random_rows(rng, 3)
    draft_probs = random_draft_probs(rng, 2)
    expected = plain_two_token_distribution(rows, params, GENERATED)
    observed = Counter(sample_with_probs(rows, draft_probs, params, rng, GENERATED) for _ in range(N_SAMPLES))
    assert chi_square_pvalue(observed, expected) > ALPHA
    assert_first_token_follows_row_0(observed, rows, params)


# --- power: the same checks reject wrong rules ------------------------------------------------

def broken_verify_draft(logits_rows, draft, params, rng, generated=()):
    """Wrong: on a mismatch it emits a second, fresh draw instead of the draw it compared."""
    tokens = []
    for i, drafted in enumerate(draft):
        window = recent_window(list(generated) + tokens, params)
        if sample_token(logits_rows[i], params, rng, window) == drafted:
            tokens.append(drafted)
            continue
        tokens.append(sample_token(logits_rows[i], params, rng, window))
        return Verdict(accepted=i, tokens=tokens, path=list(range(i)))
    window = recent_window(list(generated) + tokens, params)
    return Verdict(len(draft), tokens + [sample_token(logits_rows[-1], params, rng, window)],
                   list(range(len(draft))))


def test_power_against_a_point_mass_rule_that_redraws_on_mismatch():
    params = SETTINGS["defaults"]
    rng = np.random.default_rng(20240 + list(SETTINGS).index("defaults"))  # as the passing test
    rows, draft = linear_case(rng)
    expected = output_distribution(rows, draft, list(range(-1, len(draft) - 1)), params, GENERATED)
    observed = run(N_POWER, lambda: broken_verify_draft(rows, draft, params, rng, GENERATED))
    assert chi_square_pvalue(observed, expected) < 1e-8


def test_power_against_resampling_from_the_target_instead_of_the_residual(monkeypatch):
    params = SETTINGS["t1.0"]
    rng = np.random.default_rng(4242 + list(SETTINGS).index("t1.0"))  # as the passing test
    rows = random_rows(rng, 3)
    draft_probs = random_draft_probs(rng, 2)
    monkeypatch.setattr(verify, "residual_probs", lambda target, draft_row: target)  # the bug
    expected = plain_two_token_distribution(rows, params, GENERATED)
    observed = Counter(sample_with_probs(rows, draft_probs, params, rng, GENERATED) for _ in range(N_POWER))
    assert chi_square_pvalue(observed, expected) < 1e-8


def test_power_against_a_tree_that_ignores_the_penalty_window():
    params = SETTINGS["defaults_penalties"]
    rng = np.random.default_rng(777 + list(SETTINGS).index("defaults_penalties"))  # as the passing test
    rows, tokens, parents = tree_case(rng)
    expected = output_distribution(rows, tokens, parents, params, GENERATED)
    observed = run(N_POWER, lambda: verify_tree(rows, tokens, parents, params, rng, generated=()))
    assert chi_square_pvalue(observed, expected) < 1e-8
