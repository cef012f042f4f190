"""lookahead.simulate: replays that can be checked by hand, the oracle bound, the prior tables.

The last test refits the drafter's shipped prior tables from the committed traces
(samples/examples/traces.json, written by samples/examples/record_traces.py) with the command
named next to them in lookahead/drafter/priors.py, and fails if the shipped numbers are not what it prints.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from lookahead import simulate
from lookahead.drafter import CostModel, Drafter, priors, rejoin

TRACES = Path(__file__).resolve().parents[1] / "samples" / "examples" / "traces.json"
FLAT = ((1, 10.0), (64, 10.0))  # every decode costs the same: drafting is free
STEEP = ((1, 10.0), (2, 30.0), (64, 1000.0))  # a draft token costs twice a plain decode


def copy_trace():
    """A prompt holding 60 distinct tokens, then an output that copies them."""
    body = list(range(1000, 1060))
    return [1, 2, *body, 3], body


def test_replay_without_drafts_is_one_pass_per_token():
    prompt, output = copy_trace()
    cost = simulate.pinned_cost(STEEP)
    r = simulate.replay(prompt, output, Drafter(cost), cost.cost_ms)
    # On this curve nothing pays (a draft token costs 20 ms for at most 10 ms saved)
    assert (r.passes, r.drafted, r.accepted) == (60, 0, 0)
    assert r.time_ms == pytest.approx(600.0) and r.plain_ms == pytest.approx(600.0) and r.speedup == 1.0


def test_replay_of_a_copy_on_a_flat_curve():
    prompt, output = copy_trace()
    cost = simulate.pinned_cost(FLAT)
    r = simulate.replay(prompt, output, Drafter(cost), cost.cost_ms)
    # Step 1: the context ends with 3, which occurred nowhere before: a plain decode emits
    # 1000. Step 2: [1000] occurred in the prompt; on a flat curve the whole rest is drafted,
    # 58 tokens (the limit leaves room for the bonus token, the 60th).
    assert r.passes == 2 and r.accepted == 58 and r.drafted == 58
    assert r.speedup == pytest.approx(30.0)
    assert r.prefill_ms == pytest.approx(len(prompt) * 10.0 / 64)


def test_replay_counts_a_rejected_draft_and_its_correction():
    prompt = [5, 6, 7, 8, 9, 4, 5, 6]  # the suffix [5, 6] continues [7, 8, 9, 4, ...]
    output = [7, 8, 1]  # ... but the target says 1 after [7, 8]
    cost = simulate.pinned_cost(FLAT)
    r = simulate.replay(prompt, output, Drafter(cost), cost.cost_ms)
    # one pass: draft [7, 8] (limit = 3 - 0 - 1 = 2), both accepted, the bonus token is 1
    assert (r.passes, r.drafted, r.accepted, r.tokens) == (1, 2, 2, 3)
    output = [7, 2, 1]
    r = simulate.replay(prompt, output, Drafter(cost), cost.cost_ms)
    # pass 1: draft [7, 8], 7 accepted, 2 emitted instead of 8; pass 2: [.., 7, 2] has no
    # match, plain decode of 1
    assert (r.passes, r.drafted, r.accepted) == (2, 2, 1)


@pytest.mark.parametrize("seed", range(4))
def test_oracle_is_never_slower_than_the_policy(seed):
    rng = np.random.RandomState(seed)
    source = rng.randint(10, 60, size=120).tolist()
    output = [t if rng.rand() > 0.1 else int(rng.randint(10, 60)) for t in source[:100]]
    for points in (FLAT, STEEP, simulate.DEFAULT_CURVE):
        cost = simulate.pinned_cost(points)
        policy = simulate.replay(source, output, Drafter(cost), cost.cost_ms)
        oracle = simulate.replay_oracle(source, output, Drafter(cost), cost.cost_ms)
        assert oracle.accepted <= oracle.drafted and oracle.drafted == oracle.accepted  # it never fails
        assert oracle.time_ms <= policy.time_ms + 1e-9, points


def test_acceptance_counts_by_hand():
    # context [1, 2, 3, 1, 2] then output [3, 9]: at position 0 the suffix [1, 2] (length 2)
    # continues [3, 1, 2]; the output agrees on 3 (length 2 -> accepted in bucket <=2), then 9
    # differs from 1 (length 3 -> rejected in bucket <=3). At position 1 the suffix [.., 2, 3]
    # matches at end 3 (length 3, continuing [1, 2, 3]): 9 differs (rejected at length 3).
    cost = simulate.pinned_cost(FLAT)
    trace = {"prompt": [1, 2, 3, 1, 2], "output": [3, 9]}
    counts = simulate.acceptance_counts([trace], lambda: Drafter(cost))  # [kind, bucket, 2]
    b2, b3 = priors._bucket(2), priors._bucket(3)
    assert counts[0, b2].tolist() == [1, 0]
    assert counts[0, b3].tolist() == [0, 2]
    assert counts.sum() == 3


def test_acceptance_counts_follow_the_drafters_buckets_where_a_test_patches_them(monkeypatch):
    # The simulator reads the bucket table through lookahead.drafter.priors, as the drafter
    # does: a patched table reaches both (the by-hand case above, with buckets <=2 and more).
    monkeypatch.setattr(priors, "_BUCKET_UPPER", (2, 1 << 30))
    cost = simulate.pinned_cost(FLAT)
    trace = {"prompt": [1, 2, 3, 1, 2], "output": [3, 9]}
    counts = simulate.acceptance_counts([trace], lambda: Drafter(cost))
    assert counts.shape == (priors.N_KINDS, 2, 2)
    assert counts[0, 0].tolist() == [1, 0] and counts[0, 1].tolist() == [0, 2]


def test_report_and_command_line(tmp_path, capsys):
    prompt, output = copy_trace()
    traces = [{"id": "copy", "category": "edit", "temperature": 0.0, "prompt": prompt, "output": output},
              {"id": "prose", "category": "open", "temperature": 0.0, "prompt": [1, 2], "output": [5, 6, 7]}]
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(traces))
    simulate.main([str(path), "--curve", "1:10,64:10"])
    out = capsys.readouterr().out
    assert "edit" in out and "open" in out and "all" in out
    summary = simulate.report(traces, simulate.pinned_cost(FLAT), lambda sampled: Drafter(simulate.pinned_cost(FLAT)))
    assert summary["edit"]["speedup"] == pytest.approx(30.0)
    assert summary["open"]["speedup"] == 1.0 and summary["open"]["worst"] == 1.0
    with pytest.raises(SystemExit):
        simulate.main([str(path), "--curve", "ten"])
    for bad in ("-1", "nan", "fast"):
        with pytest.raises(SystemExit):
            simulate.main([str(path), "--prefill", bad])


def test_prefill_rate_sets_the_end_to_end_figures(tmp_path, capsys):
    """`--prefill`: the prompt's prefill at a given ms per token, for the policy's and the
    oracle's end to end; free prefill leaves the decode figures, a costly one pulls both to 1."""
    prompt, output = copy_trace()
    traces = [{"id": "copy", "category": "edit", "temperature": 0.0, "prompt": prompt, "output": output}]
    cost = simulate.pinned_cost(FLAT)

    def summary(prefill_ms):
        return simulate.report(traces, cost, lambda sampled: Drafter(cost), prefill_ms=prefill_ms)["edit"]

    free, default, costly = summary(0.0), summary(None), summary(1e6)
    assert free["end_to_end"] == pytest.approx(free["speedup"])
    assert free["oracle_end_to_end"] == pytest.approx(free["oracle"])
    assert free["oracle_end_to_end"] >= free["end_to_end"] > default["end_to_end"] > costly["end_to_end"] > 1.0
    assert costly["oracle_end_to_end"] == pytest.approx(1.0, abs=1e-3)
    # the default prices a prompt token at t(64) / 64 of the curve
    n_prompt = len(prompt)
    r, _ = simulate.replay_trace(traces[0], cost, lambda sampled: Drafter(cost))
    assert r.prefill_ms == pytest.approx(n_prompt * cost.cost_ms(64) / 64)
    assert default["end_to_end"] == pytest.approx(summary(cost.cost_ms(64) / 64)["end_to_end"])
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(traces))
    simulate.main([str(path), "--curve", "1:10,64:10", "--prefill", "0"])
    assert "its e2e" in capsys.readouterr().out


