"""One timed call (`Run`) and the summaries of many: per workload, per category, overall."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .measures import (LOOP_SHARE, _round, fit_alpha, geometric_mean, mean_draft_length, predicted_speedup,
                       relative_verify_cost)
from .methods import LOOKAHEAD, PLAIN, SERVER_PLAIN, baseline_of, method_order


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
    contended: bool | None = None  # lookahead only: another process took the cores (fewer threads)
    repeat_share: float | None = None  # how much of the text repeats itself (measures.repeat_share)

    def to_dict(self) -> dict:
        """The run for --json: what was timed and what it wrote (outputs are worth reading)."""
        return {"workload": self.workload, "category": self.category, "temperature": self.temperature,
                "rep": self.rep, "method": self.method, "seconds": round(self.seconds, 4), "text": self.text,
                "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 4),
                "output_tokens": self.output_tokens, "drafts": self.drafts, "contended": self.contended,
                "repeat_share": None if self.repeat_share is None else round(self.repeat_share, 3)}

    @property
    def decode_cost(self) -> float | None:
        """Decode seconds per output token after the first (prefill excluded), if known."""
        if self.output_tokens and self.output_tokens > 1 and self.ttft_s is not None:
            return (self.seconds - self.ttft_s) / (self.output_tokens - 1)
        return None

    def cost_at_length(self, tokens: int | None) -> float:
        """Seconds this call would take for an output of `tokens` tokens: its time to the first
        token plus its decode seconds per token for the rest. Its own length gives its own
        time; unknown figures give `seconds` as it is."""
        if tokens is None or tokens < 1 or self.decode_cost is None or self.ttft_s is None:
            return self.seconds
        return self.ttft_s + self.decode_cost * (tokens - 1)

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
    baseline (plain median / method median; per output token above temperature 0; at
    temperature 0, for a text that is not the baseline's, at the baseline's length, see
    `Run.cost_at_length`), at temperature 0 whether every repetition's text equals the
    baseline's, and for drafting methods the pooled speculation figures.
    """
    first = runs[0]
    by_method: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: r.rep):
        by_method.setdefault(r.method, []).append(r)
    medians = {m: statistics.median(r.seconds for r in rs) for m, rs in by_method.items()}
    costs = {m: statistics.median(r.cost for r in rs) for m, rs in by_method.items()}
    # At temperature 0: whether every repetition's text equals its baseline's.
    identical: dict[str, bool] = {}
    if first.temperature == 0:
        for m, rs in by_method.items():
            base = baseline_of(m)
            if m != base and base in by_method:
                base_text = {r.rep: r.text for r in by_method[base]}
                identical[m] = all(base_text.get(r.rep) == r.text for r in rs)
    # A greedy text that left the baseline's at a near-tie may be much shorter or longer (91
    # tokens against 189 in one run): its wall time compares different work. Compare the time
    # it would take at the baseline's length instead, which is its wall time when the texts
    # are the same.
    for m, same in identical.items():
        lengths = [r.output_tokens for r in by_method[baseline_of(m)] if r.output_tokens]
        if not same and lengths:
            costs[m] = statistics.median(r.cost_at_length(int(statistics.median(lengths))) for r in by_method[m])
    if SERVER_PLAIN in by_method and PLAIN in by_method:
        # Another engine: llama-server applies the chat template its own way, so its outputs
        # differ from llama-cpp-python's and end-to-end times are not comparable. Compare
        # decode time per output token instead, at every temperature.
        decode = {m: [r.decode_cost for r in by_method[m]] for m in (PLAIN, SERVER_PLAIN)}
        if all(v is not None for values in decode.values() for v in values):
            server_speedup = statistics.median(decode[PLAIN]) / statistics.median(decode[SERVER_PLAIN])
        else:
            server_speedup = None
    decode_costs = {m: [r.decode_cost for r in rs] for m, rs in by_method.items()}
    decode_medians = {m: statistics.median(v) for m, v in decode_costs.items() if v and None not in v}
    methods = {}
    for m, rs in by_method.items():
        base = baseline_of(m)
        speedup = costs[base] / costs[m] if base in costs and costs[m] > 0 else None
        if m == SERVER_PLAIN:
            speedup = server_speedup if PLAIN in by_method else None
        methods[m] = {
            "seconds": [_round(r.seconds) for r in rs],
            "median_s": _round(medians[m]),
            "speedup": _round(speedup),
            # decode only: seconds per output token after the first, prefill excluded
            "decode_speedup": _round(decode_medians[base] / decode_medians[m])
            if base in decode_medians and m in decode_medians and decode_medians[m] > 0 else None,
            # the share of the call spent before the first token (prefill and first decode)
            "prefill_share": _round(statistics.median(r.ttft_s / r.seconds for r in rs))
            if all(r.ttft_s is not None and r.seconds > 0 for r in rs) else None,
            "identical": identical.get(m),
            "ttft_s": _round(statistics.median(r.ttft_s for r in rs)) if all(r.ttft_s is not None for r in rs) else None,
            "speculation": speculation_summary(
                _pooled_drafts(rs), _sum_optional(r.generated_tokens for r in rs),
                _sum_optional(r.target_passes for r in rs), cost_curve_ms if m == LOOKAHEAD else None),
        }
    # Whether the model's own output loops: plain's text, the target's unaided behaviour (the
    # other methods' texts are the same, or differ after a near-tie at temperature 0).
    judged = by_method.get(PLAIN) or next(iter(by_method.values()))
    shares = [r.repeat_share for r in judged if r.repeat_share is not None]
    return {"id": first.workload, "category": first.category, "temperature": first.temperature,
            "repeat_share": _round(max(shares), 3) if shares else None,
            "loops": any(s >= LOOP_SHARE for s in shares) if shares else None, "methods": methods}


