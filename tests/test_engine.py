"""The engine and the wrapper on a fake Target: rollback, early close, a full context, trees,
drafts with probabilities, and the public API over a backend that is not llama.cpp."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from conftest import flat_cost_model
from fake_target import FakeTarget, plain_greedy
from lookahead import Lookahead
from lookahead.drafter import Drafter
from lookahead.engine import generate_tokens
from lookahead.index import SuffixIndex
from lookahead.sampling import SamplingParams
from lookahead.stats import SpeculationStats

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [2, 5, 9, 5, 9, 7, 5, 9, 5, 9, 7, 11, 13]


def run(target, prompt=PROMPT, n=60, drafter="eager", params=GREEDY, seed=0, references=()):
    index = SuffixIndex()
    for ref in references:
        index.add_reference(ref)
    if drafter == "eager":
        drafter = Drafter(flat_cost_model(target.max_batch), max_draft=16,
                          tree_width=getattr(target, "tree_width", 1))
    stats = SpeculationStats()
    gen = generate_tokens(target, prompt, params, np.random.default_rng(seed), n, drafter, index, stats)
    return gen, stats


def corrupted(tokens, every=7, n_vocab=24):
    """`tokens` with every `every`-th one replaced: a reference drafts both right and wrong tokens."""
    return [(t + 1) % n_vocab or 3 if i % every == every - 1 else t for i, t in enumerate(tokens)]


def test_greedy_equals_the_table_with_and_without_drafts():
    target = FakeTarget()
    expected = plain_greedy(target, PROMPT, 60)
    reference = corrupted(PROMPT[-2:] + expected)
    for drafter in (None, "eager"):
        gen, stats = run(target, drafter=drafter, references=[reference])
        assert list(gen) == expected
        assert stats.generated_tokens >= 60
    assert stats.drafted > 0 and stats.accepted > 0 and stats.accepted < stats.drafted  # both outcomes seen


def test_drafts_never_reach_past_the_draft_limit():
    # max_new_tokens may leave a few tokens past max_tokens to finish a character: drafting
    # into them would verify tokens that are almost always thrown away
    target = FakeTarget()
    expected = plain_greedy(target, PROMPT, 30)
    index = SuffixIndex()
    index.add_reference(PROMPT[-2:] + expected)  # a perfect reference: drafts as long as allowed
    stats = SpeculationStats()
    drafter = Drafter(flat_cost_model(target.max_batch), max_draft=16)
    gen = generate_tokens(target, PROMPT, GREEDY, np.random.default_rng(0), 23, drafter, index, stats,
                          draft_limit=20)
    out = []
    for token in gen:
        out.append(token)
        if len(out) == 20:
            break  # the consumer's max_tokens
    gen.close()
    assert out == expected[:20]
    assert stats.drafted > 0 and stats.generated_tokens == 20  # no draft token decoded past 20


def test_after_a_request_the_cache_holds_exactly_the_tokens_the_engine_reports():
    target = FakeTarget()
    gen, stats = run(target, references=[corrupted(PROMPT[-2:] + plain_greedy(target, PROMPT, 60))])
    out = list(gen)
    assert target.ended_with == target.kv
    # everything but the newest token (never decoded yet) is in the cache
    assert target.kv == PROMPT + out[: len(target.kv) - len(PROMPT)]
    assert len(target.kv) == len(PROMPT) + stats.generated_tokens - 1


@pytest.mark.parametrize("stop_after", [1, 3, 7])
def test_closing_early_leaves_the_target_consistent_and_the_next_request_right(stop_after):
    target = FakeTarget()
    gen, _ = run(target)
    taken = [next(gen) for _ in range(stop_after)]
    gen.close()
    assert target.ended_with == target.kv
    assert target.kv[: len(PROMPT)] == PROMPT
    assert taken == plain_greedy(target, PROMPT, stop_after)
    again, _ = run(target)  # reuses the cached prefix
    assert list(again) == plain_greedy(target, PROMPT, 60)


def test_a_full_context_ends_generation_without_overflow():
    target = FakeTarget(n_ctx=40)
    gen, stats = run(target, n=1000)
    out = list(gen)
    assert len(PROMPT) + len(out) <= target.n_ctx + 1  # the last token is emitted, never decoded
    assert out == plain_greedy(target, PROMPT, len(out))
    assert max(target.decodes) <= target.max_batch


def test_a_prompt_that_fills_the_context_is_refused():
    target = FakeTarget(n_ctx=len(PROMPT))
    with pytest.raises(ValueError, match=f"prompt of {len(PROMPT)} tokens does not fit the context of {len(PROMPT)}"):
        next(run(target)[0])


def test_a_long_prompt_is_prefilled_in_chunks_of_max_batch():
    target = FakeTarget(max_batch=8, n_ctx=512)
    prompt = (PROMPT * 5)[:50]
    gen, _ = run(target, prompt=prompt, n=10)
    assert list(gen) == plain_greedy(target, prompt, 10)
    assert target.decodes[:6] == [8] * 6  # 48 tokens prefilled, the last chunk (2) with the first draft


def test_tree_drafts_follow_the_table_and_keep_one_path():
    target = FakeTarget(tree_width=4, seed=3, sharp=1.0)  # flatter logits: occurrences disagree
    prompt = [2, 5, 6, 5, 7, 5, 8, 5, 6, 5, 7, 5, 8, 5]
    gen, stats = run(target, prompt=prompt, n=40)
    out = list(gen)
    assert out == plain_greedy(target, prompt, 40)
    assert stats.tree_passes > 0
    assert target.ended_with == target.kv


@dataclass(frozen=True)
class ProbDraft:
    tokens: list
    probs: np.ndarray  # [k, n_vocab]
    parents: None = None

    def __len__(self):
        return len(self.tokens)


class DraftModel:
    """A user's own drafter: samples k tokens from a fixed distribution q and says so."""

    def __init__(self, q: np.ndarray, k: int, rng: np.random.Generator):
        self.q, self.k, self.rng = q, k, rng

    def propose(self, index, limit, tree=True):
        k = min(self.k, limit)
        tokens = [int(self.rng.choice(len(self.q), p=self.q)) for _ in range(k)]
        return ProbDraft(tokens, np.tile(self.q, (k, 1)))

    def record(self, draft, accepted, path):
        pass


