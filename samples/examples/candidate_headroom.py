"""How much of a category's headroom lies in the draft's length, and how much in its tokens.

    .venv/bin/python samples/examples/candidate_headroom.py [TRACES.json] [--curve 1:29.3,2:30.6,...]

Replays recorded outputs (samples/examples/default_model_traces.json by default; see
docs/simulator.md) with the simulator's cost curve and prints, per category, the decode
speedup over one decode per token of:

- policy:  the drafter as it runs (`python -m lookahead.simulate`'s figure);
- length:  the simulator's oracle, which drafts exactly the accepted part of the drafter's own
           candidate when that pays: the ceiling of any length policy on these candidates;
- occ>=2:  at every step, the best continuation among all earlier occurrences of the context's
           last 2 tokens, knowing the output: the ceiling of choosing among those occurrences;
- occ>=1:  the same among the occurrences of the last token alone;
- any:     the longest run of the coming output found anywhere in the context.

Each oracle drafts as much of its run as pays ((k + 1) / t(k + 1) against 1 / t(1), by the
drafter's min_gain: the drafter's own `best_length` with every token certain). The oracles know the output, so no drafter reaches them; the gaps between
them say where a better drafter could gain: `length` over `policy` is the length policy's
share, `occ` and `any` over `length` what other candidates could add.
"""
from __future__ import annotations

import argparse
import json
from typing import Sequence

import numpy as np

from lookahead import simulate
from lookahead.drafter import CostModel, Drafter, best_length
from lookahead.sequences import agreeing_prefix

MAX_RUN = 64


def _oracle(prompt: Sequence[int], output: Sequence[int], cost: CostModel, min_gain: float, suffix: int) -> float:
    """Decode speedup of drafting, at every step, the best run from occurrences of the
    context's last `suffix` tokens (0: from anywhere in the context): as much of it as the
    drafter's own length rule (`best_length`, every token certain) finds pays."""
    context = list(prompt)
    pos = 0
    time_ms = 0.0
    while pos < len(output):
        tail = context[len(context) - suffix:] if suffix else []
        starts = [p for p in range(suffix, len(context)) if context[p - suffix:p] == tail]
        # a draft leaves room for the pass's own token: at most the output's remaining tokens - 1
        future = output[pos:pos + min(MAX_RUN, len(output) - pos - 1)]
        run = max((agreeing_prefix(context[s:s + len(future)], future) for s in starts), default=0)
        k, _ = best_length(np.ones(run), cost.curve(), min_gain)
        time_ms += cost.cost_ms(k + 1)
        context.extend(output[pos:pos + k + 1])
        pos += k + 1
    return len(output) * cost.cost_ms(1) / time_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="?", default="samples/examples/default_model_traces.json")
    parser.add_argument("--curve", type=simulate._parse_curve, default=simulate.DEFAULT_CURVE,
                        help="N:MS,N:MS,... (default: the simulator's DEFAULT_CURVE)")
    args = parser.parse_args()
    cost = simulate.pinned_cost(args.curve)
    min_gain = Drafter(cost).min_gain
    rows: dict[str, list[list[float]]] = {}
    for trace in json.load(open(args.traces)):
        policy, length = simulate.replay_trace(
            trace, cost, lambda sampled: Drafter(cost, sampled=sampled))
        prompt = [t for ref in trace.get("references", ()) for t in ref] + list(trace["prompt"])
        oracles = [_oracle(prompt, trace["output"], cost, min_gain, m) for m in (2, 1, 0)]
        rows.setdefault(trace["category"], []).append([policy.speedup, length.speedup, *oracles])
    print(f"{'category':12s} {'n':>3s} {'policy':>7s} {'length':>7s} {'occ>=2':>7s} {'occ>=1':>7s} {'any':>7s}")
    for category, values in rows.items():
        means = np.exp(np.log(np.array(values)).mean(axis=0))
        print(f"{category:12s} {len(values):3d} " + " ".join(f"{x:7.3f}" for x in means))


if __name__ == "__main__":
    main()
