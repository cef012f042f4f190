"""`lookahead bench` on rewrite items: the editing API timed with and without speculation.

A rewrite item is one JSONL line:

    {"id": "doc-tallybook-spelling", "category": "doc", "file": "docs/tallybook_readme.md",
     "instruction": "Fix the spelling mistakes", "second": "Change the default rounding to 15 minutes"}

`file` is relative to the JSONL file's folder (or give the text itself as "text" plus a
"filename" for its kind). Each item is rewritten with `lookahead.edit.rewrite`, exactly as
`lookahead rewrite` does, by two methods interleaved on one Llama: "plain" (the same request
with `speculate=False`, the engine's plain decoding) and "lookahead". Every timed rewrite
starts from an empty KV cache and no saved prefix states. Per item it reports:

* speed: median end-to-end seconds per method, the speedup, and the decode-only speedup
  (seconds after the first streamed text, per output token);
* quality, of lookahead's output (the first repetition): output tokens over source tokens,
  the share of the source's non-blank lines kept verbatim, whether a loop was stopped or an
  output hit its length bound, and whether it is identical to plain's output;
* the second edit: right after lookahead's rewrite, the same file with the item's `second`
  instruction: its reused prompt tokens, and its time to first text against the first edit's.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import click

from lookahead.edit import lines_kept

from .measures import geometric_mean, rotated, workload_seed
from .workloads import json_lines, select

REWRITE_METHODS = ("plain", "lookahead")


def is_rewrite_file(path: Path) -> bool:
    """True when the first JSON line of `path` is a rewrite item (it has an "instruction")."""
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    item = json.loads(line)
                    return isinstance(item, dict) and "instruction" in item
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False


def load_rewrites(path: Path, categories: Sequence[str] = (), limit: int | None = None) -> list[dict]:
    """Read rewrite items, with each one's `text` and `filename` filled in from its `file`.

    Raises click.BadParameter naming the line and the field that is wrong.
    """
    items, seen = [], set()
    for where, item in json_lines(path):
        if not isinstance(item, dict):
            raise click.BadParameter(f"{where}: expected a JSON object", param_hint="WORKLOADS")
        for key in ("id", "category", "instruction"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise click.BadParameter(f"{where}: {key!r} must be a non-empty string, got {item.get(key)!r}",
                                         param_hint="WORKLOADS")
        if "second" in item and (not isinstance(item["second"], str) or not item["second"].strip()):
            raise click.BadParameter(f"{where}: 'second' must be a non-empty string, got {item['second']!r}",
                                     param_hint="WORKLOADS")
        if ("file" in item) == ("text" in item):
            raise click.BadParameter(f"{where}: give exactly one of 'file' (a path) or 'text'", param_hint="WORKLOADS")
        if "file" in item:
            source = path.parent / str(item["file"])
            try:
                item["text"] = source.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise click.BadParameter(f"{where}: cannot read {str(source)!r}: {e}", param_hint="WORKLOADS") from None
            item.setdefault("filename", source.name)
        if item["id"] in seen:
            raise click.BadParameter(f"{where}: id {item['id']!r} appears twice", param_hint="WORKLOADS")
        seen.add(item["id"])
        items.append(item)
    chosen = select(items, categories, limit, "item")
    if not chosen:
        raise click.BadParameter(f"{str(path)!r} holds no rewrite items", param_hint="WORKLOADS")
    return chosen


# ---- quality ------------------------------------------------------------------------------
def quality(source: str, output: str, finish_reason: str, warnings: Sequence[str]) -> dict:
    """The simple checks of one rewrite: length ratio (characters of the output per character
    of the source: the text written, with any source lines a rewrite put back, not only the
    tokens generated), lines kept, loop stopped, bound reached."""
    return {"length_ratio": round(len(output) / max(1, len(source)), 3),
            "lines_kept": round(lines_kept(source, output), 3),
            "loop_stopped": any("loop" in w for w in warnings),
            "bound_reached": finish_reason == "length" or any("bound" in w for w in warnings),
            "finish_reason": finish_reason, "warnings": list(warnings)}


# ---- running --------------------------------------------------------------------------------
def _timed_rewrite(fast: Any, text: str, instruction: str, filename: str | None, **kwargs: Any) -> dict:
    from lookahead import edit

    t0 = time.perf_counter()
    first = None
    rw = edit.rewrite(fast, text, instruction, filename=filename, **kwargs)
    for piece in rw:
        if piece and first is None:
            first = time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    result = rw.result
    stats = result.speculation
    tokens = int(stats.get("generated_tokens") or 0)
    decode = (seconds - first) / max(1, tokens - 1) if first is not None and tokens > 1 else None
    return {"seconds": seconds, "ttft_s": first, "decode_s_per_token": decode, "output_tokens": tokens,
            "text": result.text, "finish_reason": result.finish_reason, "warnings": list(result.warnings),
            "reused_prompt_tokens": int(stats.get("reused_prompt_tokens") or 0),
            "drafted": int(stats.get("drafted") or 0), "accepted": int(stats.get("accepted") or 0)}


def bench_rewrites(model_path: Path, llama: dict[str, Any], items: list[dict], temperature: float, reps: int,
                   log: Callable[[str], None], max_tokens: int | None = None) -> dict:
    """Run every item by both methods, interleaved, then the second edits; returns rows and summaries."""
    import llama_cpp

    import lookahead
    from lookahead.adapters.llama_cpp import clear_kv_cache

    try:
        llm = llama_cpp.Llama(model_path=str(model_path), **llama)
    except ValueError as e:
        raise click.ClickException(f"cannot load model {str(model_path)!r}: {e}") from None
    fast = lookahead.wrap(llm)
    clear_kv_cache(llm)
    # warm-up, untimed: first-call costs (thread timing, the cost curve unless cached,
    # allocations) fall on no method
    _timed_rewrite(fast, items[0]["text"], items[0]["instruction"], items[0].get("filename"), max_tokens=24)
    clear_kv_cache(llm)
    runs: dict[tuple[str, str], list[dict]] = {}
    seconds: list[dict] = []
    for i, item in enumerate(items):
        for rep in range(reps):
            seed = workload_seed(item["id"], rep)
            for method in rotated(REWRITE_METHODS, i + rep):
                clear_kv_cache(llm)
                run = _timed_rewrite(fast, item["text"], item["instruction"], item.get("filename"),
                                     temperature=temperature, seed=seed, speculate=method == "lookahead",
                                     max_tokens=max_tokens)
                runs.setdefault((item["id"], method), []).append(run)
                log(f"[{i + 1}/{len(items)}] {item['id']} rep {rep + 1}/{reps} {method} {run['seconds']:.2f} s")
                if method == "lookahead" and item.get("second"):
                    # the same file again with another instruction, its prefix still cached
                    second = _timed_rewrite(fast, item["text"], item["second"], item.get("filename"),
                                            temperature=temperature, seed=seed, max_tokens=max_tokens)
                    seconds.append({"id": item["id"], "first_ttft_s": run["ttft_s"], **second})
                    log(f"[{i + 1}/{len(items)}] {item['id']} second edit {second['seconds']:.2f} s, "
                        f"reused {second['reused_prompt_tokens']} prompt tokens")
    rows = []
    for item in items:
        plain, fastest = runs[(item["id"], "plain")], runs[(item["id"], "lookahead")]
        source_tokens = fast.count_tokens(item["text"])
        first = fastest[0]
        second = [s for s in seconds if s["id"] == item["id"]]
        row = {"id": item["id"], "category": item["category"], "source_tokens": source_tokens,
               "plain_s": statistics.median(r["seconds"] for r in plain),
               "lookahead_s": statistics.median(r["seconds"] for r in fastest),
               "output_tokens": first["output_tokens"],
               "drafted": first["drafted"], "accepted": first["accepted"],
               "identical_to_plain": first["text"] == plain[0]["text"],
               "quality": quality(item["text"], first["text"], first["finish_reason"], first["warnings"]),
               "text": first["text"], "plain_text": plain[0]["text"]}
        row["speedup"] = row["plain_s"] / row["lookahead_s"]
        decode_plain = _median_or_none(r["decode_s_per_token"] for r in plain)
        decode_fast = _median_or_none(r["decode_s_per_token"] for r in fastest)
        row["decode_speedup"] = decode_plain / decode_fast if decode_plain and decode_fast else None
        if second:
            row["second"] = {"instruction": item["second"],
                             "reused_prompt_tokens": second[0]["reused_prompt_tokens"],
                             "ttft_s": _median_or_none(s["ttft_s"] for s in second),
                             "first_ttft_s": _median_or_none(s["first_ttft_s"] for s in second),
                             "seconds": statistics.median(s["seconds"] for s in second),
                             "quality": quality(item["text"], second[0]["text"], second[0]["finish_reason"],
                                                second[0]["warnings"]),
                             "text": second[0]["text"]}
            s = row["second"]
            s["ttft_ratio"] = s["ttft_s"] / s["first_ttft_s"] if s["ttft_s"] and s["first_ttft_s"] else None
        rows.append(row)
    return {"rows": rows, "summary": summarise_rewrites(rows)}


def _median_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise_rewrites(rows: Sequence[dict]) -> list[dict]:
    """Per category and over all: geometric-mean speedups, worst item, quality counts."""
    groups = list(dict.fromkeys(r["category"] for r in rows)) + ["all"]
    out = []
    for category in groups:
        chosen = [r for r in rows if category == "all" or r["category"] == category]
        worst = min(chosen, key=lambda r: r["speedup"])
        ratios = [r["second"]["ttft_ratio"] for r in chosen if r.get("second") and r["second"]["ttft_ratio"]]
        out.append({
            "category": category, "n": len(chosen),
            "speedup": geometric_mean(r["speedup"] for r in chosen),
            "decode_speedup": geometric_mean(r["decode_speedup"] for r in chosen),
            "worst": {"id": worst["id"], "speedup": worst["speedup"]},
            "acceptance": (sum(r["accepted"] for r in chosen) / sum(r["drafted"] for r in chosen)
                           if sum(r["drafted"] for r in chosen) else None),
            "length_ratio": statistics.median(r["quality"]["length_ratio"] for r in chosen),
            "lines_kept": statistics.median(r["quality"]["lines_kept"] for r in chosen),
            "loops_stopped": sum(r["quality"]["loop_stopped"] for r in chosen),
            "bounds_reached": sum(r["quality"]["bound_reached"] for r in chosen),
            "identical_to_plain": sum(r["identical_to_plain"] for r in chosen),
            "second_ttft_ratio": geometric_mean(ratios),
        })
    return out


def format_rewrites(result: dict) -> str:
    """The per-item table, then the per-category one."""
    def num(x, fmt="{:.2f}"):
        return "–" if x is None else fmt.format(x)

    lines = ["| item | source tok | output tok | plain s | lookahead s | speedup | decode × | length ratio | "
             "lines kept | loop stopped | bound reached | = plain | 2nd edit: reused tok | 2nd edit: first text, × of 1st |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        q, s = r["quality"], r.get("second") or {}
        lines.append(f"| {r['id']} | {r['source_tokens']} | {r['output_tokens']} | {r['plain_s']:.2f} | "
                     f"{r['lookahead_s']:.2f} | {r['speedup']:.2f}× | {num(r['decode_speedup'])}× | "
                     f"{q['length_ratio']:.2f} | {q['lines_kept']:.0%} | {'yes' if q['loop_stopped'] else 'no'} | "
                     f"{'yes' if q['bound_reached'] else 'no'} | {'yes' if r['identical_to_plain'] else 'no'} | "
                     f"{s.get('reused_prompt_tokens', '–')} | {num(s.get('ttft_ratio'))} |")
    lines += ["", "| category | n | speedup | decode × | worst | acceptance | length ratio | lines kept | "
                  "loops stopped | bounds reached | = plain | 2nd edit first text × |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in result["summary"]:
        lines.append(f"| {g['category']} | {g['n']} | {num(g['speedup'])}× | {num(g['decode_speedup'])}× | "
                     f"{g['worst']['id']} {g['worst']['speedup']:.2f}× | {num(g['acceptance'], '{:.0%}')} | "
                     f"{g['length_ratio']:.2f} | {g['lines_kept']:.0%} | {g['loops_stopped']} | "
                     f"{g['bounds_reached']} | {g['identical_to_plain']}/{g['n']} | {num(g['second_ttft_ratio'])} |")
    return "\n".join(lines)