def test_steps_add_up_to_the_replays(tmp_path, capsys):
    """The steps command's passes are the replay's: they cover the output, and their times
    and drafts sum to the policy's and the oracle's totals."""
    prompt = [5, 6, 7, 8, 9, 4, 5, 6, *range(100, 140)]
    output = [7, 8, 1, 100, 101, 102, *range(103, 130), 2, 3]
    trace = {"id": "mixed", "category": "edit", "temperature": 0.0, "prompt": prompt, "output": output}
    cost = simulate.pinned_cost(((1, 10.0), (2, 12.0), (8, 20.0), (64, 80.0)))
    policy, oracle = simulate.trace_steps(trace, cost)
    for steps, replayed in ((policy, simulate.replay(prompt, output, Drafter(cost), cost.cost_ms)),
                            (oracle, simulate.replay_oracle(prompt, output, Drafter(cost), cost.cost_ms))):
        assert [s.position for s in steps] == list(np.cumsum([0] + [s.accepted + 1 for s in steps[:-1]]))
        assert sum(s.accepted + 1 for s in steps) == len(output)
        assert sum(s.ms for s in steps) == pytest.approx(replayed.time_ms)
        assert (len(steps), sum(s.drafted for s in steps)) == (replayed.passes, replayed.drafted)
        assert all(s.ms == cost.cost_ms(s.drafted + 1) for s in steps)
    assert any(s.drafted and s.accepted < s.drafted for s in policy)  # [7, 8] drafted, 8 refused
    assert all(s.kind == -1 and s.match_length == 0 for s in policy if not s.drafted)
    path = tmp_path / "traces.json"
    path.write_text(json.dumps([trace]))
    simulate.main(["steps", str(path), "--id", "mixed", "--curve", "1:10,2:12,8:20,64:80"])
    out = capsys.readouterr().out
    assert f"drafter: {len(policy)} passes, {sum(s.ms for s in policy):.0f} ms" in out
    assert f"oracle: {len(oracle)} passes" in out and "without a draft" in out and "context match" in out
    with pytest.raises(SystemExit):
        simulate.main(["steps", str(path), "--id", "nothing"])
    assert "no trace of that id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        simulate.main(["steps", str(path)])
    assert "--id" in capsys.readouterr().err