def summarise_group(rows: Sequence[dict], category: str, runs: Sequence[Run] = (),
                    cost_curve_ms: Sequence[float] | None = None) -> dict:
    """One category (or "all") at one temperature: geometric-mean speedups, pooled acceptance, fit.

    `rows` are summarise_workload rows of the group; `runs` the group's runs (for the pooled
    speculation figures, which need every draft, not the per-workload summaries).
    """
    methods = sorted({m for row in rows for m in row["methods"]}, key=method_order)
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
    decode_speedup = {m: _round(geometric_mean(row["methods"][m]["decode_speedup"] for row in rows
                                               if m in row["methods"]))
                      for m in methods if m != baseline_of(m)}
    worst = {}
    for m in methods:
        if m == baseline_of(m):
            continue
        scored = [(row["methods"][m]["speedup"], row["id"]) for row in rows
                  if m in row["methods"] and row["methods"][m]["speedup"] is not None]
        if scored:
            value, workload = min(scored)
            worst[m] = {"speedup": value, "workload": workload}
    # The same speedups over the workloads whose output does not loop: a loop is cheap to draft,
    # so these are the figures that say something about real output.
    judged = [row for row in rows if row.get("loops") is not None]
    sane = [row for row in judged if not row["loops"]]
    loops = {"workloads": len(judged) - len(sane), "of": len(judged)} if judged else None
    loop_free = {"n": len(sane),
                 "speedup": {m: _round(geometric_mean(row["methods"][m]["speedup"] for row in sane
                                                      if m in row["methods"]))
                             for m in methods if m != baseline_of(m)},
                 "decode_speedup": {m: _round(geometric_mean(row["methods"][m]["decode_speedup"] for row in sane
                                                             if m in row["methods"]))
                                    for m in methods if m != baseline_of(m)}} if judged else None
    shares = [row["methods"][PLAIN]["prefill_share"] for row in rows
              if PLAIN in row["methods"] and row["methods"][PLAIN]["prefill_share"] is not None]
    return {"category": category, "temperature": rows[0]["temperature"] if rows else None, "n": len(rows),
            "decode_speedup": decode_speedup, "worst": worst,
            "prefill_share": _round(statistics.median(shares)) if shares else None,
            "speedup": speedup, "identical": identical, "speculation": speculation,
            "loops": loops, "loop_free": loop_free}


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
