"""Where a lookahead request's time goes, per workload category, from its own stats.

    .venv/bin/python samples/examples/profile_time.py [--temperature 0] [--limit N]

Runs every workload of samples/workloads.jsonl once through `lookahead.wrap(llm)` (the KV
cache cleared before each, a Llama with llama-cpp-python's default threads) and splits the
wall time into: prefill (the prompt but its last chunk), verify (target decodes: the
prompt's last chunk and every [last token + draft]), propose (index queries and drafting
decisions), sample (the verifier), calibration (one-off: decode threads and the cost curve,
first request only) and the rest (detokenizing, stop strings, streaming bookkeeping).
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import llama_cpp

import lookahead
from lookahead.adapters.llama_cpp import clear_kv_cache
from lookahead.models import default_model_path

temperature = float(sys.argv[sys.argv.index("--temperature") + 1]) if "--temperature" in sys.argv else 0.0
limit = int(sys.argv[sys.argv.index("--limit") + 1]) if "--limit" in sys.argv else None
path = Path(__file__).resolve().parents[1] / "workloads.jsonl"
workloads = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
llm = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=4096, verbose=False)
fast = lookahead.wrap(llm)
parts = ("prefill_ms", "verify_ms", "propose_ms", "sample_ms", "calibration_ms")
totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
seen: dict[str, int] = defaultdict(int)
for w in workloads:
    if limit is not None and seen[w["category"]] >= limit:
        continue
    seen[w["category"]] += 1
    clear_kv_cache(llm)
    kwargs = dict(max_tokens=w["max_tokens"], temperature=temperature, seed=1)
    out = (fast.create_chat_completion(w["messages"], **kwargs) if "messages" in w
           else fast.create_completion(w["prompt"], **kwargs))
    stats = out["speculation"]
    for key in (*parts, "total_ms", "generated_tokens", "target_passes", "draft_passes"):
        totals[w["category"]][key] += stats[key]
        totals["all"][key] += stats[key]
    print(f"{w['id']:32s} {stats['total_ms']:8.0f} ms  {stats['generated_tokens']:4d} tokens  "
          f"{stats['target_passes']:4d} passes", file=sys.stderr)
print(f"temperature {temperature}; share of each category's wall time; ms per target pass")
print(f"{'category':12s} {'total ms':>9s} " + " ".join(f"{p[:-3]:>12s}" for p in parts)
      + f" {'other':>7s} {'ms/pass':>8s} {'propose/pass':>13s}")
for category, t in sorted(totals.items(), key=lambda item: item[0] == "all"):
    total = t["total_ms"]
    other = total - sum(t[p] for p in parts)
    shares = " ".join(f"{100 * t[p] / total:11.1f}%" for p in parts)
    print(f"{category:12s} {total:9.0f} {shares} {100 * other / total:6.1f}% "
          f"{(t['verify_ms']) / t['target_passes']:8.2f} {t['propose_ms'] / t['target_passes']:12.3f}")
