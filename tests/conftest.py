"""Shared fixtures: one real model (the tiny SmolLM2-135M-Instruct) for the whole session.

The suite runs on the tiny model wherever a test is about the engine, not the model's skill:
$LOOKAHEAD_MODEL names it for the commands the tests start, too. Tests of what the default
model does (the README's demo) name it explicitly.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """The suite's own lookahead cache (measured curves, health checks), not the user's: every
    run starts from nothing, and the commands the tests start inherit it."""
    folder = tmp_path_factory.mktemp("lookahead-cache")
    old = os.environ.get("LOOKAHEAD_CACHE_DIR")
    os.environ["LOOKAHEAD_CACHE_DIR"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("LOOKAHEAD_CACHE_DIR", None)
    else:
        os.environ["LOOKAHEAD_CACHE_DIR"] = old


def skip_without_exact_batches() -> None:
    """Tests of LOOKAHEAD_EXACT_BATCHES need the set-up's patched llama.cpp."""
    from lookahead.adapters import health

    if not health.exact_batches_available():
        pytest.skip("this build lacks lookahead's llama.cpp patch (scripts/setup.sh applies it)")


@pytest.fixture(scope="session", autouse=True)
def tiny_model_by_default():
    from lookahead.models import MODEL_ENV, TINY_MODEL

    old = os.environ.get(MODEL_ENV)
    os.environ[MODEL_ENV] = TINY_MODEL
    yield
    if old is None:
        os.environ.pop(MODEL_ENV, None)
    else:
        os.environ[MODEL_ENV] = old


@pytest.fixture(scope="session")
def model_path() -> Path:
    from lookahead.models import TINY_MODEL, resolve

    # No skip: CI installs the models (scripts/setup.sh); a missing model is a failure.
    return resolve(TINY_MODEL)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    from lookahead.models import DEFAULT_MODEL, resolve

    return resolve(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def llm(model_path):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(model_path), n_ctx=2048, n_threads=os.cpu_count() or 1,
                           verbose=False)


def flat_cost_model(max_batch: int):
    """A cost curve where drafting always pays: forces long drafts, whatever this machine does.

    Exactness tests use it so that they exercise speculation on every step they can.
    """
    from lookahead.drafter import CostModel

    cost = CostModel(max_batch=max_batch)
    for n in (1, 2, 4, 8, 16, 32, 64):
        cost.observe(n, 10.0 + 0.01 * n)
    cost.learning = False  # keep it flat: real timings must not steepen it during the tests
    return cost


@pytest.fixture()
def fresh(llm):
    """The Llama with its KV cache emptied, so a run does not depend on earlier tests."""
    from lookahead.adapters.llama_cpp import clear_kv_cache

    clear_kv_cache(llm)
    return llm


@pytest.fixture()
def uncontended(monkeypatch):
    """The adapter's contention guard off for one test (a hold left on a Llama's state by an
    earlier request is the caller's to clear: `state_of(llm).contended_until = 0.0`).

    When another process takes a core, the guard rightly moves decodes to the Llama's own
    thread count and prices batches dearer, so drafts change. Tests whose assertions are about
    thread counts or drafts use this; the guard has tests of its own that make up contention.
    """
    from lookahead.adapters.llama_cpp import threads

    monkeypatch.setattr(threads, "CONTENTION_SLOWDOWN", float("inf"))


@pytest.fixture()
def eager(fresh, uncontended):
    """A wrapper whose drafter drafts at every opportunity (flat cost curve, no contention guard)."""
    import lookahead
    from lookahead.adapters.llama_cpp import state_of

    state_of(fresh).contended_until = 0.0
    fast = lookahead.wrap(fresh, calibrate=False)
    fast.cost = flat_cost_model(fast.target.max_batch)
    return fast


class StepRecorder:
    """Engine observer: keeps every emitted token with the logits row it was chosen from."""

    def __init__(self):
        self.tokens: list[int] = []
        self.argmax: list[int] = []
        self.gap: list[float] = []  # top-1 minus top-2 logit of the row
        self.drafted = 0

    def __call__(self, rows, draft, verdict):
        self.drafted += len(draft)
        for i, token in enumerate(verdict.tokens):
            row = np.asarray(rows[i], dtype=np.float64)
            top2 = np.partition(row, -2)[-2:]
            self.tokens.append(int(token))
            self.argmax.append(int(np.argmax(row)))
            self.gap.append(float(top2[1] - top2[0]))
