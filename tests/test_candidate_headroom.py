"""samples/examples/candidate_headroom.py: its oracles on outputs whose best drafts are known."""
import importlib.util
from pathlib import Path

import pytest

from lookahead import simulate

SCRIPT = Path(__file__).resolve().parents[1] / "samples" / "examples" / "candidate_headroom.py"
FLAT = ((1, 10.0), (64, 10.0))  # every decode costs the same: drafting is free


@pytest.fixture(scope="module")
def headroom():
    spec = importlib.util.spec_from_file_location("candidate_headroom", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_copy_is_drafted_whole_from_anywhere(headroom):
    cost = simulate.pinned_cost(FLAT)
    body = list(range(1000, 1060))
    prompt = [1, 2, *body, 3]
    # On a flat curve the speedup is tokens per pass. "any" (suffix 0) finds the whole copy at
    # the first step: one pass.
    assert headroom._oracle(prompt, body, cost, 1.1, 0) == pytest.approx(60 / 1)
    # The last token, 3, occurred nowhere before: one plain decode emits 1000, which occurred
    # once; the other 59 tokens follow in one pass.
    assert headroom._oracle(prompt, body, cost, 1.1, 1) == pytest.approx(60 / 2)


def test_new_text_is_never_drafted(headroom):
    cost = simulate.pinned_cost(FLAT)
    prompt = [1, 2, 3, 4]
    output = list(range(500, 520))
    for suffix in (0, 1, 2):
        assert headroom._oracle(prompt, output, cost, 1.1, suffix) == pytest.approx(1.0)


def test_the_best_of_several_occurrences_is_followed(headroom):
    cost = simulate.pinned_cost(FLAT)
    # The token 7 occurs three times; the output follows its second occurrence.
    prompt = [7, 10, 11, 7, 20, 21, 22, 23, 7, 30, 9]
    output = [7, 20, 21, 22, 23]
    # One plain decode emits 7 (9 never occurred before), then 20..23 in one pass.
    assert headroom._oracle(prompt, output, cost, 1.1, 1) == pytest.approx(5 / 2)
