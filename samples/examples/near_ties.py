"""Measure where greedy output with speculation differs from plain decoding, and why.

    .venv/bin/python samples/examples/near_ties.py [samples/workloads.jsonl] [--limit N]

For each workload: plain greedy decoding (lookahead's engine with speculation off, which
reproduces llama-cpp-python's output) and greedy with speculation, both recording every
logits row they chose from. Prints the first position where the outputs differ and plain
decoding's top-2 logit gap there. A small gap is a near-tie: llama.cpp computes a position's
logits slightly differently in a one-token and a multi-token decode, so the argmax can flip.
Also checks that every speculative token is the argmax of the row the verifier saw.
"""
import json
import sys

import numpy as np

import lookahead

path = next((a for a in sys.argv[1:] if a.endswith(".jsonl")), "samples/workloads.jsonl")
limit = int(sys.argv[sys.argv.index("--limit") + 1]) if "--limit" in sys.argv else None
fast = lookahead.load(n_ctx=4096)
llm = fast.llm


def record(speculate, messages, max_tokens):
    rows = []

    def observer(logits, draft, verdict):
        for i, tok in enumerate(verdict.tokens):
            row = np.asarray(logits[i], dtype=np.float64)
            top2 = np.partition(row, -2)[-2:]
            rows.append((int(tok), int(np.argmax(row)), float(top2[1] - top2[0])))

    fast.observer = observer
    llm.reset()
    out = fast.create_chat_completion(messages, max_tokens=max_tokens, temperature=0, speculate=speculate)
    fast.observer = None
    return rows[: out["usage"]["completion_tokens"]], out


workloads = [json.loads(line) for line in open(path)][:limit]
identical = 0
gaps = []
for w in workloads:
    plain, _ = record(False, w["messages"], w["max_tokens"])
    spec, out = record(True, w["messages"], w["max_tokens"])
    assert all(tok == arg for tok, arg, _ in spec), "a speculative token is not the argmax of its row"
    diverge = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a[0] != b[0]), None)
    if diverge is None and len(plain) == len(spec):
        identical += 1
        print(f"{w['id']:32s} identical ({len(plain)} tokens, {out['speculation']['tokens_per_pass']:.2f} tokens/pass)")
    else:
        i = diverge if diverge is not None else min(len(plain), len(spec))
        gap = plain[i][2] if i < len(plain) else float("nan")
        gaps.append(gap)
        print(f"{w['id']:32s} differs at token {i}: plain top-2 gap {gap:.4f} logits")
print(f"\n{identical}/{len(workloads)} identical; gaps at the first difference: "
      f"{', '.join(f'{g:.3f}' for g in sorted(gaps))}")