def test_padding_on_the_command_line(tmp_path, capsys):
    prompt, output = copy_trace()
    path = tmp_path / "traces.json"
    path.write_text(json.dumps([{"id": "copy", "category": "edit", "temperature": 0.0, "prompt": prompt,
                                 "output": output}]))
    simulate.main([str(path), "--curve", "1:10,16:20,32:30", "--padding", "12:16"])
    assert "padding 12:16" in capsys.readouterr().out
    padded = simulate.pinned_cost(((1, 10.0), (16, 20.0), (32, 30.0)), padding=(12, 16))
    assert padded.cost_ms(17) == padded.cost_ms(32) == pytest.approx(30.0)
    for bad in ("1:16", "12", "a:b"):
        with pytest.raises(SystemExit):
            simulate.main([str(path), "--padding", bad])
        assert f"got {bad!r}" in capsys.readouterr().err


def test_pinned_cost_learns_nothing():
    cost = simulate.pinned_cost(((1, 8.8), (2, 22.9)))
    cost.observe(1, 100.0)
    assert cost.cost_ms(1) == pytest.approx(8.8) and isinstance(cost, CostModel)


def test_shipped_priors_are_what_the_command_prints():
    traces = json.loads(TRACES.read_text())
    cost = simulate.pinned_cost()
    for sampled, shipped in ((False, priors._PRIOR_MEAN), (True, priors._PRIOR_MEAN_SAMPLED)):
        chosen = [t for t in traces if (t["temperature"] > 0) == sampled]
        assert chosen, f"no traces with sampled={sampled} in {TRACES}"
        fitted = simulate.fit_priors(chosen, lambda: Drafter(cost, sampled=sampled))
        np.testing.assert_allclose(np.array(shipped), fitted, atol=1e-9)


