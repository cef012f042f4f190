"""Wrap an existing llama_cpp.Llama and compare lookahead with plain decoding on one rewrite.

    .venv/bin/python samples/examples/wrap_completion.py [MODEL.gguf]

Runs the same greedy request three times each way, interleaved, and prints the median times,
their ratio, whether the outputs are identical, and the speculation stats.
"""
import statistics
import sys
import time
from pathlib import Path

import llama_cpp

import lookahead
from lookahead.adapters.llama_cpp import clear_kv_cache
from lookahead.models import default_model_path

model = sys.argv[1] if len(sys.argv) > 1 else str(default_model_path())
llm = llama_cpp.Llama(model_path=model, n_ctx=4096, verbose=False)
fast = lookahead.wrap(llm)  # same create_completion / create_chat_completion as llm

doc = (Path(__file__).parents[1] / "docs" / "meeting_notes.md").read_text()
messages = [{"role": "user", "content": "Fix the spelling mistakes in the following document. "
                                        "Output the whole revised document and nothing else.\n\n" + doc}]
plain_s, fast_s = [], []
for _ in range(3):
    for runner, times in ((llm, plain_s), (fast, fast_s)):
        clear_kv_cache(llm)  # every run pays its own prefill
        t0 = time.perf_counter()
        out = runner.create_chat_completion(messages, max_tokens=400, temperature=0)
        times.append(time.perf_counter() - t0)
        if runner is llm:
            plain = out
        else:
            spec = out

print(spec["choices"][0]["message"]["content"][:400], "...\n")
p, f = statistics.median(plain_s), statistics.median(fast_s)
print(f"plain {p:.2f} s, lookahead {f:.2f} s: {p / f:.2f}x")
print("identical output:", plain["choices"][0]["message"] == spec["choices"][0]["message"])
s = spec["speculation"]
print(f"tokens/pass {s['tokens_per_pass']:.2f}, drafted {s['drafted']}, accepted {s['accepted']}, "
      f"histogram {s['accept_histogram']}")
