"""Offline simulator: replay a recorded greedy output through the index and drafter.

With temperature 0 the target's choice at every position is fixed by the recorded output,
so a draft's fate is known without running the model: it is accepted up to the first token
that differs from the recording. Replaying with a cost curve t(n) gives the passes and the
time a drafting policy would take, and its speedup over one decode per token, in
milliseconds of simulated time. Use it to tune the drafter in seconds instead of hours:

    python -m lookahead.simulate traces.json     # [{"category", "prompt", "output"}, ...]
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .drafter import CostModel, Drafter
from .index import SuffixIndex


@dataclass
class Replay:
    tokens: int
    passes: int
    drafted: int
    accepted: int
    time_ms: float
    plain_ms: float

    @property
    def speedup(self) -> float:
        return self.plain_ms / self.time_ms if self.time_ms else 0.0


def replay(prompt: Sequence[int], output: Sequence[int], drafter: Drafter, cost_ms: Callable[[int], float],
           references: Sequence[Sequence[int]] = ()) -> Replay:
    """Replay `output` (greedy tokens after `prompt`) with `drafter`; cost_ms(n) = t(n)."""
    index = SuffixIndex()
    for ref in references:
        index.add_reference(ref)
    index.extend(prompt)
    drafter.reset()
    pos = passes = drafted = accepted = 0
    time_ms = 0.0
    n = len(output)
    while pos < n:
        draft = drafter.propose(index, n - pos - 1)
        k = len(draft)
        path = _walk(draft, output[pos : pos + k])
        a = len(path)
        drafter.record(draft, a, path)
        emitted = list(output[pos : pos + a + 1])
        index.extend(emitted)
        pos += len(emitted)
        passes += 1
        drafted += k
        accepted += a
        time_ms += cost_ms(k + 1)
    return Replay(n, passes, drafted, accepted, time_ms, n * cost_ms(1))


def _walk(draft, truth: Sequence[int]) -> list[int]:
    """The draft nodes a greedy target accepts when it emits `truth` (chain or tree)."""
    if draft.parents is None:
        a = 0
        while a < len(draft) and a < len(truth) and draft.tokens[a] == truth[a]:
            a += 1
        return list(range(a))
    path: list[int] = []
    node = -1
    for token in truth:
        node = next((j for j, p in enumerate(draft.parents) if p == node and draft.tokens[j] == token), None)
        if node is None:
            break
        path.append(node)
    return path


def main(argv: list[str]) -> None:
    traces = json.load(open(argv[0]))
    # The curve measured on 2 cores with SmolLM2-135M Q4_1 (../shared/DESIGN.md, t(n) in ms).
    cost = CostModel(max_batch=512)
    for n_tokens, ms in ((1, 11), (2, 21), (4, 29), (8, 43), (16, 86), (32, 150), (64, 293)):
        cost.observe(n_tokens, ms)
    cost.learning = False
    by_cat: dict[str, list[float]] = {}
    for t in traces:
        r = replay(t["prompt"], t["output"], Drafter(cost), cost.cost_ms)
        by_cat.setdefault(t["category"], []).append(r.speedup)
        print(f"{t.get('id', '?'):32s} {t['category']:12s} x{r.speedup:.2f} passes {r.passes} "
              f"tokens/pass {r.tokens / r.passes:.2f} acc {r.accepted}/{r.drafted}")
    for cat, values in by_cat.items():
        print(f"{cat:12s} geomean x{float(np.exp(np.mean(np.log(values)))):.3f}")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
