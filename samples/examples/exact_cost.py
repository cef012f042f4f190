"""What exact mode costs plain decoding: llama-cpp-python's own create_completion, its default
threads, in exact mode and with LOOKAHEAD_EXACT_BATCHES=0, in alternating child processes
(llama.cpp reads the mode once per process). Prints each run and the medians.

    .venv/bin/python samples/examples/exact_cost.py                  # the default model, 3 rounds
    .venv/bin/python samples/examples/exact_cost.py --rounds 1 --model smollm2-135m
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TEXT = Path(__file__).resolve().parents[1] / "docs" / "tallybook_readme.md"

CHILD = """
import json, sys, time
import lookahead  # chooses the exact mode from the environment, as users get it
import llama_cpp
from lookahead.models import resolve
llm = llama_cpp.Llama(model_path=str(resolve(sys.argv[1])), n_ctx=2048, verbose=False)
text = open(sys.argv[2]).read() * 4
prompt = llm.detokenize(llm.tokenize(text.encode())[: int(sys.argv[3])]).decode(errors="ignore")
for rep in range(2):
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    t0 = time.perf_counter(); first = None; n = 0
    for chunk in llm.create_completion(prompt, max_tokens=48, temperature=0, stream=True):
        n += 1
        first = first or time.perf_counter() - t0
    total = time.perf_counter() - t0
    print(json.dumps({"ttft_s": first, "per_token_ms": 1000 * (total - first) / max(1, n - 1)}), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a model name or a GGUF path")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (each: one process per mode)")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"exact": [], "--no-exact": []}
    for _ in range(args.rounds):
        for mode, value in (("exact", "1"), ("--no-exact", "0")):
            env = {**os.environ, "LOOKAHEAD_EXACT_BATCHES": value}
            out = subprocess.run([sys.executable, "-c", CHILD, args.model, str(TEXT), str(args.prompt_tokens)],
                                 capture_output=True, text=True, env=env, check=True).stdout
            for line in out.splitlines():
                runs[mode].append(json.loads(line))
                print(mode, line, flush=True)
    for mode, rs in runs.items():
        print(f"{mode}: time to first token {statistics.median(r['ttft_s'] for r in rs):.2f} s, "
              f"{statistics.median(r['per_token_ms'] for r in rs):.1f} ms per token after it "
              f"(medians of {len(rs)} runs)")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
