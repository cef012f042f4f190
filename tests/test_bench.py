"""`lookahead bench`: its computations by hand (no model), then the command end to end."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from lookahead.cli.bench import (
    LOOKAHEAD,
    LOOP_SHARE,
    PLAIN,
    Run,
    fit_alpha,
    format_table,
    geometric_mean,
    load_workloads,
    mean_draft_length,
    predicted_speedup,
    prompt_text,
    relative_verify_cost,
    repeat_share,
    require_matplotlib,
    resolve_prompt_lookup_calls,
    rotated,
    summarise,
    summarise_group,
    summarise_workload,
    workload_seed,
)

BIN = Path(sys.executable).parent / "lookahead"
LINEAR_CURVE_MS = [10.0 + 5.0 * (n - 1) for n in range(0, 65)]  # t(n) = 10 + 5 (n - 1); index 0 unused
LINEAR_CURVE_MS[0] = 10.0
DRAFTS = [(4, 4), (4, 1), (2, 0)]  # (drafted, accepted): 5 accepted, 2 drafts with a rejection


# ---- pure computations ---------------------------------------------------------------------
@pytest.mark.parametrize("values, expected", [
    ([1.0, 4.0], 2.0),
    ([2.0, 8.0, None], 4.0),  # None (no baseline) is skipped
    ([0.5, 2.0], 1.0),
    ([3.0], 3.0),
])
def test_geometric_mean(values, expected):
    assert geometric_mean(values) == pytest.approx(expected)


def test_geometric_mean_of_nothing_is_none():
    assert geometric_mean([]) is None
    assert geometric_mean([None]) is None


@pytest.mark.parametrize("drafts, alpha", [
    (DRAFTS, 5 / 7),
    ([(3, 3), (5, 5)], 1.0),  # never rejected
    ([(4, 0), (2, 0)], 0.0),  # always rejected at once
    ([(6, 2)], 2 / 3),  # tokens after the first rejection were never tested: not evidence
    ([], None),
])
def test_fit_alpha(drafts, alpha):
    assert fit_alpha(drafts) == (None if alpha is None else pytest.approx(alpha))


def test_mean_draft_length():
    assert mean_draft_length(DRAFTS) == pytest.approx(10 / 3)
    assert mean_draft_length([]) is None


def test_relative_verify_cost():
    # Linear curve: each extra token costs half a single decode, whatever k.
    assert relative_verify_cost(LINEAR_CURVE_MS, 2) == pytest.approx(0.5)
    assert relative_verify_cost(LINEAR_CURVE_MS, 10 / 3) == pytest.approx(0.5)
    curve = [11.0, 11.0, 21.0, 25.0, 29.0]  # t(1) = 11, t(2) = 21, t(3) = 25, t(4) = 29
    assert relative_verify_cost(curve, 3) == pytest.approx((29 - 11) / (3 * 11))
    assert relative_verify_cost(curve, 1.5) == pytest.approx((23 - 11) / (1.5 * 11))  # t(2.5) = 23
    assert relative_verify_cost(curve, 0) == 0.0


@pytest.mark.parametrize("alpha, k, c, expected", [
    (0.5, 2, 0.5, (1 - 0.125) / (0.5 * 2)),  # 1.75 tokens per pass, pass costs 2 decodes
    (1.0, 3, 0.25, 4 / 1.75),  # all accepted: k + 1 tokens per pass
    (0.0, 4, 0.1, 1 / 1.4),  # nothing accepted: the draft is pure cost
    (0.8, 0, 0.3, 1.0),  # no draft: plain decoding
    (0.9, 8, 0.0, (1 - 0.9 ** 9) / 0.1),  # free verification
])
def test_predicted_speedup(alpha, k, c, expected):
    assert predicted_speedup(alpha, k, c) == pytest.approx(expected)


def test_resolve_prompt_lookup_calls():
    # context 100, draft 10 -> next context 104: 3 accepted + 1 sampled; then all 10 + bonus;
    # an empty draft is no draft; the last call's outcome is unknown.
    calls = [(100, 10), (104, 10), (115, 0), (116, 5)]
    assert resolve_prompt_lookup_calls(calls) == [(10, 3), (10, 10)]
    assert resolve_prompt_lookup_calls([(50, 10)]) == []
    assert resolve_prompt_lookup_calls([]) == []


def test_seed_is_fixed_per_workload_and_rep():
    assert workload_seed("edit-a", 0) == workload_seed("edit-a", 0)
    assert workload_seed("edit-a", 0) != workload_seed("edit-a", 1)
    assert workload_seed("edit-a", 0) != workload_seed("edit-b", 0)
    assert 0 <= workload_seed("x", 7) < 2 ** 31


def test_rotated():
    assert rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert rotated([], 3) == []


# ---- loops ---------------------------------------------------------------------------------
FILE = "".join(f"def f{i}(x):\n    return x * {i} + {i * 7}  # step {i}\n\n" for i in range(12))


def test_repeat_share_counts_what_the_output_writes_twice():
    block = "# Your code here\n```\n"
    loop = "```python\n" + block * 20
    # 430 characters; every window ending past the first block, its "\n" before and a window
    # (77 characters) occurred before
    assert repeat_share(loop) == pytest.approx((430 - 77) / 430)
    assert repeat_share("The sky is blue because air scatters short wavelengths of sunlight more "
                        "than long ones, so blue light reaches the eye from every direction.") == 0.0
    assert repeat_share("short " * 3) == 0.0  # shorter than the window
    # Half prose, half the same sentence again and again.
    prose = "".join(f"Sentence {i} says something new about item number {i * 13}. " for i in range(8))
    share = repeat_share(prose + "We will loop on this sentence now, over and over. " * 8)
    assert 0.3 < share < 0.6


def test_repeat_share_does_not_count_copies_of_the_prompt():
    """An edit repeats its file: that is the work, not a loop. The same text repeated twice in
    the output is still not a loop when the prompt holds it (a file with repeated blocks)."""
    assert repeat_share(FILE, prompt="Rename nothing.\n\n" + FILE) == 0.0
    twice = FILE[:400] + FILE[:400]
    assert repeat_share(twice, prompt=FILE) == 0.0
    assert repeat_share(twice) > 0.4  # without the prompt, the second copy repeats the first


def test_prompt_text_of_chat_and_raw_workloads():
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}) == "s\nu"


def test_groups_report_loops_and_the_speedup_without_them():
    def pair(workload, plain_s, la_s, share):
        return [Run(workload, "edit", 0.0, 0, PLAIN, plain_s, "x", repeat_share=share),
                Run(workload, "edit", 0.0, 0, LOOKAHEAD, la_s, "x", repeat_share=share)]

    # w1 loops (and gains 4x); w2 and w3 do not (2x and 1x).
    runs = pair("w1", 4.0, 1.0, 0.9) + pair("w2", 2.0, 1.0, 0.0) + pair("w3", 1.0, 1.0, LOOP_SHARE - 0.01)
    rows, summaries = summarise(runs)
    assert [row["loops"] for row in rows] == [True, False, False]
    assert rows[0]["repeat_share"] == 0.9
    group = summaries[0]
    assert group["loops"] == {"workloads": 1, "of": 3}
    assert group["speedup"][LOOKAHEAD] == pytest.approx(2.0, abs=1e-3)  # (4 × 2 × 1)^(1/3)
    assert group["loop_free"]["n"] == 2
    assert group["loop_free"]["speedup"][LOOKAHEAD] == pytest.approx(2 ** 0.5, abs=1e-3)
    table = format_table(summaries)
    assert "loops" in table and "loop-free ×" in table and "1/3" in table and "1.41" in table
    # Runs that were never judged (no text measured) give no loop figures.
    unjudged = summarise([Run("w", "edit", 0.0, 0, PLAIN, 1.0, "x"), Run("w", "edit", 0.0, 0, LOOKAHEAD, 1.0, "x")])
    assert unjudged[0][0]["loops"] is None and unjudged[1][0]["loops"] is None


# ---- summaries -----------------------------------------------------------------------------
def _runs(workload="w1", category="edit", temperature=0.0, plain_s=(1.0, 3.0, 2.0), lookahead_s=(1.0, 1.0, 1.0),
          same_text=True):
    runs = []
    for rep, (p, la, drafts) in enumerate(zip(plain_s, lookahead_s, [[d] for d in DRAFTS])):
        runs.append(Run(workload, category, temperature, rep, PLAIN, p, text="out"))
        runs.append(Run(workload, category, temperature, rep, LOOKAHEAD, la, text="out" if same_text else "other",
                        drafts=drafts, generated_tokens=10, target_passes=5, reused_prompt_tokens=0))
    return runs


def test_summarise_workload():
    row = summarise_workload(_runs(), LINEAR_CURVE_MS)
    assert (row["id"], row["category"], row["temperature"]) == ("w1", "edit", 0.0)
    plain, la = row["methods"][PLAIN], row["methods"][LOOKAHEAD]
    assert plain["seconds"] == [1.0, 3.0, 2.0] and plain["median_s"] == 2.0 and plain["speedup"] == 1.0
    assert plain["identical"] is None and plain["speculation"] is None
    assert la["median_s"] == 1.0 and la["speedup"] == 2.0 and la["identical"] is True
    spec = la["speculation"]
    assert (spec["drafted"], spec["accepted"], spec["draft_passes"], spec["rejected_drafts"]) == (10, 5, 3, 2)
    assert spec["acceptance_rate"] == 0.5
    assert spec["tokens_per_pass"] == 2.0  # 30 tokens in 15 passes
    assert spec["alpha"] == pytest.approx(5 / 7, abs=1e-4)
    assert spec["k"] == pytest.approx(10 / 3, abs=1e-3)
    assert spec["c"] == 0.5
    # (1 - (5/7)^(13/3)) / ((2/7)(1 + 10/3 * 0.5))
    assert spec["predicted_speedup"] == pytest.approx(1.0071, abs=1e-4)
    assert spec["accept_histogram"] == {"0": 1, "1": 1, "4": 1}


def test_identical_only_at_temperature_zero():
    assert summarise_workload(_runs(same_text=False))["methods"][LOOKAHEAD]["identical"] is False
    assert summarise_workload(_runs(temperature=0.7))["methods"][LOOKAHEAD]["identical"] is None


def test_summarise_group_pools_drafts_and_takes_geometric_mean():
    runs = _runs("w1") + _runs("w2", plain_s=(1.0, 1.0, 1.0), lookahead_s=(2.0, 2.0, 2.0), same_text=False)
    rows = [summarise_workload([r for r in runs if r.workload == w], LINEAR_CURVE_MS) for w in ("w1", "w2")]
    group = summarise_group(rows, "edit", runs, LINEAR_CURVE_MS)
    assert group["n"] == 2 and group["category"] == "edit" and group["temperature"] == 0.0
    assert group["speedup"] == {LOOKAHEAD: pytest.approx(1.0)}  # sqrt(2 × 0.5)
    assert group["identical"] == {LOOKAHEAD: {"identical": 1, "of": 2}}
    spec = group["speculation"][LOOKAHEAD]
    assert (spec["drafted"], spec["accepted"], spec["rejected_drafts"]) == (20, 10, 4)
    assert spec["alpha"] == pytest.approx(5 / 7, abs=1e-4)
    assert spec["tokens_per_pass"] == 2.0
    assert "accept_histogram" not in spec


def test_summarise_orders_categories_then_all_per_temperature():
    runs = (_runs("e1", "edit") + _runs("o1", "open") + _runs("e1", "edit", 0.7) + _runs("o1", "open", 0.7))
    rows, summaries = summarise(runs, LINEAR_CURVE_MS)
    assert len(rows) == 4
    assert [(s["category"], s["temperature"]) for s in summaries] == [
        ("edit", 0.0), ("open", 0.0), ("all", 0.0), ("edit", 0.7), ("open", 0.7), ("all", 0.7)]
    assert summaries[2]["n"] == 2
    table = format_table(summaries)
    for column in ("category", "lookahead ×", "acceptance", "tokens/pass", "alpha", "predicted ×", "identical"):
        assert column in table
    assert "2/2" in table  # both t=0 outputs identical


# ---- workloads file ------------------------------------------------------------------------
def _copy_and_raw_workloads(repeats):
    """The end-to-end runs' two workloads: a chat that copies a text, a raw prompt."""
    text = "The quick brown fox jumps over the lazy dog. " * repeats
    return [
        {"id": "copy-chat", "category": "edit", "max_tokens": 64,
         "messages": [{"role": "user", "content": f"Repeat this text exactly:\n\n{text}"}]},
        {"id": "raw-prompt", "category": "open", "max_tokens": 64, "prompt": "Once upon a time"},
    ]


