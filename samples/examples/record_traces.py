"""Record replay traces: the prompt tokens and plain llama-cpp-python's output tokens per workload.

    .venv/bin/python samples/examples/record_traces.py [-t 0] [-t 0.7] [--out FILE] [WORKLOADS.jsonl ...]

Default workloads: samples/workloads.jsonl and samples/examples/short_rag.jsonl (short answers
after a few hundred tokens of passages). Default output: samples/examples/traces.json, which
`python -m lookahead.simulate` replays and `python -m lookahead.simulate priors` fits the
drafter's prior table from. Every call is plain `Llama.create_chat_completion` (or
`create_completion`) on the default model with flash attention on (as lookahead loads models:
the greedy tokens depend on it), the KV cache cleared, llama-cpp-python's default threads
unless --threads, seed 1 at t > 0; the tokens are taken from `Llama.generate` as
create_completion consumes them, so they are exactly the prompt the model saw and the tokens
it emitted (EOS included when it stopped there). No reference texts are registered: the
workloads carry their sources in the prompt.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def record_one(llm, workload: dict, temperature: float, seed: int = 1) -> dict:
    """One plain call of `llm` (a llama_cpp.Llama) on `workload`; its prompt and output tokens."""
    seen: dict = {}
    original = llm.generate

    def generate(tokens, *args, **kwargs):  # create_completion calls self.generate(prompt_tokens, ...)
        seen["prompt"] = [int(t) for t in tokens]
        seen["output"] = out = []
        for token in original(tokens, *args, **kwargs):
            out.append(int(token))
            yield token

    llm.generate = generate  # an instance attribute: the chat handler's llama.create_completion finds it
    try:
        llm.reset()  # no prefix reuse: llama-cpp-python's eval drops KV entries past n_tokens
        kwargs = dict(max_tokens=workload["max_tokens"], temperature=temperature, seed=seed)
        if "messages" in workload:
            llm.create_chat_completion(workload["messages"], **kwargs)
        else:
            llm.create_completion(workload["prompt"], **kwargs)
    finally:
        del llm.generate
    return {"id": workload["id"], "category": workload["category"], "temperature": temperature,
            "seed": seed, "max_tokens": workload["max_tokens"], "prompt": seen["prompt"], "output": seen["output"],
            "references": [], "eog": eog_tokens(llm)}


def eog_tokens(llm) -> list[int]:
    """The model's end-of-generation tokens (drafts stop at them; the simulator needs them)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]


def record_traces(llm, workloads: list[dict], temperatures: list[float], log=sys.stderr) -> list[dict]:
    traces = []
    for temperature in temperatures:
        for w in workloads:
            t0 = time.perf_counter()
            traces.append(record_one(llm, w, temperature))
            print(f"t={temperature} {w['id']:32s} prompt {len(traces[-1]['prompt']):4d} "
                  f"output {len(traces[-1]['output']):4d}  {time.perf_counter() - t0:5.1f} s", file=log)
    return traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", type=Path,
                        default=[HERE.parent / "workloads.jsonl", HERE / "short_rag.jsonl"])
    parser.add_argument("-t", "--temperature", type=float, action="append")
    parser.add_argument("--out", type=Path, default=HERE / "traces.json")
    parser.add_argument("--threads", type=int, help="n_threads and n_threads_batch (default: llama-cpp-python's)")
    args = parser.parse_args()

    from lookahead.models import default_model_path  # first: lookahead picks the exact mode before llama_cpp loads

    import llama_cpp

    workloads = [json.loads(line) for path in args.workloads for line in path.read_text().splitlines() if line.strip()]
    threads = {} if args.threads is None else dict(n_threads=args.threads, n_threads_batch=args.threads)
    llm = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=4096, flash_attn=True, verbose=False, **threads)
    traces = record_traces(llm, workloads, args.temperature or [0.0, 0.7])
    # one trace per line: small diffs when re-recorded
    args.out.write_text("[\n" + ",\n".join(json.dumps(t, separators=(",", ":")) for t in traces) + "\n]\n")
    print(f"wrote {len(traces)} traces to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
