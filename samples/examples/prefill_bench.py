"""Prefill of a long prompt: lookahead's against llama-cpp-python's, interleaved, medians.

    .venv/bin/python samples/examples/prefill_bench.py [--tokens 3000] [--reps 7]

The prompt is the sample documents and code, cut to --tokens tokens. Each call generates one
token with the KV cache cleared first, so its time is the prompt's prefill; the two methods
alternate which goes first. One untimed call each first (lookahead's first request also
measures its decode threads and cost curve, ~0.5 s once per Llama). The machine's speed
drifts, so the figure to read is the median of the per-repetition ratios. lookahead prefills in llama-cpp-python's own chunks (n_batch),
asking logits only for the last row of each, so the ratio should be 1.0 within noise.
"""
import statistics
import sys
import time
from pathlib import Path

import llama_cpp

import lookahead
from lookahead.adapters.llama_cpp import clear_kv_cache
from lookahead.models import default_model_path


def arg(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


n_tokens, reps = arg("--tokens", 3000), arg("--reps", 7)
llm = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=4096, verbose=False)
fast = lookahead.wrap(llm)
samples = Path(__file__).resolve().parents[1]
text = "".join(p.read_text() for p in sorted(samples.rglob("*")) if p.suffix in (".md", ".py"))
prompt = llm.detokenize(llm.tokenize(text.encode())[:n_tokens]).decode("utf-8", "ignore")
print(f"prompt: {len(llm.tokenize(prompt.encode()))} tokens; n_batch {llm.n_batch}; {reps} reps")
methods = {"llama-cpp-python": llm.create_completion, "lookahead": fast.create_completion}
times: dict[str, list[float]] = {name: [] for name in methods}
for warm_up in methods.values():
    clear_kv_cache(llm)
    warm_up(prompt, max_tokens=1, temperature=0)
for rep in range(reps):
    order = list(methods) if rep % 2 == 0 else list(reversed(methods))
    for name in order:
        clear_kv_cache(llm)
        t0 = time.perf_counter()
        methods[name](prompt, max_tokens=1, temperature=0)
        times[name].append(time.perf_counter() - t0)
for name, values in times.items():
    print(f"{name:>17}: median {statistics.median(values):.3f} s  ({', '.join(f'{v:.2f}' for v in values)})")
ratios = [a / b for a, b in zip(times["llama-cpp-python"], times["lookahead"])]
print(f"llama-cpp-python / lookahead, median of per-repetition ratios: {statistics.median(ratios):.3f} "
      f"({', '.join(f'{r:.2f}' for r in ratios)})")