def _write(tmp_path, rows, name="w.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _chat(id, category, max_tokens=100):
    return {"id": id, "category": category, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


def test_load_workloads_filters_limits_and_caps(tmp_path):
    path = _write(tmp_path, [_chat("e1", "edit"), _chat("e2", "edit", 8), _chat("e3", "edit"),
                             {"id": "o1", "category": "open", "prompt": "Once upon", "max_tokens": 50}, ""])
    assert [w["id"] for w in load_workloads(path)] == ["e1", "e2", "e3", "o1"]
    chosen = load_workloads(path, limit=2, max_tokens_cap=16)
    assert [(w["id"], w["max_tokens"]) for w in chosen] == [("e1", 16), ("e2", 8), ("o1", 16)]
    assert [w["id"] for w in load_workloads(path, categories=["open"])] == ["o1"]


@pytest.mark.parametrize("row, message", [
    ("{not json", "w.jsonl:2: not JSON"),
    ({"id": "x", "category": "edit", "messages": [{"role": "user", "content": "a"}]}, "'max_tokens' must be"),
    ({"id": "x", "category": "edit", "prompt": "a", "messages": [], "max_tokens": 5}, "exactly one of"),
    ({"id": "x", "category": "edit", "prompt": 3, "max_tokens": 5}, "'prompt' must be a string"),
    ({"id": "", "category": "edit", "prompt": "a", "max_tokens": 5}, "'id' must be"),
    ({"id": "x", "category": "edit", "messages": [{"role": "user"}], "max_tokens": 5}, "'messages' must be"),
    (_chat("e1", "edit"), "id 'e1' appears twice"),
])
def test_load_workloads_names_the_bad_line(tmp_path, row, message):
    path = _write(tmp_path, [_chat("e1", "edit"), row])
    with pytest.raises(click.BadParameter, match=message.replace("(", r"\(")):
        load_workloads(path)


def test_unknown_category_lists_the_ones_present(tmp_path):
    path = _write(tmp_path, [_chat("e1", "edit"), _chat("r1", "rag")])
    with pytest.raises(click.BadParameter, match="no workload has category 'poems'; the file has: edit, rag"):
        load_workloads(path, categories=["poems"])


def test_missing_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(click.ClickException, match=r"pip install 'lookahead\[bench\]'"):
        require_matplotlib()


def test_bench_help_lists_its_options():
    out = subprocess.run([str(BIN), "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in ("--temperature", "--reps", "--limit", "--category", "--max-tokens", "--methods", "--json",
                 "--plot", "--model", "--threads", "--n-ctx", "--llama-server", "--pld-tokens", "--serve", "--server",
                 "--api-key"):
        assert flag in out.stdout
    assert "bench" in subprocess.run([str(BIN), "--help"], capture_output=True, text=True, timeout=60).stdout


# ---- end to end ----------------------------------------------------------------------------
@pytest.mark.model
def test_bench_end_to_end_json_and_plot(tmp_path):
    path = _write(tmp_path, _copy_and_raw_workloads(repeats=4))
    png = tmp_path / "bench.png"
    out = subprocess.run([str(BIN), "bench", str(path), "--reps", "1", "--max-tokens", "16", "--methods", "plain",
                          "--methods", "lookahead", "--json", "--plot", str(png), "--n-ctx", "1024"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {"config", "workloads", "summary", "runs"}
    config = result["config"]
    assert config["reps"] == 1 and config["n_ctx"] == 1024 and config["methods"] == [PLAIN, LOOKAHEAD]
    assert config["model"].endswith(".gguf") and config["threads"]["n_threads"] >= 1 and config["date"]
    assert config["max_tokens_cap"] == 16 and "prefill" in config["prefix_cache"]
    from lookahead.adapters import health

    assert config["llama_cpp_patches"] == health.build_patches()
    assert config["exact_batches"] is health.exact_batches_requested()
    assert [row["id"] for row in result["workloads"]] == ["copy-chat", "raw-prompt"]
    for row in result["workloads"]:
        assert row["temperature"] == 0.0
        assert set(row["methods"]) == {PLAIN, LOOKAHEAD}
        assert row["methods"][PLAIN]["speedup"] == 1.0
        la = row["methods"][LOOKAHEAD]
        assert la["speedup"] == pytest.approx(row["methods"][PLAIN]["median_s"] / la["median_s"], rel=2e-3)
        assert la["identical"] is (la_text(result, row["id"]) == la_text(result, row["id"], PLAIN))
        assert {"drafted", "accepted", "target_passes", "accept_histogram", "alpha", "k",
                "predicted_speedup"} <= set(la["speculation"])
    # (whether 16 tokens of a copy are worth drafting is the cost model's call on this machine,
    # so the counts are checked for consistency, not for being positive)
    copy = result["workloads"][0]["methods"][LOOKAHEAD]["speculation"]
    assert 0 <= copy["accepted"] <= copy["drafted"]
    assert copy["generated_tokens"] == copy["target_passes"] + copy["accepted"]
    assert [s["category"] for s in result["summary"]] == ["edit", "open", "all"]
    overall = result["summary"][-1]
    assert overall["n"] == 2 and LOOKAHEAD in overall["speedup"] and overall["identical"][LOOKAHEAD]["of"] == 2
    assert all(isinstance(r["contended"], bool) for r in result["runs"] if r["method"] == LOOKAHEAD)
    assert all(r["contended"] is None for r in result["runs"] if r["method"] == PLAIN)
    assert all(0.0 <= r["repeat_share"] <= 1.0 for r in result["runs"])
    assert overall["loops"]["of"] == 2 and overall["loop_free"]["n"] == 2 - overall["loops"]["workloads"]
    assert "wrote" in out.stderr and "[2/2] raw-prompt t=0 lookahead" in out.stderr
    assert ("loop-free speedups" in out.stderr) == (overall["loops"]["workloads"] > 0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def la_text(result: dict, workload: str, method: str = LOOKAHEAD) -> str:
    return next(r["text"] for r in result["runs"] if r["workload"] == workload and r["method"] == method)


def test_sampled_speedups_compare_seconds_per_output_token():
    from lookahead.cli.bench import Run, summarise_workload

    # At t=0.7 lookahead wrote twice the tokens in 1.5x the time: per token it is faster.
    # Decode time per token after the first: (2.0 - 0.5) / 99 against (3.0 - 0.5) / 199.
    runs = [Run("w", "edit", 0.7, 0, "plain", 2.0, "x", ttft_s=0.5, output_tokens=100),
            Run("w", "edit", 0.7, 0, "lookahead", 3.0, "y", ttft_s=0.5, output_tokens=200)]
    row = summarise_workload(runs)
    assert row["methods"]["lookahead"]["speedup"] == pytest.approx((1.5 / 99) / (2.5 / 199), abs=1e-4)  # 1.206
    # At t=0 the outputs are the same request: wall time is compared as is.
    runs = [Run("w", "edit", 0.0, 0, "plain", 2.0, "x", output_tokens=100),
            Run("w", "edit", 0.0, 0, "lookahead", 3.0, "x", output_tokens=200)]
    assert summarise_workload(runs)["methods"]["lookahead"]["speedup"] == pytest.approx(2.0 / 3.0, abs=1e-4)


def test_greedy_texts_that_differ_compare_time_at_plain_length():
    """A greedy text that left plain's at a near-tie and stopped at half the length is not twice
    as fast: its time is taken at plain's length (first token + decode per token × the rest)."""
    plain = Run("w", "open", 0.0, 0, PLAIN, 2.0, "long text", ttft_s=0.2, output_tokens=181)  # 10 ms/token
    half = Run("w", "open", 0.0, 0, LOOKAHEAD, 1.1, "short", ttft_s=0.2, output_tokens=91)  # 10 ms/token
    la = summarise_workload([plain, half])["methods"][LOOKAHEAD]
    assert la["identical"] is False
    assert la["speedup"] == pytest.approx(1.0, abs=1e-4)  # not 2.0 / 1.1
    assert la["median_s"] == 1.1  # the wall time itself is still reported
    assert half.cost_at_length(91) == pytest.approx(1.1)  # its own length: its own time
    # Identical texts: the wall times, as they are.
    same = Run("w", "open", 0.0, 0, LOOKAHEAD, 1.0, "long text", ttft_s=0.2, output_tokens=181)
    assert summarise_workload([plain, same])["methods"][LOOKAHEAD]["speedup"] == pytest.approx(2.0)


def test_groups_report_decode_only_speedup_the_worst_workload_and_the_prefill_share():
    from lookahead.cli.bench import Run, summarise

    def pair(workload, plain_s, plain_ttft, la_s, la_ttft):
        return [Run(workload, "rag", 0.0, 0, "plain", plain_s, "x", ttft_s=plain_ttft, output_tokens=11),
                Run(workload, "rag", 0.0, 0, "lookahead", la_s, "x", ttft_s=la_ttft, output_tokens=11)]

    # w1: end to end 2.0 / 1.0; decode (2.0 - 1.0) / (1.0 - 0.5) = 2. w2: a loss, 1.0 / 1.25.
    runs = pair("w1", 2.0, 1.0, 1.0, 0.5) + pair("w2", 1.0, 0.8, 1.25, 0.85)
    _, summaries = summarise(runs)
    group = summaries[0]
    assert group["worst"]["lookahead"] == {"speedup": 0.8, "workload": "w2"}
    assert group["decode_speedup"]["lookahead"] == pytest.approx((2.0 * (0.2 / 0.4)) ** 0.5, abs=1e-3)
    assert group["prefill_share"] == pytest.approx((0.5 + 0.8) / 2, abs=1e-4)
    table = format_table(summaries)
    assert "worst ×" in table and "decode ×" in table and "0.80" in table


@pytest.mark.model
def test_quantized_copies_are_made_once_and_scored_by_perplexity(model_path, tmp_path, monkeypatch):
    from lookahead.adapters.tools import file_perplexity
    from lookahead.cli.bench.quant import quantized_model

    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path))
    made = []
    copy = quantized_model(model_path, "Q4_0", made.append)
    assert made and copy.parent == tmp_path / "models"
    with open(copy, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert quantized_model(model_path, "Q4_0", made.append) == copy and len(made) == 1  # made once
    text = (Path(__file__).resolve().parents[1] / "samples" / "docs" / "meeting_notes.md").read_text()
    ppl, n, desc = file_perplexity(model_path, text, 512, n_ctx=512)
    ppl_q, n_q, desc_q = file_perplexity(copy, text, 512, n_ctx=512)
    assert n == n_q > 100 and "Q4_1" in desc and "Q4_0" in desc_q
    assert 1.0 < ppl < 100.0 and 1.0 < ppl_q < 100.0 and ppl_q != ppl


# ---- through the server's HTTP API (--serve / --server) --------------------------------------
def test_http_request_bodies():
    from lookahead.cli.bench.http import HTTP_LOOKAHEAD, HTTP_PLAIN, HTTP_PREDICTION, request_body

    chat = {"id": "c", "category": "edit", "max_tokens": 9,
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "first"},
                         {"role": "assistant", "content": "A"}, {"role": "user", "content": "the file"}]}
    raw = {"id": "r", "category": "open", "max_tokens": 5, "prompt": "Once upon"}
    for method in (HTTP_PLAIN, HTTP_LOOKAHEAD, HTTP_PREDICTION):
        body = request_body(method, chat, 0.7, 11)
        assert body["cache_prompt"] is False and body["messages"] == chat["messages"]
        assert (body["max_tokens"], body["temperature"], body["seed"]) == (9, 0.7, 11)
        assert body.get("speculate", True) is (method != HTTP_PLAIN)
        assert ("prediction" in body) is (method == HTTP_PREDICTION)
    assert request_body(HTTP_PREDICTION, chat, 0, 1)["prediction"] == {"type": "content", "content": "the file"}
    body = request_body(HTTP_PREDICTION, raw, 0, 1)
    assert body["prompt"] == "Once upon" and body["prediction"]["content"] == "Once upon" and "messages" not in body


@pytest.mark.parametrize("url, base", [("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
                                       ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
                                       ("https://host/prefix/v1", "https://host/prefix")])
def test_server_urls(url, base):
    from lookahead.cli.bench.http import base_url

    assert base_url(url) == base


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://host", "http://", "127.0.0.1:8000"])
def test_bad_server_urls_are_named(url):
    from lookahead.cli.bench.http import base_url

    with pytest.raises(click.BadParameter, match=re.escape(repr(url))):
        base_url(url)


def _http_run(method, rep=0, seconds=1.0, text="out", workload="w1", category="edit", temperature=0.0, **kw):
    from lookahead.cli.bench.http import HttpRun

    fields = dict(completion_tokens=11, request_ms=900.0, prefill_ms=100.0, ttft_s=0.2)
    fields.update(kw)
    return HttpRun(workload, category, temperature, rep, method, seconds, text, **fields)


def test_http_run_overhead_is_client_time_minus_library_time_per_token():
    run = _http_run("http-plain", seconds=1.0, completion_tokens=10, request_ms=960.0, ttft_s=0.28)
    assert run.overhead_ms_per_token == pytest.approx(4.0)  # (1000 - 960) / 10
    assert run.decode_ms_per_token == pytest.approx(80.0)  # (1000 - 280) / 9
    assert run.overhead_share == pytest.approx(0.05)
    assert _http_run("http-plain", completion_tokens=1).decode_ms_per_token is None
    assert _http_run("http-plain", request_ms=None).overhead_share is None
    assert _http_run("http-plain", completion_tokens=0).overhead_ms_per_token is None
    sampled = _http_run("http-plain", temperature=0.7, seconds=2.0, ttft_s=0.2, completion_tokens=10)
    assert sampled.cost == pytest.approx(0.2)  # (2.0 - 0.2) / 9
    assert _http_run("http-plain", seconds=2.0).cost == 2.0  # at temperature 0: the whole request


def test_http_summaries_by_hand():
    from lookahead.cli.bench.http import HTTP_LOOKAHEAD, HTTP_PLAIN, HTTP_PREDICTION, format_http_table, summarise_http

    runs = []
    for rep, (plain_s, la_s, pred_s) in enumerate([(2.0, 1.0, 0.5), (4.0, 1.0, 0.5), (3.0, 1.0, 0.5)]):
        runs += [_http_run(HTTP_PLAIN, rep, plain_s),
                 _http_run(HTTP_LOOKAHEAD, rep, la_s, drafted=10, accepted=5),
                 _http_run(HTTP_PREDICTION, rep, pred_s, text="out" if rep else "other", drafted=20, accepted=15,
                           prediction_accepted=12 + rep, prediction_rejected=3)]
    runs += [_http_run(HTTP_PLAIN, 0, 1.0, workload="w2", category="open"),
             _http_run(HTTP_LOOKAHEAD, 0, 1.0, workload="w2", category="open"),
             _http_run(HTTP_PREDICTION, 0, 1.0, workload="w2", category="open", prediction_accepted=1)]
    rows, summaries = summarise_http(runs)
    w1 = rows[0]["methods"]
    assert w1[HTTP_PLAIN]["speedup"] == 1.0 and w1[HTTP_LOOKAHEAD]["speedup"] == 3.0  # medians 3.0 / 1.0
    assert w1[HTTP_PREDICTION]["speedup"] == 6.0 and rows[0]["prediction_gain"] == 2.0
    assert w1[HTTP_LOOKAHEAD]["identical"] is True and w1[HTTP_PREDICTION]["identical"] is False
    assert w1[HTTP_PLAIN]["identical"] is None
    assert w1[HTTP_PREDICTION]["prediction_accepted"] == 13 and w1[HTTP_PREDICTION]["acceptance_rate"] == 0.75
    # plain at 3.0 s with request_ms 900, 11 tokens, the first at 0.2 s: (3000 - 900) / 11 ms of
    # overhead per token, over a decode time per token of (3000 - 200) / 10 = 280 ms
    assert w1[HTTP_PLAIN]["overhead_ms_per_token"] == pytest.approx(2100 / 11, abs=1e-4)
    assert w1[HTTP_PLAIN]["overhead_share"] == pytest.approx(2100 / 11 / 280, abs=1e-4)
    assert [s["category"] for s in summaries] == ["edit", "open", "all"]
    overall = summaries[-1]
    assert overall["n"] == 2
    assert overall["speedup"][HTTP_LOOKAHEAD] == pytest.approx(3.0 ** 0.5, abs=1e-4)  # geomean of 3 and 1
    assert overall["prediction_gain"] == pytest.approx(2.0 ** 0.5, abs=1e-4)
    assert overall["prediction_tokens"] == {"accepted": 14, "rejected": 3}  # medians 13 and 1; 3 and 0
    assert overall["identical"][HTTP_PREDICTION] == {"identical": 1, "of": 2}
    # the lookahead requests: 1.0 s each, (1000 - 900) / 11 ms per token, over (1000 - 200) / 10 = 80 ms
    assert overall["overhead"][HTTP_LOOKAHEAD]["ms_per_token"] == pytest.approx(100 / 11, abs=1e-4)
    assert overall["overhead"][HTTP_LOOKAHEAD]["share"] == pytest.approx(100 / 11 / 80, abs=1e-4)
    table = format_http_table(summaries)
    assert table.splitlines()[0].split()[:4] == ["category", "t", "n", "lookahead"]
    last = table.splitlines()[-1].split()
    assert last[:5] == ["all", "0", "2", "1.73", f"{6.0 ** 0.5:.2f}"] and f"{100 / 11 / 80:.1%}" in last


@pytest.mark.model
def test_bench_serve_end_to_end(tmp_path):
    """--serve: a real `lookahead serve` started and stopped by the bench, three methods per workload."""
    from lookahead.cli.bench.http import HTTP_METHODS, HTTP_PLAIN, HTTP_PREDICTION

    path = _write(tmp_path, _copy_and_raw_workloads(repeats=3))
    out = subprocess.run([str(BIN), "bench", str(path), "--serve", "--reps", "1", "--max-tokens", "12",
                          "--n-ctx", "512", "--threads", "1", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {"config", "workloads", "summary", "runs"}
    config = result["config"]
    assert config["server"].startswith("http://127.0.0.1:") and config["n_ctx"] == 512
    assert "--threads" in config["started_here"]["args"] and config["methods"] == list(HTTP_METHODS)
    assert len(result["runs"]) == 2 * 3
    for run in result["runs"]:
        assert run["reused_prompt_tokens"] == 0  # cache_prompt: false: every request paid its prefill
        assert 1 <= run["completion_tokens"] <= 12 and run["text"]
        # the library's time for a request is a part of the client's
        assert 0 < run["request_ms"] < 1000 * run["seconds"] and run["overhead_ms_per_token"] > 0
        if run["method"] != HTTP_PREDICTION:
            assert run["prediction_accepted"] == run["prediction_rejected"] == 0
        assert run["prediction_accepted"] <= run["accepted"] <= run["drafted"]
    for row in result["workloads"]:
        texts = {r["method"]: r["text"] for r in result["runs"] if r["workload"] == row["id"]}
        for method, cell in row["methods"].items():
            if method != HTTP_PLAIN:
                assert cell["identical"] is (texts[method] == texts[HTTP_PLAIN])
    assert [s["category"] for s in result["summary"]] == ["edit", "open", "all"]
    assert "[2/2] raw-prompt t=0 http-prediction" in out.stderr and "server overhead" in out.stderr
    # the server it started is gone
    port = int(config["server"].rsplit(":", 1)[1])
    import socket

    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_bench_server_errors_name_the_url(tmp_path):
    import socket

    path = _write(tmp_path, [_chat("e1", "edit")])
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    out = subprocess.run([str(BIN), "bench", str(path), "--server", url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"cannot reach a lookahead server at {url}" in out.stderr
    out = subprocess.run([str(BIN), "bench", str(path), "--server", "localhost:8000"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "'localhost:8000' is not an http:// or https:// URL" in out.stderr
    out = subprocess.run([str(BIN), "bench", str(path), "--server", url, "--methods", "plain"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--methods does not apply to --server" in out.stderr


def test_cold_server_runs_every_call_in_a_fresh_process_warmed_up_first():
    from lookahead.cli.bench.llama_server import ColdServer

    events = []

    class FakeServer:  # records what the bench does to each process it starts
        def __init__(self):
            self.name = f"server{sum(e[0] == 'start' for e in events)}"
            events.append(("start", self.name))

        def wait_ready(self):
            events.append(("ready", self.name))

        def run(self, method, workload, temperature, seed):
            events.append(("run", self.name, workload["id"]))
            return Run(workload["id"], "edit", temperature, -1, method, 1.0, "x")

        def close(self):
            events.append(("close", self.name))

    cold = ColdServer(FakeServer)
    cold.close()  # nothing started yet: nothing to close
    runs = [cold.run("server-ngram-mod", {"id": w}, 0.0, 1) for w in ("e1", "e1")]
    cold.close()
    cold.close()
    assert [r.workload for r in runs] == ["e1", "e1"]
    assert events == [
        ("start", "server0"), ("ready", "server0"), ("run", "server0", "warm-up"), ("run", "server0", "e1"),
        ("close", "server0"),
        ("start", "server1"), ("ready", "server1"), ("run", "server1", "warm-up"), ("run", "server1", "e1"),
        ("close", "server1"),
    ]


def test_llama_server_decode_time_counts_the_decodes_a_local_stream_shows():
    """llama-server's `predicted_ms` runs from its first sampled token to its last, an
    end-of-generation token included, and `predicted_n` counts that token too. A local method's
    decode time is the same stretch after its first piece, over its text's tokens less one."""
    from lookahead.cli.bench.llama_server import LlamaServer

    class FakeLlamaServer(LlamaServer):
        def __init__(self):
            self.posts = []

        def post(self, route, body):
            self.posts.append(route)
            if route == "/tokenize":
                assert body == {"content": "a b c", "add_special": False, "parse_special": False}
                return {"tokens": [64, 293, 272]}
            # three decodes after the first token: " b", " c" and the end-of-generation token
            return {"choices": [{"message": {"content": "a b c"}, "finish_reason": "stop"}],
                    "timings": {"predicted_n": 4, "predicted_ms": 90.0}}

    server = FakeLlamaServer()
    run = server.run("server-plain", {"id": "r1", "category": "rag", "messages": [], "max_tokens": 64}, 0.0, 1)
    assert server.posts == ["/v1/chat/completions", "/tokenize"]
    assert run.output_tokens == 3 and run.generated_tokens == 4
    assert run.ttft_s == pytest.approx(run.seconds - 0.090)
    assert run.decode_cost == pytest.approx(0.045)


def test_llama_server_counts_a_reasoning_models_thoughts_as_decoded_tokens():
    from lookahead.cli.bench.llama_server import LlamaServer

    class FakeLlamaServer(LlamaServer):
        def __init__(self):
            pass

        def post(self, route, body):
            if route == "/tokenize":
                return {"tokens": list(range(len(body["content"].split())))}
            return {"choices": [{"message": {"content": "c d", "reasoning_content": "a b "}}],
                    "timings": {"predicted_n": 5, "predicted_ms": 120.0}}

    run = FakeLlamaServer().run("server-plain", {"id": "r", "category": "rag", "messages": [], "max_tokens": 8},
                                0.0, 1)
    assert run.text == "c d" and run.output_tokens == 4
    assert run.decode_cost == pytest.approx(0.040)


def test_llama_server_loads_the_weights_as_the_local_methods_do(monkeypatch, tmp_path):
    """Read weights (--load-mode none) beside a Llama with use_mmap=False, llama.cpp's default
    (a mapped file) beside one that maps them."""
    import subprocess

    from lookahead.cli.bench import llama_server

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda args, **kw: started.append(args))
    for mmap in (False, True):
        llama_server.LlamaServer(tmp_path / "llama-server", tmp_path / "m.gguf", 512, 2, 0, mmap=mmap)
    assert started[0][-2:] == ["--load-mode", "none"] and "--load-mode" not in started[1]
