"""`lookahead bench`: time lookahead against plain decoding and other prompt-lookup methods.

One process, one model, every method on the same workloads, interleaved: for each workload,
temperature and repetition, each method runs once, and the order of the methods rotates
from one repetition to the next, so drift in the machine's speed (heat, the other processes)
falls on all of them alike. Before every timed call the Llama's KV cache is cleared, so each
method pays its whole prompt prefill: no method profits from a prefix another one left.

Methods:
* plain          the Llama's own create_chat_completion / create_completion;
* lookahead      `lookahead.wrap(llm)` with the same call;
* no-draft       `lookahead.wrap(llm, max_draft=0)`: the same engine and decode threads, never
                 drafting, so the table shows how much of lookahead's speedup is speculation
                 (the rest is the one-token decode thread count it measures; see
                 `lookahead.adapters.llama_cpp`);
* prompt-lookup  llama-cpp-python's built-in LlamaPromptLookupDecoding (a second Llama built
                 with `draft_model=`; same model file, n_ctx and threads);
* server-*       with --llama-server PATH: llama.cpp's server, plain and with its n-gram
                 speculation (see `LlamaServer`). Run here with a llama-server built from the
                 llama.cpp vendored in llama-cpp-python 0.3.36's sdist (no CI test: no binary).

All local calls stream: the time between consecutive non-empty chunks gives the
inter-token latencies for the plot (speculation makes that histogram bimodal).

The pure computations (alpha fit, predicted speedup, geometric mean, summaries) are small
functions at the top of this module; tests/test_bench.py checks them by hand.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import click

PLAIN = "plain"
LOOKAHEAD = "lookahead"
NO_DRAFT = "no-draft"
PROMPT_LOOKUP = "prompt-lookup"
LOCAL_METHODS = (PLAIN, LOOKAHEAD, NO_DRAFT, PROMPT_LOOKUP)
DEFAULT_METHODS = (PLAIN, LOOKAHEAD, PROMPT_LOOKUP)
SERVER_PLAIN = "server-plain"
SERVER_SPEC_TYPES = ("ngram-simple", "ngram-mod")  # llama-server --spec-type values
SERVER_METHODS = (SERVER_PLAIN, *(f"server-{s}" for s in SERVER_SPEC_TYPES))
PREFIX_CACHE_POLICY = "cleared before every timed call: every method pays its whole prompt prefill"
WARMUP_TOKENS = 4
EXIT_INTERRUPTED = 130


def baseline_of(method: str) -> str:
    """The method a method's speedup is measured against: the server's n-gram modes against the
    plain server (as llama.cpp's own speculation gains), everything else, server-plain included,
    against plain llama-cpp-python."""
    return SERVER_PLAIN if method.startswith("server-") and method != SERVER_PLAIN else PLAIN


SERVER_PLAIN_BASIS = ("server-plain: decode time per output token against plain's (the server applies the chat "
                      "template its own way, so outputs and end-to-end times are not comparable)")


# ---- pure computations -------------------------------------------------------------------
def geometric_mean(values: Iterable[float | None]) -> float | None:
    """exp(mean(log x)) over the positive values given (None skipped); None when there are none."""
    logs = [math.log(v) for v in values if v is not None and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def fit_alpha(drafts: Sequence[tuple[int, int]]) -> float | None:
    """Per-token acceptance probability alpha, maximum likelihood under the i.i.d. model.

    `drafts` holds (drafted, accepted) per verified draft. Each accepted token is a success;
    a draft with accepted < drafted also had one failure (its first rejected token); tokens
    after it were never tested. So alpha = accepted / (accepted + drafts with a rejection).
    """
    accepted = sum(a for _, a in drafts)
    rejections = sum(1 for d, a in drafts if a < d)
    return accepted / (accepted + rejections) if accepted + rejections else None


def mean_draft_length(drafts: Sequence[tuple[int, int]]) -> float | None:
    """k: tokens drafted per draft that was verified."""
    return sum(d for d, _ in drafts) / len(drafts) if drafts else None


def relative_verify_cost(cost_curve_ms: Sequence[float], k: float) -> float:
    """c = (t(k+1) - t(1)) / (k t(1)): the cost of each extra verified token, in single decodes.

    `cost_curve_ms[n]` is t(n), the time of one decode of n tokens; k may be fractional
    (linear interpolation). c = 1: verifying is no cheaper than decoding one by one; c = 0: free.
    """
    if k <= 0:
        return 0.0
    t1 = float(cost_curve_ms[1])
    x = k + 1
    lo = min(int(math.floor(x)), len(cost_curve_ms) - 1)
    hi = min(lo + 1, len(cost_curve_ms) - 1)
    t_x = float(cost_curve_ms[lo]) + (x - lo) * (float(cost_curve_ms[hi]) - float(cost_curve_ms[lo]))
    return (t_x - t1) / (k * t1)


def predicted_speedup(alpha: float, k: float, c: float) -> float:
    """(1 - alpha^(k+1)) / ((1 - alpha)(1 + k c)): the decode speedup of drafting k tokens per step.

    Expected tokens per pass, 1 + alpha + ... + alpha^k, over the pass's cost in single decodes,
    1 + k c. It assumes every step drafts k tokens and ignores the prefill, which every method pays.
    """
    if k <= 0:
        return 1.0
    expected_tokens = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected_tokens / (1 + k * c)


def resolve_prompt_lookup_calls(calls: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(drafted, accepted) per draft of llama-cpp-python's generate loop, from its draft-model calls.

    `calls` holds (context length, draft length) per call of the draft model. After a call
    with context L and draft d, the Llama decodes [last token] + draft, keeps the a accepted
    draft tokens and samples one more token, so the next call sees context L + a + 1. The
    last draft's outcome is unknown (no later call) and is left out; so are empty drafts.
    """
    drafts = []
    for (length, drafted), (next_length, _) in zip(calls, calls[1:]):
        if drafted:
            drafts.append((drafted, max(0, min(drafted, next_length - length - 1))))
    return drafts


def workload_seed(workload_id: str, rep: int) -> int:
    """The sampling seed of one workload and repetition: the same for every method."""
    return zlib.crc32(f"{workload_id}/{rep}".encode()) & 0x7FFFFFFF


def rotated(methods: Sequence[str], shift: int) -> list[str]:
    """The methods in the order to run them: rotated by `shift` places."""
    if not methods:
        return []
    s = shift % len(methods)
    return list(methods[s:]) + list(methods[:s])


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


@dataclass
class Run:
    """One timed call of one method on one workload."""

    workload: str
    category: str
    temperature: float
    rep: int
    method: str
    seconds: float
    text: str = ""
    ttft_s: float | None = None  # time to the first non-empty chunk (prefill + first token)
    gaps_ms: list[float] = field(default_factory=list)  # between consecutive non-empty chunks
    drafts: list[tuple[int, int]] | None = None  # (drafted, accepted) per verified draft; None: unknown
    generated_tokens: int | None = None
    target_passes: int | None = None
    reused_prompt_tokens: int | None = None  # lookahead only: should be 0 (prefix cache cleared)
    output_tokens: int | None = None  # tokens of the text, counted with the model's tokenizer

    @property
    def decode_cost(self) -> float | None:
        """Decode seconds per output token after the first (prefill excluded), if known."""
        if self.output_tokens and self.output_tokens > 1 and self.ttft_s is not None:
            return (self.seconds - self.ttft_s) / (self.output_tokens - 1)
        return None

    @property
    def cost(self) -> float:
        """What speedups compare: seconds, or at temperature > 0 decode seconds per output
        token after the first (prefill excluded), since sampled outputs of different methods
        differ in length and a short one would be all prefill."""
        if self.temperature > 0 and self.decode_cost is not None:
            return self.decode_cost
        return self.seconds


def speculation_summary(drafts: Sequence[tuple[int, int]] | None, generated_tokens: int | None = None,
                        target_passes: int | None = None, cost_curve_ms: Sequence[float] | None = None) -> dict | None:
    """Acceptance figures of a set of drafts; with a cost curve, also c and the predicted speedup."""
    if drafts is None:
        return None
    drafted = sum(d for d, _ in drafts)
    accepted = sum(a for _, a in drafts)
    histogram: dict[str, int] = {}
    for _, a in sorted(drafts, key=lambda da: da[1]):
        histogram[str(a)] = histogram.get(str(a), 0) + 1
    alpha = fit_alpha(drafts)
    k = mean_draft_length(drafts)
    out: dict[str, Any] = {
        "drafted": drafted,
        "accepted": accepted,
        "draft_passes": len(drafts),
        "rejected_drafts": sum(1 for d, a in drafts if a < d),
        "acceptance_rate": _round(accepted / drafted) if drafted else None,
        "generated_tokens": generated_tokens,
        "target_passes": target_passes,
        "tokens_per_pass": _round(generated_tokens / target_passes) if generated_tokens and target_passes else None,
        "alpha": _round(alpha),
        "k": _round(k, 3),
        "accept_histogram": histogram,
    }
    if cost_curve_ms is not None:
        c = relative_verify_cost(cost_curve_ms, k) if k else None
        out["c"] = _round(c)
        out["predicted_speedup"] = _round(predicted_speedup(alpha, k, c)) if alpha is not None and k else None
    return out


def _sum_optional(values: Iterable[int | None]) -> int | None:
    values = list(values)
    return None if not values or any(v is None for v in values) else sum(values)


def _pooled_drafts(runs: Iterable[Run]) -> list[tuple[int, int]] | None:
    runs = list(runs)
    if not runs or any(r.drafts is None for r in runs):
        return None
    return [d for r in runs for d in r.drafts]


def summarise_workload(runs: Sequence[Run], cost_curve_ms: Sequence[float] | None = None) -> dict:
    """One row: one workload at one temperature, all its methods and repetitions.

    Per method: the seconds of each repetition, their median, the speedup over the method's
    baseline (plain median / method median; per output token above temperature 0), at temperature 0 whether every repetition's text
    equals the baseline's, and for drafting methods the pooled speculation figures.
    """
    first = runs[0]
    by_method: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: r.rep):
        by_method.setdefault(r.method, []).append(r)
    medians = {m: statistics.median(r.seconds for r in rs) for m, rs in by_method.items()}
    costs = {m: statistics.median(r.cost for r in rs) for m, rs in by_method.items()}
    if SERVER_PLAIN in by_method and PLAIN in by_method:
        # Another engine: llama-server applies the chat template its own way, so its outputs
        # differ from llama-cpp-python's and end-to-end times are not comparable. Compare
        # decode time per output token instead, at every temperature.
        decode = {m: [r.decode_cost for r in by_method[m]] for m in (PLAIN, SERVER_PLAIN)}
        if all(v is not None for values in decode.values() for v in values):
            server_speedup = statistics.median(decode[PLAIN]) / statistics.median(decode[SERVER_PLAIN])
        else:
            server_speedup = None
    methods = {}
    for m, rs in by_method.items():
        base = baseline_of(m)
        speedup = costs[base] / costs[m] if base in costs and costs[m] > 0 else None
        if m == SERVER_PLAIN:
            speedup = server_speedup if PLAIN in by_method else None
        identical = None
        if first.temperature == 0 and base in by_method and m != base:
            base_text = {r.rep: r.text for r in by_method[base]}
            identical = all(base_text.get(r.rep) == r.text for r in rs)
        methods[m] = {
            "seconds": [_round(r.seconds) for r in rs],
            "median_s": _round(medians[m]),
            "speedup": _round(speedup),
            "identical": identical,
            "ttft_s": _round(statistics.median(r.ttft_s for r in rs)) if all(r.ttft_s is not None for r in rs) else None,
            "speculation": speculation_summary(
                _pooled_drafts(rs), _sum_optional(r.generated_tokens for r in rs),
                _sum_optional(r.target_passes for r in rs), cost_curve_ms if m == LOOKAHEAD else None),
        }
    return {"id": first.workload, "category": first.category, "temperature": first.temperature, "methods": methods}