def test_drafts_with_probabilities_keep_the_target_distribution():
    """Speculative sampling through the engine: the first token after the prompt is distributed
    as the target's softmax, whatever the draft distribution q (chi-square, alpha 1e-3)."""
    target = FakeTarget(n_vocab=6, sharp=1.0, seed=5)
    target.table[:, 1] = 0.0  # EOS allowed here: it is a token like any other
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    q = np.array([0.05, 0.05, 0.5, 0.2, 0.1, 0.1])
    rng = np.random.default_rng(0)
    counts = Counter()
    second = Counter()
    n = 4000
    for seed in range(n):
        gen, stats = run(target, prompt=[2, 3], n=2, drafter=DraftModel(q, 3, rng), params=params, seed=seed)
        out = list(gen)
        counts[out[0]] += 1
        second[(out[0], out[1])] += 1
    logits = target.table[3].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    observed = np.array([counts[t] for t in range(6)], dtype=float)
    expected = n * p
    keep = expected >= 5
    chi2 = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    critical = dof * (1 - 2 / (9 * dof) + 3.09 * np.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < critical, f"chi2 {chi2:.1f} >= {critical:.1f}: {observed} vs {expected}"
    assert stats.drafted > 0


def test_the_wrapper_runs_on_any_target():
    target = FakeTarget()
    fast = Lookahead(target, calibrate=False, cost=flat_cost_model(target.max_batch))
    out = fast.create_completion(PROMPT, max_tokens=20, temperature=0)
    expected = "".join(f"<{t}>" for t in plain_greedy(target, PROMPT, 20))
    assert out["choices"][0]["text"] == expected
    assert out["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 20, "total_tokens": len(PROMPT) + 20}
    assert out["speculation"]["drafted"] > 0
    chunks = list(fast.create_completion(PROMPT, max_tokens=20, temperature=0, stream=True, stop=["<7>"]))
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert "<7>" not in text and expected.startswith(text)
    chat = fast.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=5, temperature=0)
    assert "speculation" in chat and chat["usage"]["completion_tokens"] == 5


def test_a_target_without_a_plain_path_refuses_unsupported_arguments_by_name():
    fast = Lookahead(FakeTarget(), calibrate=False)
    with pytest.raises(ValueError, match="unsupported by lookahead: grammar"):
        fast.create_completion(PROMPT, max_tokens=4, grammar="root ::= x")


def test_prediction_drafts_are_counted_apart():
    target = FakeTarget()
    fast = Lookahead(target, calibrate=False, cost=flat_cost_model(target.max_batch))
    expected = plain_greedy(target, [2, 4], 30)
    out = fast.create_completion([2, 4], max_tokens=30, temperature=0, prediction=expected, references=[[4, 4, 4]])
    spec = out["speculation"]
    assert spec["prediction_drafted"] > 0
    assert spec["prediction_accepted"] == spec["prediction_drafted"]  # the prediction is the output
    assert spec["prediction_drafted"] <= spec["drafted"]
    assert "".join(f"<{t}>" for t in expected) == out["choices"][0]["text"]


def test_a_prediction_also_in_the_prompt_is_still_credited():
    # The editor case: the file is in the prompt and is the prediction. Both back every draft
    # copied from it; the prediction must be credited, not only the prompt.
    target = FakeTarget()
    fast = Lookahead(target, calibrate=False, cost=flat_cost_model(target.max_batch))
    expected = plain_greedy(target, [4], 40)  # the logits depend on the last token only
    prompt = [2, 4, *expected, 7, 4]  # the output, copied in the prompt
    out = fast.create_completion(prompt, max_tokens=40, temperature=0, prediction=expected)
    assert "".join(f"<{t}>" for t in expected) == out["choices"][0]["text"]
    spec = out["speculation"]
    assert spec["drafted"] > 0 and spec["by_source"]["0"][0] > 0  # the prompt backed drafts...
    assert spec["prediction_drafted"] == spec["drafted"]  # ...and the prediction backed every one
    assert spec["prediction_accepted"] == spec["accepted"]


def test_a_stream_closed_early_still_reports_its_stats():
    target = FakeTarget()
    fast = Lookahead(target, calibrate=False, cost=flat_cost_model(target.max_batch))
    stream = fast.create_completion(PROMPT, max_tokens=50, temperature=0, stream=True)
    next(stream)
    next(stream)
    stream.close()
    assert 2 <= stream.speculation["generated_tokens"] < 50
    assert target.ended_with == target.kv  # the engine ended the request when the stream closed
    chat = fast.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=50, temperature=0, stream=True)
    next(chat)
    chat.close()
    assert 1 <= chat.speculation["generated_tokens"] < 50


