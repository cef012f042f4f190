"""Other quantizations of the same model: made once, then compared on speed, curve and quality.

Verify cost depends on the weight format: llama.cpp repacks some formats (Q4_0, Q4_K, Q8_0 on
x86) into kernels that batch far more cheaply than others (Q4_1), and speculation lives on
cheap batches. `--quant FMT` re-quantizes the model (llama.cpp's quantizer; the file goes to
lookahead's cache) and runs the same workloads on it. Quality is judged two ways, both
against the model as given: perplexity on the workloads' own texts (the prompts' contents),
and how many greedy plain outputs are identical to the given model's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from lookahead import cache

QUANT_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")
PERPLEXITY_TOKENS = 4096  # of the workloads' texts, scored in 512-token windows


def quantized_model(source: Path, fmt: str, log: Callable[[str], None]) -> Path:
    """`source` re-quantized to `fmt`, made once and kept in lookahead's cache folder."""
    from lookahead.adapters.tools import quantize_model

    folder = cache.cache_dir() / "models"
    folder.mkdir(parents=True, exist_ok=True)
    st = source.stat()
    path = folder / f"{source.stem}.{st.st_size:x}{int(st.st_mtime):x}.requant-{fmt}.gguf"
    if not path.exists():
        log(f"quantizing {source.name} to {fmt} -> {path}")
        quantize_model(source, path, fmt)
    return path


def workload_text(workloads: Sequence[dict]) -> str:
    """The workloads' own text (prompts and message contents), for perplexity."""
    parts = []
    for w in workloads:
        if "prompt" in w:
            parts.append(w["prompt"])
        else:
            parts.extend(m["content"] for m in w["messages"])
    return "\n\n".join(parts)


def compare_formats(results: Sequence[Any], llama: dict[str, Any], workloads: Sequence[dict],
                    log: Callable[[str], None]) -> list[dict]:
    """One row per model: file size, verify-cost curve, perplexity, identical outputs, speedups."""
    from lookahead.adapters.tools import file_perplexity

    text = workload_text(workloads)
    first_plain = _plain_texts(results[0].runs)
    rows = []
    for result in results:
        log(f"perplexity of {result.path.name} on the workloads' texts")
        ppl, n_tokens, desc = file_perplexity(result.path, text, PERPLEXITY_TOKENS,
                                              **{**llama, "n_ctx": max(llama["n_ctx"], 512)})
        plain = _plain_texts(result.runs)
        same = sum(1 for key, value in plain.items() if first_plain.get(key) == value)
        overall = {s["temperature"]: s["speedup"] for s in result.summaries if s["category"] == "all"}
        rows.append({
            "model": str(result.path), "desc": desc, "file_mb": round(result.path.stat().st_size / 2**20, 1),
            "verify_cost_ms": result.config["verify_cost_ms"], "perplexity": round(ppl, 3),
            "perplexity_tokens": n_tokens, "identical_plain_outputs": {"identical": same, "of": len(plain)},
            "speedup_all": {str(t): v for t, v in overall.items()},
        })
    return rows


def _plain_texts(runs) -> dict[tuple[str, int], str]:
    """Greedy plain outputs by (workload, repetition): what another format must reproduce."""
    return {(r.workload, r.rep): r.text for r in runs if r.method == "plain" and r.temperature == 0}


def format_formats(rows: Sequence[dict]) -> str:
    """The side-by-side table of formats."""
    methods = sorted({m for r in rows for s in r["speedup_all"].values() for m in s})
    temps = sorted({t for r in rows for t in r["speedup_all"]}, key=float)
    head = ["model", "MB", "t(1)", "t(8)", "t(64)", "ppl", "same as first", *[f"{m} t={t}" for t in temps for m in methods]]
    lines = []
    for r in rows:
        curve = r["verify_cost_ms"] or {}
        same = r["identical_plain_outputs"]
        lines.append([r["desc"], f"{r['file_mb']:.0f}",
                      *[f"{curve[n]:.1f}" if n in curve else "-" for n in ("1", "8", "64")],
                      f"{r['perplexity']:.2f}", f"{same['identical']}/{same['of']}",
                      *[_num(r["speedup_all"].get(t, {}).get(m)) for t in temps for m in methods]])
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join(["formats (t(n): ms of one decode of n tokens; ppl: perplexity on the workloads' texts; "
                      "same as first: greedy plain outputs identical to the first model's)",
                      fmt(head), fmt(["-" * w for w in widths]), *(fmt(c) for c in lines)])


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}×"