def summarise_group(rows: Sequence[dict], category: str, runs: Sequence[Run] = (),
                    cost_curve_ms: Sequence[float] | None = None) -> dict:
    """One category (or "all") at one temperature: geometric-mean speedups, pooled acceptance, fit.

    `rows` are summarise_workload rows of the group; `runs` the group's runs (for the pooled
    speculation figures, which need every draft, not the per-workload summaries).
    """
    methods = sorted({m for row in rows for m in row["methods"]}, key=_method_order)
    speedup = {m: _round(geometric_mean(row["methods"][m]["speedup"] for row in rows if m in row["methods"]))
               for m in methods if m != baseline_of(m)}
    identical = {}
    for m in methods:
        flags = [row["methods"][m]["identical"] for row in rows if m in row["methods"]]
        flags = [f for f in flags if f is not None]
        if flags:
            identical[m] = {"identical": sum(flags), "of": len(flags)}
    speculation = {}
    for m in methods:
        rs = [r for r in runs if r.method == m]
        summary = speculation_summary(_pooled_drafts(rs), _sum_optional(r.generated_tokens for r in rs),
                                      _sum_optional(r.target_passes for r in rs),
                                      cost_curve_ms if m == LOOKAHEAD else None) if rs else None
        if summary is not None:
            summary.pop("accept_histogram")
            speculation[m] = summary
    return {"category": category, "temperature": rows[0]["temperature"] if rows else None, "n": len(rows),
            "speedup": speedup, "identical": identical, "speculation": speculation}


