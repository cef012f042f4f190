"""How far a batched decode's logits are from one-token decodes of the same tokens.

    .venv/bin/python samples/examples/batch_vs_single.py [FILE] [--prompt N] [--tokens M]

Tokenizes FILE (default: samples/code/textutils.py) with the embedded model, takes its first
N tokens as the prompt and the next M as a fixed continuation, and computes the logits rows
that predict each continuation token twice from an empty KV cache: once with one-token
decodes, once with decodes of 2, 4, ..., 64 tokens (what verifying a draft does). For each
batch size it prints, against the one-token rows:

* the largest |difference| of a raw logit, per row (median, 90th percentile, max);
* the total variation distance between the two softmax distributions, per row;
* how many rows have another argmax, and plain decoding's top-2 gap at those rows.

The verifier always samples from the rows it was given, so this is not an error in
lookahead; it is why greedy output with speculation can differ from plain decoding at a
near-tie, and by how much a sampled token's distribution moves with the batch shape. The
differences come from llamafile's kernels, which llama.cpp uses for batches only; on a build
with -DGGML_LLAMAFILE=OFF every figure here is 0.
"""
import argparse

import numpy as np

import lookahead
from lookahead.adapters.llama_cpp import clear_kv_cache


def rows_for(target, llm, prompt, continuation, chunk):
    """Logits rows predicting continuation[0..] (the first from the prompt's last decode)."""
    clear_kv_cache(llm)
    target.begin(prompt)
    rows = [target.decode(prompt[target.n_past:], 1)[-1:].copy()]  # decode returns a view: copy it
    for start in range(0, len(continuation) - 1, chunk):
        piece = continuation[start : min(start + chunk, len(continuation) - 1)]
        rows.append(target.decode(piece, len(piece)).copy())
    target.end(prompt + continuation[:-1])
    return np.concatenate(rows).astype(np.float64)


def softmax(rows):
    z = np.exp(rows - rows.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", default="samples/code/textutils.py")
    parser.add_argument("--prompt", type=int, default=400, help="prompt tokens (default 400)")
    parser.add_argument("--tokens", type=int, default=64, help="continuation tokens (default 64)")
    args = parser.parse_args()
    fast = lookahead.load(n_ctx=4096)
    tokens = fast.tokenize(open(args.file, encoding="utf-8").read())
    if len(tokens) < args.prompt + args.tokens:
        raise SystemExit(f"{args.file}: {len(tokens)} tokens, need --prompt + --tokens = {args.prompt + args.tokens}")
    prompt, continuation = tokens[: args.prompt], tokens[args.prompt : args.prompt + args.tokens]
    single = rows_for(fast.target, fast.llm, prompt, continuation, 1)
    top2 = np.sort(single, axis=1)[:, -2:]
    p = softmax(single)
    print(f"{len(continuation)} rows after a {len(prompt)}-token prompt, against one-token decodes:")
    for chunk in (2, 4, 8, 16, 32, 64):
        batched = rows_for(fast.target, fast.llm, prompt, continuation, chunk)
        diff = np.abs(batched - single).max(axis=1)
        tv = 0.5 * np.abs(softmax(batched) - p).sum(axis=1)
        flips = np.flatnonzero(batched.argmax(axis=1) != single.argmax(axis=1))
        gaps = ", ".join(f"{top2[i, 1] - top2[i, 0]:.3f}" for i in flips)
        print(f"  batches of {chunk:2d}: max |logit diff| median {np.median(diff):.3f}, p90 "
              f"{np.quantile(diff, 0.9):.3f}, max {diff.max():.3f}; total variation median "
              f"{np.median(tv):.4f}, max {tv.max():.4f}; argmax differs in {len(flips)} rows"
              + (f" (top-2 gaps {gaps})" if len(flips) else ""))


if __name__ == "__main__":
    main()
