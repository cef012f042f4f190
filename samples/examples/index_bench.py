"""Micro-benchmark of the suffix index: append and query cost, and memory, by context size.

    .venv/bin/python samples/examples/index_bench.py [--sizes 1000,10000,100000]

The token stream mimics an edit: a document of random tokens (vocabulary 49152), then
copies of it with sparse changes, so queries find long matches as they do in a rewrite.
Memory is what tracemalloc sees allocated by the index (Python lists, dicts, numpy arrays).
"""
import sys
import time
import tracemalloc

import numpy as np

from lookahead.index import SuffixIndex

sizes = [1000, 10000, 100000]
if "--sizes" in sys.argv:
    sizes = [int(x) for x in sys.argv[sys.argv.index("--sizes") + 1].split(",")]
rng = np.random.default_rng(0)
print(f"{'tokens':>8} {'append us/token':>16} {'query us (median)':>18} {'query us (p99)':>15} {'MiB':>7} {'bytes/token':>12}")
for n in sizes:
    doc = rng.integers(0, 49152, size=min(n, 2000))
    stream = np.concatenate([doc] * (n // len(doc) + 1))[:n].copy()
    edits = rng.random(n) < 0.01
    stream[edits] = rng.integers(0, 49152, size=int(edits.sum()))
    tokens = stream.tolist()
    tracemalloc.start()
    index = SuffixIndex()
    t0 = time.perf_counter()
    index.extend(tokens)
    append_us = 1e6 * (time.perf_counter() - t0) / n
    mem = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    times = []
    for _ in range(300):  # query after each appended token, as the engine does
        t0 = time.perf_counter()
        index.query()
        times.append(1e6 * (time.perf_counter() - t0))
        index.extend([int(rng.integers(0, 49152)) if rng.random() < 0.05 else int(stream[len(index) % len(doc)])])
    print(f"{n:>8} {append_us:>16.2f} {np.median(times):>18.1f} {np.percentile(times, 99):>15.1f} "
          f"{mem / 2**20:>7.1f} {mem / n:>12.0f}")