def _method_order(method: str) -> int:
    order = (*LOCAL_METHODS, *SERVER_METHODS)
    return order.index(method) if method in order else len(order)


def summarise(runs: Sequence[Run], cost_curve_ms: Sequence[float] | None = None) -> tuple[list[dict], list[dict]]:
    """(per-workload rows, per-category summaries) from all runs.

    Summaries: for each temperature, one per category in order of first appearance, then "all".
    """
    keys: dict[tuple[str, float], list[Run]] = {}
    for r in runs:
        keys.setdefault((r.workload, r.temperature), []).append(r)
    rows = [summarise_workload(rs, cost_curve_ms) for rs in keys.values()]
    summaries = []
    for t in dict.fromkeys(r["temperature"] for r in rows):
        t_rows = [row for row in rows if row["temperature"] == t]
        for category in dict.fromkeys(row["category"] for row in t_rows):
            c_rows = [row for row in t_rows if row["category"] == category]
            c_runs = [r for r in runs if r.temperature == t and r.category == category]
            summaries.append(summarise_group(c_rows, category, c_runs, cost_curve_ms))
        summaries.append(summarise_group(t_rows, "all", [r for r in runs if r.temperature == t], cost_curve_ms))
    return rows, summaries


def format_table(summaries: Sequence[dict]) -> str:
    """The readable table: one line per category per temperature."""
    methods = sorted({m for s in summaries for m in s["speedup"]}, key=_method_order)
    pl = any(PROMPT_LOOKUP in s["speculation"] for s in summaries)
    head = ["category", "t", "n", *[f"{m} ×" for m in methods], "acceptance", "tokens/pass", "alpha", "k",
            "predicted ×", "identical"]
    if pl:
        head.append("prompt-lookup acc.")

    def num(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    lines = []
    for s in summaries:
        la = s["speculation"].get(LOOKAHEAD, {})
        same = s["identical"].get(LOOKAHEAD)
        cells = [s["category"], f"{s['temperature']:g}", str(s["n"]),
                 *[num(s["speedup"].get(m)) for m in methods],
                 num(la.get("acceptance_rate"), "{:.0%}"), num(la.get("tokens_per_pass")), num(la.get("alpha")),
                 num(la.get("k"), "{:.1f}"), num(la.get("predicted_speedup")),
                 f"{same['identical']}/{same['of']}" if same else "-"]
        if pl:
            cells.append(num(s["speculation"].get(PROMPT_LOOKUP, {}).get("acceptance_rate"), "{:.0%}"))
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [fmt(head), fmt(["-" * w for w in widths])]
    for i, (s, cells) in enumerate(zip(summaries, lines)):
        if s["category"] == "all":
            out.append(fmt(["-" * w for w in widths]))
        elif i and summaries[i - 1]["category"] == "all":
            out.append("")  # the next temperature
        out.append(fmt(cells))
    return "\n".join(out)


# ---- workloads ---------------------------------------------------------------------------
def load_workloads(path: Path, categories: Sequence[str] = (), limit: int | None = None,
                   max_tokens_cap: int | None = None) -> list[dict]:
    """Read a JSONL file of workloads: id, category, messages (or prompt), max_tokens.

    Keeps the given categories (all when none), the first `limit` of each, and caps max_tokens.
    Raises click.BadParameter naming the line and the field that is wrong.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {str(path)!r}: {e}", param_hint="WORKLOADS") from None
    workloads, seen = [], set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            w = json.loads(line)
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"{where}: not JSON ({e.msg})", param_hint="WORKLOADS") from None
        problem = _workload_problem(w)
        if problem:
            raise click.BadParameter(f"{where}: {problem}", param_hint="WORKLOADS")
        if w["id"] in seen:
            raise click.BadParameter(f"{where}: id {w['id']!r} appears twice", param_hint="WORKLOADS")
        seen.add(w["id"])
        workloads.append(w)
    present = list(dict.fromkeys(w["category"] for w in workloads))
    unknown = [c for c in categories if c not in present]
    if unknown:
        raise click.BadParameter(f"no workload has category {unknown[0]!r}; the file has: {', '.join(present)}",
                                 param_hint="--category")
    chosen, per_category = [], {}
    for w in workloads:
        if categories and w["category"] not in categories:
            continue
        per_category[w["category"]] = per_category.get(w["category"], 0) + 1
        if limit is not None and per_category[w["category"]] > limit:
            continue
        if max_tokens_cap is not None:
            w = {**w, "max_tokens": min(w["max_tokens"], max_tokens_cap)}
        chosen.append(w)
    if not chosen:
        raise click.BadParameter(f"{str(path)!r} holds no workloads", param_hint="WORKLOADS")
    return chosen


def _workload_problem(w: Any) -> str | None:
    if not isinstance(w, dict):
        return f"expected a JSON object, got {type(w).__name__}"
    for key in ("id", "category"):
        if not isinstance(w.get(key), str) or not w[key]:
            return f"{key!r} must be a non-empty string, got {w.get(key)!r}"
    if not isinstance(w.get("max_tokens"), int) or isinstance(w["max_tokens"], bool) or w["max_tokens"] < 1:
        return f"'max_tokens' must be an integer >= 1, got {w.get('max_tokens')!r}"
    has_messages, has_prompt = "messages" in w, "prompt" in w
    if has_messages == has_prompt:
        return "give exactly one of 'messages' (a chat) or 'prompt' (a string)"
    if has_prompt and not isinstance(w["prompt"], str):
        return f"'prompt' must be a string, got {type(w['prompt']).__name__}"
    if has_messages:
        msgs = w["messages"]
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs):
            return "'messages' must be a non-empty list of {'role': str, 'content': str}"
    return None


# ---- local methods -----------------------------------------------------------------------
class DraftRecorder:
    """Engine observer for the lookahead wrapper: (drafted, accepted) of every verified draft."""

    def __init__(self):
        self.drafts: list[tuple[int, int]] = []

    def __call__(self, rows, draft, verdict) -> None:
        if len(draft):
            self.drafts.append((len(draft), int(verdict.accepted)))


def counting_prompt_lookup(num_pred_tokens: int):
    """llama-cpp-python's LlamaPromptLookupDecoding, noting (context length, draft length) per call."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountingPromptLookup(LlamaPromptLookupDecoding):
        def __init__(self):
            super().__init__(num_pred_tokens=num_pred_tokens)
            self.calls: list[tuple[int, int]] = []

        def __call__(self, input_ids, /, **kwargs):
            draft = super().__call__(input_ids, **kwargs)
            self.calls.append((len(input_ids), len(draft)))
            return draft

    return CountingPromptLookup()


def clear_prefix_cache(llm) -> None:
    """Forget the KV cache, so the next call prefills its whole prompt."""
    llm.reset()
    llm._ctx.kv_cache_clear()


def _piece(chunk: dict) -> str:
    choice = chunk["choices"][0]
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


def timed_stream(start: Callable[[], Iterator[dict]]) -> tuple[str, float, float | None, list[float], dict | None]:
    """Run a streaming call: (text, seconds, time to first piece, gaps between pieces in ms, last chunk)."""
    pieces, stamps = [], []
    last = None
    t0 = time.perf_counter()
    for chunk in start():
        piece = _piece(chunk)
        if piece:
            stamps.append(time.perf_counter())
            pieces.append(piece)
        last = chunk
    seconds = time.perf_counter() - t0
    gaps_ms = [1000 * (b - a) for a, b in zip(stamps, stamps[1:])]
    return "".join(pieces), seconds, (stamps[0] - t0 if stamps else None), gaps_ms, last


def request_kwargs(workload: dict, temperature: float, seed: int) -> dict:
    return dict(max_tokens=workload["max_tokens"], temperature=temperature, seed=seed, stream=True)


def call_engine(engine, workload: dict, **kwargs) -> Iterator[dict]:
    """engine.create_chat_completion(messages) or engine.create_completion(prompt)."""
    if "messages" in workload:
        return engine.create_chat_completion(workload["messages"], **kwargs)
    return engine.create_completion(workload["prompt"], **kwargs)


class LocalMethods:
    """plain, lookahead and prompt-lookup on one model file, ready to run a workload."""

    def __init__(self, model_path: Path, n_ctx: int, threads: int | None, gpu_layers: int,
                 methods: Sequence[str], pld_tokens: int):
        import llama_cpp

        import lookahead

        settings = dict(model_path=str(model_path), n_ctx=n_ctx, n_gpu_layers=gpu_layers, verbose=False)
        if threads is not None:  # else llama-cpp-python's defaults, as most callers leave them
            settings.update(n_threads=threads, n_threads_batch=threads)
        self.llm = llama_cpp.Llama(**settings)
        self.fast = lookahead.wrap(self.llm) if LOOKAHEAD in methods else None
        self.no_draft = lookahead.wrap(self.llm, max_draft=0) if NO_DRAFT in methods else None
        self.recorder = DraftRecorder()
        if self.fast is not None:
            self.fast.observer = self.recorder
        self.pld = None
        if PROMPT_LOOKUP in methods:
            self.pld_drafter = counting_prompt_lookup(pld_tokens)
            # logits_all=True: with a draft model llama-cpp-python computes every row's logits
            # anyway, but sizes its score buffer from the argument (0.3.36: n_batch rows unless
            # logits_all=True), which breaks once a prompt is longer than n_batch.
            self.pld = llama_cpp.Llama(**settings, draft_model=self.pld_drafter, logits_all=True)

    def decode_threads(self) -> int | None:
        """The one-token decode threads lookahead chose for this Llama (None if it never ran)."""
        from lookahead.adapters.llama_cpp import tuned_threads

        return tuned_threads(self.llm)

    def cost_curve_ms(self):
        return self.fast.cost.curve() if self.fast is not None else None

    def run(self, method: str, workload: dict, temperature: float, seed: int) -> Run:
        kwargs = request_kwargs(workload, temperature, seed)
        if method == PLAIN:
            llm, engine = self.llm, self.llm
        elif method == LOOKAHEAD:
            llm, engine = self.llm, self.fast
            self.recorder.drafts = []
        elif method == NO_DRAFT:
            llm, engine = self.llm, self.no_draft
        elif method == PROMPT_LOOKUP:
            llm, engine = self.pld, self.pld
            self.pld_drafter.calls = []
        else:
            raise AssertionError(f"not a local method: {method}")
        clear_prefix_cache(llm)
        text, seconds, ttft, gaps, last = timed_stream(lambda: call_engine(engine, workload, **kwargs))
        run = Run(workload["id"], workload["category"], temperature, -1, method, seconds, text, ttft, gaps)
        run.output_tokens = len(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)) if text else 0
        if method == LOOKAHEAD:
            stats = (last or {}).get("speculation") or {}
            run.drafts = list(self.recorder.drafts)
            run.generated_tokens = stats.get("generated_tokens")
            run.target_passes = stats.get("target_passes")
            run.reused_prompt_tokens = stats.get("reused_prompt_tokens")
        elif method == PROMPT_LOOKUP:
            calls = self.pld_drafter.calls
            run.drafts = resolve_prompt_lookup_calls(calls)
            run.target_passes = 1 + len(calls)  # the prompt's last chunk, then one decode per draft call
        return run


