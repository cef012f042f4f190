"""Record replay traces: the prompt tokens and plain llama-cpp-python's output tokens per workload.

    .venv/bin/python samples/examples/record_traces.py [-t 0] [-t 0.7] [--out FILE] [WORKLOADS.jsonl ...]
    .venv/bin/python samples/examples/record_traces.py --add-pieces FILE [--model NAME]

Default workloads: samples/workloads.jsonl and samples/examples/short_rag.jsonl (short answers
after a few hundred tokens of passages). Default output: samples/examples/traces.json, which
`python -m lookahead.simulate` replays and `python -m lookahead.simulate priors` fits the
drafter's prior table from. Every call is plain `Llama.create_chat_completion` (or
`create_completion`) on the default model with flash attention on (as lookahead loads models:
the greedy tokens depend on it), the KV cache cleared, llama-cpp-python's default threads
unless --threads, seed 1 at t > 0; the tokens are taken from `Llama.generate` as
create_completion consumes them, so they are exactly the prompt the model saw and the tokens
it emitted (EOS included when it stopped there). No reference texts are registered: the
workloads carry their sources in the prompt. Each trace also holds the text of every token it
uses ("pieces"), which the drafter reads sentence ends from; `--add-pieces` adds them to a
file recorded without them, with the tokenizer of `--model` (the one that recorded it).
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
            "references": [], "eog": eog_tokens(llm), "pieces": token_pieces(llm, seen["prompt"] + seen["output"])}


def token_pieces(llm, tokens) -> dict[str, str]:
    """{token id: its text} for the distinct `tokens` (bytes that make no UTF-8 character as U+FFFD)."""
    return {str(t): llm.detokenize([t]).decode("utf-8", errors="replace") for t in sorted(set(tokens))}


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
    parser.add_argument("--add-pieces", type=Path, metavar="FILE",
                        help="add the token texts to the traces in FILE (recorded without them), then stop")
    parser.add_argument("--model", help="with --add-pieces: the model that recorded FILE (default: the default model)")
    args = parser.parse_args()

    from lookahead.models import default_model_path, resolve  # first: lookahead picks the exact mode

    import llama_cpp

    if args.add_pieces:
        vocab = llama_cpp.Llama(model_path=str(resolve(args.model)), vocab_only=True, verbose=False)
        traces = json.loads(args.add_pieces.read_text())
        for t in traces:
            t["pieces"] = token_pieces(vocab, [*t["prompt"], *t["output"], *(x for r in t["references"] for x in r)])
        write_traces(args.add_pieces, traces)
        print(f"added token texts to {len(traces)} traces in {args.add_pieces}", file=sys.stderr)
        return

    workloads = [json.loads(line) for path in args.workloads for line in path.read_text().splitlines() if line.strip()]
    threads = {} if args.threads is None else dict(n_threads=args.threads, n_threads_batch=args.threads)
    llm = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=4096, flash_attn=True, verbose=False, **threads)
    traces = record_traces(llm, workloads, args.temperature or [0.0, 0.7])
    write_traces(args.out, traces)
    print(f"wrote {len(traces)} traces to {args.out}", file=sys.stderr)


def write_traces(path: Path, traces: list[dict]) -> None:
    # one trace per line: small diffs when re-recorded
    path.write_text("[\n" + ",\n".join(json.dumps(t, separators=(",", ":")) for t in traces) + "\n]\n")


if __name__ == "__main__":
    main()