def test_priors_command_prints_tables_drafter_py_can_hold(tmp_path, capsys):
    rng = np.random.RandomState(0)
    source = rng.randint(10, 200, size=80).tolist()
    traces = [{"id": "a", "category": "edit", "temperature": 0.0, "prompt": source, "output": source[:60]},
              {"id": "b", "category": "edit", "temperature": 0.7, "prompt": source, "output": source[5:40]}]
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(traces))
    simulate.main(["priors", str(path)])
    out = capsys.readouterr().out
    namespace = {}
    exec(out, namespace)  # valid Python, the shape priors.py uses
    for name in ("_PRIOR_MEAN", "_PRIOR_MEAN_SAMPLED"):
        table = np.array(namespace[name])
        assert table.shape == np.array(priors._PRIOR_MEAN).shape
        assert np.all((table >= 0.02) & (table <= 0.995)) and np.all(np.diff(table, axis=-1) >= 0)


def test_skipping_matches_that_cannot_pay_changes_no_draft(monkeypatch):
    # Drafter._may_pay skips building candidates that no draft length could pay for. It is an
    # exact bound, so every recorded trace must replay pass for pass as without it, and it
    # must actually skip (else this test proves nothing).
    traces = json.loads(TRACES.read_text())
    cost = simulate.pinned_cost(((1, 7.3), (2, 13.0), (4, 17.0), (8, 26.0), (16, 45.0), (32, 80.0), (64, 153.0)))
    real = Drafter._may_pay
    skipped = []

    def counting(self, *args):
        paid = real(self, *args)
        skipped.append(not paid)
        return paid

    def replay_all():
        out = []
        for t in traces:
            r = simulate.replay(t["prompt"], t["output"], Drafter(cost, sampled=t["temperature"] > 0), cost.cost_ms,
                                t.get("references", ()), t.get("max_tokens"))
            out.append((r.passes, r.drafted, r.accepted))
        return out

    monkeypatch.setattr(Drafter, "_may_pay", counting)
    with_skip = replay_all()
    monkeypatch.setattr(Drafter, "_may_pay", lambda self, *args: True)
    without_skip = replay_all()
    assert with_skip == without_skip
    assert sum(skipped) > len(skipped) // 4


COPY_EDITS = TRACES.parent / "copy_edit_traces.json"


def test_learned_substitutions_save_passes_on_renames(monkeypatch):
    # The synthetic whole-file edits (samples/examples/copy_edit_traces.py): a rename recurs,
    # and drafting through the later occurrences takes fewer target passes than failing at each.
    traces = {t["id"]: t for t in json.loads(COPY_EDITS.read_text())}
    cost = simulate.pinned_cost(((1, 7.6), (2, 14.0), (4, 19.0), (8, 29.0), (16, 50.0), (32, 91.0), (64, 175.0)))

    def passes(trace_id):
        t = traces[trace_id]
        return simulate.replay(t["prompt"], t["output"], Drafter(cost), cost.cost_ms, (), t["max_tokens"]).passes

    ids = ("copy-rename-counts", "copy-rename-backoff", "copy-backup-path")
    with_rules = [passes(i) for i in ids]
    monkeypatch.setattr(rejoin, "MAX_RULES", 0)
    without = [passes(i) for i in ids]
    assert all(w < wo for w, wo in zip(with_rules, without)), (with_rules, without)