# ---- llama-server ----------------------------------------------------------------------------------
class LlamaServer:
    """One llama-server process on 127.0.0.1, plain or with one --spec-type.

    Uses llama.cpp's server API (/health, /completion, /v1/chat/completions, `cache_prompt`,
    `--spec-type`); run by hand against a llama-server built from the llama.cpp vendored in
    llama-cpp-python 0.3.36 (CI has no binary, so no test runs this class). Prompt caching is switched off per request (`cache_prompt: false`), so every call pays its
    prefill, as the local methods do. Requests do not stream: no latencies for the plot.
    """

    def __init__(self, binary: Path, model_path: Path, n_ctx: int, threads: int, gpu_layers: int,
                 spec_type: str | None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.spec_type = spec_type
        args = [str(binary), "-m", str(model_path), "--host", "127.0.0.1", "--port", str(self.port),
                "-c", str(n_ctx), "-t", str(threads), "-ngl", str(gpu_layers)]
        if spec_type:
            args += ["--spec-type", spec_type]
        self.args = args
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (self.process.stderr.read() or "")[-800:]
                raise click.ClickException(f"llama-server exited with {self.process.returncode}: "
                                           f"{' '.join(self.args)}\n{err}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise click.ClickException(f"llama-server not ready after {timeout_s:.0f} s: {' '.join(self.args)}")

    def post(self, route: str, body: dict) -> dict:
        request = urllib.request.Request(self.url + route, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=3600) as r:
            return json.loads(r.read())

    def run(self, method: str, workload: dict, temperature: float, seed: int) -> Run:
        common = {"temperature": temperature, "seed": seed, "cache_prompt": False}
        t0 = time.perf_counter()
        if "messages" in workload:
            out = self.post("/v1/chat/completions",
                            {"messages": workload["messages"], "max_tokens": workload["max_tokens"], **common})
            text = out["choices"][0]["message"].get("content") or ""
        else:
            out = self.post("/completion", {"prompt": workload["prompt"], "n_predict": workload["max_tokens"], **common})
            text = out.get("content", "")
        seconds = time.perf_counter() - t0
        timings = out.get("timings") or {}
        run = Run(workload["id"], workload["category"], temperature, -1, method, seconds, text)
        run.generated_tokens = timings.get("predicted_n")
        n, decode_ms = timings.get("predicted_n"), timings.get("predicted_ms")
        if n and n > 1 and decode_ms:  # no stream: the server's own decode time stands in for ttft
            run.output_tokens = n
            run.ttft_s = seconds - decode_ms / 1000 * (n - 1) / n
        return run

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ---- plot --------------------------------------------------------------------------------
def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "--plot needs matplotlib, which is not installed: run `pip install 'lookahead[bench]'` "
            "(in a checkout: .venv/bin/pip install -e '.[bench]', or bash scripts/setup.sh)"
        ) from None


def plot(path: Path, summaries: Sequence[dict], runs: Sequence[Run]) -> None:
    """(a) speedup per category and method, (b) acceptance per category, (c) inter-token latencies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    categories = list(dict.fromkeys(s["category"] for s in summaries))
    temps = list(dict.fromkeys(s["temperature"] for s in summaries))
    by_key = {(s["category"], s["temperature"]): s for s in summaries}
    x = np.arange(len(categories))
    fig, (ax_speed, ax_acc, ax_lat) = plt.subplots(1, 3, figsize=(17, 5))

    def bars(ax, series: list[tuple[str, list[float]]]):
        width = 0.8 / max(len(series), 1)
        for i, (label, values) in enumerate(series):
            ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
        ax.set_xticks(x, categories, rotation=30, ha="right")
        ax.legend(fontsize=8)

    methods = sorted({m for s in summaries for m in s["speedup"]}, key=_method_order)
    bars(ax_speed, [(f"{m} t={t:g}", [by_key[c, t]["speedup"].get(m) or 0 for c in categories])
                    for m in methods for t in temps])
    ax_speed.axhline(1.0, color="black", linewidth=1)
    ax_speed.set_ylabel("speedup over plain (geometric mean)")
    ax_speed.set_title("(a) speedup per category")

    drafting = sorted({m for s in summaries for m in s["speculation"]}, key=_method_order)
    bars(ax_acc, [(f"{m} t={t:g}", [by_key[c, t]["speculation"].get(m, {}).get("acceptance_rate") or 0
                                     for c in categories]) for m in drafting for t in temps])
    ax_acc.set_ylim(0, 1)
    ax_acc.set_ylabel("accepted / drafted")
    ax_acc.set_title("(b) draft acceptance per category")

    gaps = {m: [g for r in runs if r.method == m for g in r.gaps_ms if g > 0] for m in (PLAIN, LOOKAHEAD)}
    all_gaps = [g for gs in gaps.values() for g in gs]
    if all_gaps:
        edges = np.logspace(math.log10(min(all_gaps)), math.log10(max(all_gaps) * 1.01), 60)
        for m, gs in gaps.items():
            if gs:
                ax_lat.hist(gs, bins=edges, histtype="step", linewidth=1.5, label=f"{m} ({len(gs)} gaps)")
        ax_lat.set_xscale("log")
        ax_lat.legend(fontsize=8)
    ax_lat.set_xlabel("time between streamed chunks (ms, log scale)")
    ax_lat.set_ylabel("count")
    ax_lat.set_title("(c) inter-token latency")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- the command -------------------------------------------------------------------------
@click.command()
@click.argument("workloads_file", metavar="WORKLOADS.jsonl", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--temperature", "-t", "temperatures", type=click.FloatRange(min=0.0), multiple=True, default=(0.0,),
              show_default=True, help="Sampling temperature; repeat for several (each is a separate run).")
@click.option("--reps", type=click.IntRange(min=1), default=3, show_default=True,
              help="Repetitions per workload, method and temperature (the median is kept).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N workloads of each category.")
@click.option("--category", "categories", multiple=True, help="Only this category (repeatable).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Cap every workload's max_tokens at this (for quick runs).")
@click.option("--methods", type=click.Choice(LOCAL_METHODS), multiple=True, default=DEFAULT_METHODS,
              show_default=True, help="Methods to run (repeatable).")
@click.option("--pld-tokens", type=click.IntRange(min=1), default=10, show_default=True,
              help="Draft length of llama-cpp-python's LlamaPromptLookupDecoding (num_pred_tokens).")
@click.option("--llama-server", "llama_server", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="llama.cpp's llama-server binary: also time it plain and with "
                                 f"--spec-type {' / '.join(SERVER_SPEC_TYPES)}.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with everything instead of the table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG: speedups, acceptance, inter-token latency histograms (needs matplotlib).")
@click.option("--model", "model_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="GGUF model file. Default: the embedded SmolLM2-135M-Instruct Q4_1.")
@click.option("--n-ctx", type=click.IntRange(min=64), default=4096, show_default=True,
              help="Context window in tokens (prompt + output).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for llama.cpp (one-token and batch decodes). Default: llama-cpp-python's "
                   "own defaults (n_threads = half the CPUs, n_threads_batch = all), as most callers leave them.")
@click.option("--gpu-layers", type=click.IntRange(min=-1), default=0, show_default=True,
              help="Layers to offload to a GPU build of llama.cpp (-1: all).")
def bench(workloads_file, temperatures, reps, limit, categories, max_tokens, methods, pld_tokens, llama_server,
          as_json, plot_path, model_path, n_ctx, threads, gpu_layers):
    """Time lookahead against plain decoding and prompt lookup on the workloads in WORKLOADS.jsonl.

    Each line: {"id", "category", "messages": [...] or "prompt": "...", "max_tokens"}.
    Methods run interleaved in one process on one model, their order rotating every
    repetition; the KV cache is cleared before every call, so each pays its prefill.
    Prints a table per category and temperature (speedups are geometric means of plain
    median / method median; alpha, k and "predicted" come from the i.i.d. acceptance model
    and the measured verify-cost curve), or everything with --json. Progress goes to stderr.

    \b
    Examples:
      lookahead bench samples/workloads.jsonl --plot bench-t0.png
      lookahead bench samples/workloads.jsonl -t 0 -t 0.7 --json > bench.json
      lookahead bench samples/workloads.jsonl --limit 1 --reps 1 --max-tokens 32
    """
    from lookahead.models import ModelError, check_gguf, default_model_path

    if plot_path is not None:
        require_matplotlib()
    temperatures = list(dict.fromkeys(temperatures))
    methods = sorted(dict.fromkeys(methods), key=_method_order)
    workloads = load_workloads(workloads_file, categories, limit, max_tokens)
    try:
        path = check_gguf(model_path) if model_path is not None else default_model_path()
    except ModelError as e:
        raise click.BadParameter(str(e), param_hint="--model") from None
    log = lambda message: click.echo(message, err=True)
    if llama_server is None:
        log("llama-server modes skipped (give --llama-server PATH to time llama.cpp's own n-gram speculation)")

    with ExitStack() as stack:
        log(f"loading {path.name} (n_ctx {n_ctx}, threads {threads or 'llama-cpp-python default'}) for: "
            f"{', '.join(methods)}")
        try:
            local = LocalMethods(path, n_ctx, threads, gpu_layers, methods, pld_tokens)
        except ValueError as e:  # llama-cpp-python: "Failed to load model from file: ..."
            raise click.ClickException(f"cannot load model {str(path)!r}: {e}") from None
        runners: dict[str, Callable[..., Run]] = {m: local.run for m in methods}
        if llama_server is not None:
            for spec_type, method in zip((None, *SERVER_SPEC_TYPES), SERVER_METHODS):
                server = LlamaServer(llama_server, path, n_ctx, threads or os.cpu_count() or 1, gpu_layers, spec_type)
                stack.callback(server.close)
                server.wait_ready()
                runners[method] = server.run
        order = list(runners)
        try:
            _warm_up(runners, workloads[0])
            runs = _run_all(runners, order, workloads, temperatures, reps, log)
        except KeyboardInterrupt:
            log("\ninterrupted")
            sys.exit(EXIT_INTERRUPTED)
        curve = local.cost_curve_ms()
        curve = None if curve is None else [float(v) for v in curve]
        llama_threads = {"n_threads": local.llm.n_threads, "n_threads_batch": local.llm.n_threads_batch,
                         "lookahead_decode_threads": local.decode_threads()}

    rows, summaries = summarise(runs, curve)
    reused = [r.reused_prompt_tokens for r in runs if r.reused_prompt_tokens]
    config = {
        "workloads_file": str(workloads_file), "model": str(path), "n_ctx": n_ctx, "threads": llama_threads,
        "gpu_layers": gpu_layers, "reps": reps, "temperatures": temperatures, "methods": order,
        "categories": list(categories), "limit": limit, "max_tokens_cap": max_tokens, "pld_tokens": pld_tokens,
        "llama_server": str(llama_server) if llama_server else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "prefix_cache": PREFIX_CACHE_POLICY,
        "speedup_basis": "median wall time at temperature 0; above 0, median decode seconds per output token "
                         "after the first, prefill excluded (sampled outputs differ in length between methods)", "warm_up": f"one untimed {WARMUP_TOKENS}-token call per method",
        "server_plain_basis": SERVER_PLAIN_BASIS if llama_server else None,
        "streamed": True, "order": "interleaved per workload, temperature and repetition; rotated every repetition",
        "verify_cost_ms": ({str(n): round(curve[n], 3) for n in (1, 2, 4, 8, 16, 32, 64) if n < len(curve)}
                           if curve else None),
        "llama_cpp_python": _version("llama-cpp-python"), "lookahead": _version("lookahead"),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
    }
    if reused:
        log(f"warning: {len(reused)} lookahead calls reused a cached prompt prefix despite the reset")
    if plot_path is not None:
        plot(plot_path, summaries, runs)
        log(f"wrote {plot_path}")
    if as_json:
        click.echo(json.dumps({"config": config, "workloads": rows, "summary": summaries}, ensure_ascii=False))
        return
    click.echo(f"{path.name}, n_ctx {n_ctx}, threads {llama_threads['n_threads']}/{llama_threads['n_threads_batch']} "
               f"(one-token/batch; lookahead's one-token: {llama_threads['lookahead_decode_threads']}), {reps} reps, {len(workloads)} workloads; "
               f"prefix cache {PREFIX_CACHE_POLICY}")
    click.echo("speedup × = geometric mean over workloads of plain median / method median"
               + (" (server-plain: over plain, per output token; the server's n-gram modes: over server-plain)"
                  if llama_server else "")
               + "; acceptance, tokens/pass, alpha, k, predicted: lookahead")
    click.echo(format_table(summaries))


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _warm_up(runners: dict[str, Callable[..., Run]], workload: dict) -> None:
    """One short untimed call per method: first-call costs (allocations, page faults) fall on no one."""
    short = {**workload, "max_tokens": WARMUP_TOKENS}
    for method, run in runners.items():
        _checked(run, method, short, 0.0, 0)


def _checked(run: Callable[..., Run], method: str, workload: dict, temperature: float, seed: int) -> Run:
    try:
        return run(method, workload, temperature, seed)
    except ValueError as e:  # e.g. a prompt longer than the context window
        raise click.ClickException(f"workload {workload['id']!r}, {method}: {e}") from None
    except (urllib.error.URLError, OSError) as e:
        raise click.ClickException(f"workload {workload['id']!r}, {method}: llama-server request failed: {e}") from None


def _run_all(runners, order, workloads, temperatures, reps, log) -> list[Run]:
    runs = []
    for w_index, workload in enumerate(workloads):
        for temperature in temperatures:
            for rep in range(reps):
                seed = workload_seed(workload["id"], rep)
                for method in rotated(order, w_index + rep):
                    run = _checked(runners[method], method, workload, temperature, seed)
                    run.rep = rep
                    runs.append(run)
                    rep_note = f" rep {rep + 1}/{reps}" if reps > 1 else ""
                    log(f"[{w_index + 1}/{len(workloads)}] {workload['id']} t={temperature:g}{rep_note} "
                        f"{method} {run.seconds:.2f} s")
    return runs
