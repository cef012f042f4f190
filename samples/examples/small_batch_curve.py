"""The verify-cost curve t(N) on the default model, with the packed copy of the weights and without.

t(N) is one decode of N tokens with every row's logits (a verify's case) after a 300-token
context, rolled back after each timing. LOOKAHEAD_PACK_WEIGHTS (read by the set-up's build at
every product, ggml-weights-packed-small-batches.patch) is switched between rounds, so both
settings are timed in one process, interleaved, and each size's median is printed per setting.
Without AVX-512 VNNI, or with a build lacking the patch, both rows time the same kernels.

    .venv/bin/python samples/examples/small_batch_curve.py --reps 7 --sizes 1,2,4,8,16
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import lookahead  # noqa: F401  (first: it turns the exact mode on before llama_cpp loads a model)
import llama_cpp
from lookahead.adapters.exact import PACK_ENV as PACK
from lookahead.models import default_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="rounds of every size and setting (default 7)")
    parser.add_argument("--sizes", default="1,2,4,6,8,16", help="batch sizes, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    llm = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=4096, n_threads=args.threads,
                          n_threads_batch=args.threads, flash_attn=True, logits_all=True, verbose=False)
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    tokens = llm.tokenize(text.encode())[: 300 + max(sizes)]
    memory = llama_cpp.llama_get_memory(llm.ctx)
    llm.eval(tokens[:300])

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        llm.eval(tokens[300 : 300 + n])
        ms = 1000 * (time.perf_counter() - t0)
        llama_cpp.llama_memory_seq_rm(memory, 0, 300, -1)
        llm.n_tokens = 300
        return ms

    settings = ("0", "1")
    for setting in settings:  # untimed: the first packed product makes the copy
        os.environ[PACK] = setting
        timed(2)
    times: dict[str, dict[int, list[float]]] = {s: {n: [] for n in sizes} for s in settings}
    for _ in range(args.reps):
        for setting in settings:
            os.environ[PACK] = setting
            for n in sizes:
                times[setting][n].append(timed(n))
    for setting in settings:
        label = "packed" if setting == "1" else "not packed"
        print(f"{label:>10}: " + "  ".join(f"t({n}) {statistics.median(v):.1f}" for n, v in times[setting].items()))


if __name__ == "__main__":
    main()