def test_replay_of_randomly_edited_copies_runs_through(monkeypatch):
    # Copies with random substitutions, insertions and deletions, small vocabularies (many
    # short matches, many rejoins and learned rules), with and without a reference: every
    # replay must emit exactly the output, and rules must actually have been learned.
    rng = np.random.default_rng(0)
    cost = simulate.pinned_cost(((1, 10.0), (64, 12.0)))  # nearly flat: drafts at every chance
    learned = []
    real = Drafter._learn_rule

    def counting(self, *args):
        before = len(self.rules)
        real(self, *args)
        learned.append(len(self.rules) > before)

    monkeypatch.setattr(Drafter, "_learn_rule", counting)
    for trial in range(120):
        vocab = int(rng.integers(3, 30))
        source = rng.integers(0, vocab, size=int(rng.integers(5, 200))).tolist()
        output = []
        for token in source:
            r = rng.random()
            if r < 0.05:
                continue
            output.extend([int(rng.integers(0, vocab))] if r < 0.12 else [token, int(rng.integers(0, vocab))]
                          if r < 0.15 else [token])
        if not output:
            continue
        refs = [source[: len(source) // 2]] if trial % 3 == 0 else []
        prompt = source if trial % 3 else [1, 2]
        r = simulate.replay(prompt, output, Drafter(cost, sampled=bool(trial % 2)), cost.cost_ms, refs,
                            len(output) + int(rng.integers(0, 5)))
        o = simulate.replay_oracle(prompt, output, Drafter(cost), cost.cost_ms, refs)
        assert r.tokens == len(output) and o.tokens == len(output)
        assert o.time_ms <= r.time_ms + 1e-9
    assert any(learned)


def test_replays_stop_drafts_at_the_traces_end_of_generation_tokens():
    """A trace's "eog" list reaches the drafter, as the engine gives it the model's: a copy of
    the prompt's document then ends its draft at the end-of-turn token (5 here), not past it."""
    from lookahead.index import SuffixIndex
    from lookahead.simulate import pinned_cost, with_stops

    doc = list(range(100, 130))
    prompt = doc + [5, 6, 7] + doc[:4]
    drafter = with_stops(Drafter(pinned_cost(((1, 10.0), (64, 10.0)))), {"eog": [5]})
    index = SuffixIndex()
    index.extend(prompt)
    assert drafter.propose(index, 64).tokens == doc[4:] + [5]
    assert with_stops(Drafter(pinned_cost()), {}).is_stop is None


DEFAULT_MODEL_TRACES = {0.0: TRACES.parent / "default_model_traces.json",
                        0.7: TRACES.parent / "default_model_traces_t07.json"}


@pytest.mark.parametrize("temperature", sorted(DEFAULT_MODEL_TRACES))
def test_the_default_models_traces_are_whole_plain_outputs_of_the_shipped_workloads(temperature):
    """Each trace is one workload's plain output at the file's temperature (seed 1 when
    sampled): it stops at its cap or right after an end-of-generation token, and its id and
    category are a shipped workload's."""
    from lookahead.cli.bench import load_workloads

    workloads = {w["id"]: w for path in (TRACES.parents[1] / "workloads.jsonl", TRACES.parent / "short_rag.jsonl")
                 for w in load_workloads(path)}
    traces = json.loads(DEFAULT_MODEL_TRACES[temperature].read_text())
    assert sorted(t["id"] for t in traces) == sorted(workloads)
    for t in traces:
        assert t["category"] == workloads[t["id"]]["category"] and t["temperature"] == temperature
        assert temperature == 0.0 or t["seed"] == 1
        eog = set(t["eog"])
        assert len(t["output"]) == t["max_tokens"] or t["output"][-1] in eog, t["id"]
        assert not eog.intersection(t["output"][:-1]), t["id"]  # generation stops at the first one