def test_a_chat_stream_hands_out_each_token_before_the_next_decode():
    """Only the chunk with the finish reason waits for the next one (to carry the stats): a
    token's text is out before the engine decodes the next token."""
    target = FakeTarget()
    fast = Lookahead(target, calibrate=False, cost=flat_cost_model(target.max_batch))
    messages = [{"role": "user", "content": "hi"}]
    stream = fast.create_chat_completion(messages, max_tokens=5, temperature=0, stream=True, speculate=False)
    seen = []  # decodes done when each chunk came out
    chunks = []
    for chunk in stream:
        seen.append(len(target.decodes))
        chunks.append(chunk)
    content = [n for n, c in zip(seen, chunks) if c["choices"][0]["text"]]
    assert content == [1, 2, 3, 4, 5]  # a short prompt: its first pass is the first decode
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "speculation" in chunks[-1]
    assert all("speculation" not in c for c in chunks[:-1])


def test_request_ms_counts_the_library_time_but_not_a_stream_consumers(monkeypatch):
    """A fake clock: every reading inside the library advances it 1 ms; the consumer holds each
    chunk for 1000 s. `request_ms` holds the engine's time and more, and none of the consumer's."""
    import time

    now = [0.0]

    def clock():
        now[0] += 0.001
        return now[0]

    monkeypatch.setattr(time, "perf_counter", clock)
    target = FakeTarget()
    fast = Lookahead(target, calibrate=False, cost=flat_cost_model(target.max_batch))
    messages = [{"role": "user", "content": "hi"}]
    for call in (lambda **kw: fast.create_completion(PROMPT, **kw),
                 lambda **kw: fast.create_chat_completion(messages, **kw)):
        whole = call(max_tokens=20, temperature=0)["speculation"]
        assert whole["total_ms"] < whole["request_ms"] < 1000 * 1000
        chunks = []
        for chunk in call(max_tokens=20, temperature=0, stream=True):
            chunks.append(chunk)
            now[0] += 1000.0  # the consumer writing the chunk out
        assert len(chunks) > 3
        streamed = chunks[-1]["speculation"]
        assert 0 < streamed["request_ms"] < 1000 * 1000, streamed
        # the engine's wall time runs on while its generator waits for the consumer
        assert streamed["total_ms"] > 1000 * 1000


