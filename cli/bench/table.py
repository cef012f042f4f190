"""The readable table: one line per category and temperature."""
from __future__ import annotations

from typing import Sequence

from .methods import LOOKAHEAD, PROMPT_LOOKUP, method_order


def format_table(summaries: Sequence[dict]) -> str:
    """The readable table: one line per category per temperature.

    Columns: each method's speedup (end to end at t=0; decode per token above), lookahead's
    decode-only speedup (seconds per output token after the first), its worst workload, the
    share of plain's time spent before the first token, how many workloads' outputs loop
    (`measures.repeat_share`) and lookahead's speedup over the others, and its draft figures.
    """
    methods = sorted({m for s in summaries for m in s["speedup"]}, key=method_order)
    pl = any(PROMPT_LOOKUP in s["speculation"] for s in summaries)
    head = ["category", "t", "n", *[f"{m} ×" for m in methods], "decode ×", "worst ×", "prefill", "loops",
            "loop-free ×", "acceptance", "tokens/pass", "alpha", "k", "predicted ×", "identical"]
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
                 num(s.get("decode_speedup", {}).get(LOOKAHEAD)),
                 num((s.get("worst", {}).get(LOOKAHEAD) or {}).get("speedup")),
                 num(s.get("prefill_share"), "{:.0%}"),
                 f"{s['loops']['workloads']}/{s['loops']['of']}" if s.get("loops") else "-",
                 num(((s.get("loop_free") or {}).get("speedup") or {}).get(LOOKAHEAD)),
                 num(la.get("acceptance_rate"), "{:.0%}"), num(la.get("tokens_per_pass")), num(la.get("alpha")),
                 num(la.get("k"), "{:.1f}"), num(la.get("predicted_speedup")),
                 f"{same['identical']}/{same['of']}" if same else "-"]
        if pl:
            cells.append(num(s["speculation"].get(PROMPT_LOOKUP, {}).get("acceptance_rate"), "{:.0%}"))
        lines.append(cells)
    return align(head, summaries, lines)


def align(head: Sequence[str], summaries: Sequence[dict], lines: Sequence[Sequence[str]]) -> str:
    """Columns aligned under `head` (the first left, the rest right), one row per summary: a rule
    above each "all" row and a blank line before the next temperature's categories."""
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