class ContendedTarget(FakeTarget):
    """Reports contention from its `at`-th decode on, as the llama.cpp adapter does."""

    def __init__(self, at: int, **kw):
        super().__init__(**kw)
        self.at = at
        self.n_decodes = 0

    @property
    def contended(self):
        return self.n_decodes >= self.at

    @property
    def batch_cost_factor(self):
        return 1.4 if self.contended else 1.0

    def decode(self, tokens, n_logits):
        self.n_decodes += 1
        return super().decode(tokens, n_logits)


def test_timings_taken_under_contention_do_not_teach_the_cost_curve():
    target = ContendedTarget(at=5)
    cost = flat_cost_model(target.max_batch)
    cost.learning = True  # (flat_cost_model pins it)
    before = cost.observations
    gen, stats = run(target, n=20, drafter=Drafter(cost, max_draft=0))
    assert list(gen) == plain_greedy(target, PROMPT, 20)
    assert stats.contended
    assert cost.observations - before == 3  # decodes 2-4: the 1st carries the prompt's last chunk, the 5th is contended


def test_the_targets_batch_cost_factor_reaches_the_drafter():
    target = ContendedTarget(at=5)
    drafter = Drafter(flat_cost_model(target.max_batch), max_draft=0)  # one pass a token: 20 passes
    seen = []
    original = drafter.propose

    def propose(index, limit, tree=True):
        seen.append(drafter.batch_cost_factor)
        return original(index, limit, tree)

    drafter.propose = propose
    gen, _ = run(target, n=20, drafter=drafter)
    list(gen)
    assert seen[0] == 1.0 and seen[-1] == 1.4


def test_the_first_pass_decodes_the_prompts_last_chunk_and_counts_as_prefill(monkeypatch):
    import lookahead.engine

    class Clock:  # the engine's time.perf_counter: only decodes take time, 2 ms per token
        now = 0.0

        def perf_counter(self):
            return self.now

    clock = Clock()
    monkeypatch.setattr(lookahead.engine, "time", clock)

    class Timed(FakeTarget):
        def decode(self, tokens, n_logits):
            clock.now += 0.002 * len(tokens)
            return super().decode(tokens, n_logits)

    prompt = (PROMPT * 4)[:45]  # 32 prefilled by begin() (free here), the last 13 in the first pass
    gen, stats = run(Timed(max_batch=32), prompt=prompt, n=20, drafter=None)
    out = list(gen)
    assert stats.first_pass_tokens == 1 and len(out) == stats.generated_tokens == 20
    assert stats.prefill_ms == pytest.approx(26.0)  # the first pass: 13 tokens
    assert stats.verify_ms == pytest.approx(38.0)  # the 19 passes after it, one token each
    assert stats.first_token_ms == pytest.approx(26.0)
    assert stats.total_ms == pytest.approx(64.0) and stats.decode_ms == pytest.approx(38.0)
    assert stats.decode_tokens == 19 and stats.tokens_per_second == pytest.approx(500.0)
