"""Offline simulator: replay recorded outputs through the index and drafter, without a model.

With temperature 0 the target's choice at every position is fixed by the recorded output,
so a draft's fate is known without running the model: it is accepted up to the first token
that differs from the recording. (A recorded sample at t > 0 decides acceptance the same way
under the point-mass rule: a draft token is accepted exactly when the target's sample equals
it.) Replaying with a verify-cost curve t(n) gives the passes and the time a drafting policy
would take, and its speedup over one decode per token, in milliseconds of simulated time.

    python -m lookahead.simulate TRACES.json [--curve 1:8.8,2:22.9,...] [--temperature T] [-v]
    python -m lookahead.simulate priors TRACES.json      # the drafter's prior tables, refitted
    python -m lookahead.simulate steps TRACES.json --id ID [--curve ...]  # one trace, pass by pass

TRACES.json: [{"id", "category", "temperature", "max_tokens", "prompt": [ids], "output": [ids],
"references": [[ids], ...]}, ...], written by samples/examples/record_traces.py.

The report gives, per category: the geometric-mean decode speedup, the worst request, an
end-to-end estimate that adds the prompt's prefill (costed at t(64) / 64 per token, or at
`--prefill` ms per token) to both sides, and an oracle that drafts, at every step, exactly the
tokens of the drafter's own candidate that the target will accept (when that pays) -- the
ceiling of a length policy -- with its decode and end-to-end speedups. The oracle's end to end
is what no drafting policy can pass while the prompt's prefill costs what it does.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .drafter import KIND_NAMES, N_KINDS, CostModel, Draft, Drafter
from .drafter import priors  # its tables read through the module, so that a patched one reaches here
from .index import SuffixIndex
from .sequences import agreeing_prefix

# Verify cost t(n) in ms of one decode of n tokens: the default model (Qwen2.5-Coder-1.5B-Instruct
# Q4_K_M) with 2 threads on 2 AMD EPYC cores with AVX-512 VNNI, exact mode, as `lookahead bench`
# held it at the end of its run of all 33 workloads on 2026-12-07 (verify_cost_ms in its
# --json), with scripts/setup.sh's build at fb349f7. Other machines, models and builds have
# other curves (SmolLM2-135M Q4_1 on the same VM: 1:7.6,2:11.0,4:14.4,8:25.7,16:42.2,32:65.7,
# 64:111.0): give the simulator yours with `--curve`, in the same form.
DEFAULT_CURVE = ((1, 29.3), (2, 30.6), (4, 34.1), (8, 63.4), (16, 118.3), (32, 221.2), (64, 432.3))


@dataclass
class Replay:
    tokens: int
    passes: int
    drafted: int
    accepted: int
    time_ms: float
    plain_ms: float
    prefill_ms: float = 0.0  # the prompt's prefill, the same for both (for end-to-end figures)

    @property
    def speedup(self) -> float:
        """Decode time of one token per pass over the policy's decode time."""
        return self.plain_ms / self.time_ms if self.time_ms else 1.0

    @property
    def end_to_end(self) -> float:
        total = self.time_ms + self.prefill_ms
        return (self.plain_ms + self.prefill_ms) / total if total else 1.0


@dataclass(frozen=True)
class Step:
    """One pass of a replay."""

    position: int  # output tokens emitted before it
    drafted: int
    accepted: int
    # the candidate's match length and kind (an index into KIND_NAMES): for the drafter's passes
    # those of what it drafted (0 and -1 where it drafted nothing), for the oracle's of its
    # candidate (0 and -1 where there was none)
    match_length: int
    kind: int
    ms: float  # the pass's cost, t(drafted + 1)


def pinned_cost(points: Sequence[tuple[int, float]] = DEFAULT_CURVE, max_batch: int = 512,
                padding: tuple[int, int] | None = None) -> CostModel:
    """A cost model that holds `points` ((n, ms), ...) and learns nothing more; `padding` as
    in CostModel (a point inside a padded class stands for the class)."""
    cost = CostModel(max_batch=max_batch, padding=padding)
    for n_tokens, ms in points:
        cost.observe(n_tokens, ms)
    cost.learning = False
    return cost


def _new_index(prompt: Sequence[int], references: Sequence[Sequence[int]]) -> SuffixIndex:
    index = SuffixIndex()
    for ref in references:
        index.add_reference(ref)
    index.extend(prompt)
    index.begin_output()
    return index


def replay(prompt: Sequence[int], output: Sequence[int], drafter: Drafter, cost_ms: Callable[[int], float],
           references: Sequence[Sequence[int]] = (), max_tokens: int | None = None,
           steps: list[Step] | None = None) -> Replay:
    """Replay `output` (the target's tokens after `prompt`) with `drafter`; cost_ms(n) = t(n).

    `max_tokens`: the request's cap, which bounds drafts as in the engine (a draft may run past
    the end of an output that stopped at EOS, and fail there). None: the output's own length,
    which tells the drafter where the output ends (optimistic for short answers). `steps`: a
    list that gets every pass appended.
    """
    cap = len(output) if max_tokens is None else max(int(max_tokens), len(output))
    index = _new_index(prompt, references)
    drafter.reset()
    pos = passes = drafted = accepted = 0
    time_ms = 0.0
    n = len(output)
    while pos < n:
        draft = drafter.propose(index, cap - pos - 1)
        k = len(draft)
        path = _walk(draft, output[pos : pos + k])
        a = len(path)
        drafter.record(draft, a, path)
        if steps is not None:
            steps.append(Step(pos, k, a, draft.match_length if k else 0, draft.kind if k else -1, cost_ms(k + 1)))
        index.extend(output[pos : pos + a + 1])
        pos += a + 1
        passes += 1
        drafted += k
        accepted += a
        time_ms += cost_ms(k + 1)
    return Replay(n, passes, drafted, accepted, time_ms, n * cost_ms(1), _prefill_ms(prompt, cost_ms))


def replay_oracle(prompt: Sequence[int], output: Sequence[int], drafter: Drafter, cost_ms: Callable[[int], float],
                  references: Sequence[Sequence[int]] = (), max_tokens: int | None = None,
                  steps: list[Step] | None = None) -> Replay:
    """The best a length policy can do with `drafter`'s candidates: knowing the output, draft
    at every step as much of the candidate's accepted prefix as pays best ((k + 1) / t(k + 1)
    against 1 / t(1)), or nothing. `steps`: as for `replay` (the candidate's length and kind
    are given for the passes that draft nothing too)."""
    cap = len(output) if max_tokens is None else max(int(max_tokens), len(output))
    index = _new_index(prompt, references)
    drafter.reset()
    pos = passes = drafted = accepted = 0
    time_ms = 0.0
    n = len(output)
    while pos < n:
        cand = drafter.candidate(index, cap - pos - 1)
        a = 0
        if cand is not None:
            a = len(_walk(Draft(cand.tokens, cand.match_length, False, 1.0), output[pos : pos + len(cand.tokens)]))
        rates = [(j + 1) / cost_ms(j + 1) for j in range(a + 1)]
        k = int(np.argmax(rates))
        if rates[k] < drafter.min_gain * rates[0]:
            k = 0
        drafter.note_drafted(k)
        if steps is not None:
            steps.append(Step(pos, k, k, cand.match_length if cand is not None else 0,
                              cand.kind if cand is not None else -1, cost_ms(k + 1)))
        index.extend(output[pos : pos + k + 1])
        pos += k + 1
        passes += 1
        drafted += k
        accepted += k
        time_ms += cost_ms(k + 1)
    return Replay(n, passes, drafted, accepted, time_ms, n * cost_ms(1), _prefill_ms(prompt, cost_ms))


def _prefill_ms(prompt: Sequence[int], cost_ms: Callable[[int], float]) -> float:
    return len(prompt) * cost_ms(64) / 64


def _walk(draft: Draft, truth: Sequence[int]) -> list[int]:
    """The draft nodes a target accepts when it emits `truth` (chain or tree)."""
    if draft.parents is None:
        return list(range(agreeing_prefix(draft.tokens, truth)))
    path: list[int] = []
    node = -1
    for token in truth:
        node = next((j for j, p in enumerate(draft.parents) if p == node and draft.tokens[j] == token), None)
        if node is None:
            break
        path.append(node)
    return path


# ---- the prior tables -----------------------------------------------------------------------
def acceptance_counts(traces: Sequence[dict], drafter_factory: Callable[[], Drafter]) -> np.ndarray:
    """Per (candidate kind, match-length bucket): [accepted, rejected] candidate tokens.

    At every position of every output, the drafter's candidate (what it would draft on a free
    curve) is compared with the tokens the target emitted next: each agreeing token
    counts as accepted at the match length it would have had, the first disagreeing one as
    rejected, the rest not at all -- the evidence a draft of the whole chain would give. This
    does not depend on any length policy, so the table it gives can serve as that policy's
    prior.
    """
    counts = np.zeros((N_KINDS, len(priors._BUCKET_UPPER), 2))
    for t in traces:
        index = _new_index(t["prompt"], t.get("references", ()))
        output = t["output"]
        drafter = drafter_factory()
        for pos in range(len(output)):
            cand = drafter.candidate(index, len(output) - pos)
            if cand is not None:
                truth = output[pos : pos + len(cand.tokens)]
                a = agreeing_prefix(cand.tokens, truth)
                for i in range(a):
                    counts[cand.kind, priors._bucket(cand.match_length + i), 0] += 1
                if a < len(truth):
                    counts[cand.kind, priors._bucket(cand.match_length + a), 1] += 1
            index.extend(output[pos : pos + 1])
    return counts


def fit_priors(traces: Sequence[dict], drafter_factory: Callable[[], Drafter], floor: float = 0.02,
               shrink: float = 30.0) -> np.ndarray:
    """Acceptance rate per (kind, bucket): each cell's counts plus `shrink` tokens' worth of
    the same bucket pooled over kinds (so thin cells follow the pool), made
    non-decreasing in match length (a longer match is never worse evidence) and rounded to
    the two decimals the drafter ships."""
    counts = acceptance_counts(traces, drafter_factory)
    pooled = counts.sum(axis=0)  # [buckets, 2]
    pooled_rate = (pooled[:, 0] + 1) / (pooled.sum(axis=1) + 2)
    acc, rej = counts[..., 0], counts[..., 1]
    rates = (acc + shrink * pooled_rate) / (acc + rej + shrink)
    rates = np.maximum.accumulate(rates, axis=-1)
    return np.clip(np.round(rates, 3), floor, 0.995)


# ---- command line ---------------------------------------------------------------------------
def _parse_curve(text: str) -> tuple[tuple[int, float], ...]:
    try:
        points = tuple((int(n), float(ms)) for n, ms in (item.split(":") for item in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N:MS,N:MS,... (e.g. 1:8.8,2:22.9), got {text!r}") from None
    if not points:
        raise argparse.ArgumentTypeError(f"expected at least one N:MS point, got {text!r}")
    return points


def _parse_padding(text: str) -> tuple[int, int]:
    try:
        padding = tuple(int(x) for x in text.split(":"))
        CostModel(max_batch=1, padding=padding)  # its own check of the values
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected FROM:MULTIPLE (e.g. 12:16), got {text!r}: {e}") from None
    return padding


def _parse_prefill(text: str) -> float:
    try:
        ms = float(text)
    except ValueError:
        ms = float("nan")
    if not (math.isfinite(ms) and ms >= 0):
        raise argparse.ArgumentTypeError(f"expected ms per prompt token, a number >= 0, got {text!r}")
    return ms


def _geomean(values: Sequence[float]) -> float:
    return float(math.exp(np.mean(np.log(values)))) if values else float("nan")


def with_stops(drafter: Drafter, trace: dict) -> Drafter:
    """The drafter, stopping its drafts at the trace's end-of-generation tokens (its "eog"
    list, as the model's vocabulary gives them), and reading sentence ends from the trace's
    token texts (its "pieces": {token id: text}), as the engine's drafter does."""
    eog = frozenset(int(t) for t in trace.get("eog", ()))
    if eog:
        drafter.is_stop = eog.__contains__
    pieces = trace.get("pieces")
    if pieces:
        texts = {int(t): text.encode("utf-8") for t, text in pieces.items()}
        drafter.piece = lambda token: texts.get(token, b"")
    return drafter


def replay_trace(trace: dict, cost: CostModel, make_drafter: Callable[[bool], Drafter],
                 policy_steps: list[Step] | None = None,
                 oracle_steps: list[Step] | None = None) -> tuple[Replay, Replay]:
    """One trace replayed, greedy or sampled as recorded, with a fresh drafter each time
    (`make_drafter(sampled)`): the policy's replay, then the oracle's; `*_steps` as `replay`'s."""
    sampled = float(trace.get("temperature", 0.0)) > 0
    args = (trace["prompt"], trace["output"])
    refs, cap = trace.get("references", ()), trace.get("max_tokens")
    r = replay(*args, with_stops(make_drafter(sampled), trace), cost.cost_ms, refs, cap, policy_steps)
    o = replay_oracle(*args, with_stops(make_drafter(sampled), trace), cost.cost_ms, refs, cap, oracle_steps)
    return r, o


def report(traces: Sequence[dict], cost: CostModel, make_drafter: Callable[[bool], Drafter],
           verbose: bool = False, prefill_ms: float | None = None) -> dict[str, dict[str, float]]:
    """Replay every trace with the policy and the oracle; per category and 'all':
    decode speedup (geomean), worst request, end-to-end estimate, the oracle's decode and end
    to end, tokens per pass. `prefill_ms`: the prompt's prefill in ms per token (None: t(64)/64)."""
    rows: dict[str, list[tuple[Replay, Replay]]] = {}
    for t in traces:
        r, o = replay_trace(t, cost, make_drafter)
        if prefill_ms is not None:
            r, o = (dataclasses.replace(x, prefill_ms=len(t["prompt"]) * prefill_ms) for x in (r, o))
        if verbose:
            print(f"{t.get('id', '?'):32s} {t['category']:12s} x{r.speedup:.2f} (oracle x{o.speedup:.2f}) "
                  f"e2e x{r.end_to_end:.2f} (oracle x{o.end_to_end:.2f}) passes {r.passes} "
                  f"tokens/pass {r.tokens / r.passes:.2f} "
                  f"acc {r.accepted}/{r.drafted}")
        rows.setdefault(t["category"], []).append((r, o))
    rows["all"] = [x for v in list(rows.values()) for x in v]
    out = {}
    for cat, pairs in rows.items():
        out[cat] = {
            "n": len(pairs),
            "speedup": _geomean([r.speedup for r, _ in pairs]),
            "worst": min(r.speedup for r, _ in pairs),
            "end_to_end": _geomean([r.end_to_end for r, _ in pairs]),
            "worst_end_to_end": min(r.end_to_end for r, _ in pairs),
            "oracle": _geomean([o.speedup for _, o in pairs]),
            "oracle_end_to_end": _geomean([o.end_to_end for _, o in pairs]),
            "tokens_per_pass": sum(r.tokens for r, _ in pairs) / sum(r.passes for r, _ in pairs),
            "acceptance": (sum(r.accepted for r, _ in pairs) / max(1, sum(r.drafted for r, _ in pairs))),
        }
    return out


def format_report(summary: dict[str, dict[str, float]]) -> str:
    lines = [f"{'category':12s} {'n':>3s} {'decode':>7s} {'worst':>6s} {'e2e':>6s} {'worst':>6s} "
             f"{'oracle':>7s} {'its e2e':>7s} {'tok/pass':>8s} {'accept':>6s}"]
    for cat, s in summary.items():
        lines.append(f"{cat:12s} {s['n']:3d} {s['speedup']:7.3f} {s['worst']:6.3f} {s['end_to_end']:6.3f} "
                     f"{s['worst_end_to_end']:6.3f} {s['oracle']:7.3f} {s['oracle_end_to_end']:7.3f} "
                     f"{s['tokens_per_pass']:8.2f} {s['acceptance']:6.1%}")
    return "\n".join(lines)


def trace_steps(trace: dict, cost: CostModel) -> tuple[list[Step], list[Step]]:
    """One trace's passes, greedy or sampled as recorded: the drafter's, then the oracle's."""
    policy: list[Step] = []
    oracle: list[Step] = []
    replay_trace(trace, cost, lambda sampled: Drafter(cost, sampled=sampled), policy, oracle)
    return policy, oracle


def format_steps(name: str, steps: Sequence[Step]) -> str:
    """One line per pass that drafts, one per run of passes that do not; the total time first."""
    lines = [f"{name}: {len(steps)} passes, {sum(s.ms for s in steps):.0f} ms"]
    for drafts, run in itertools.groupby(steps, key=lambda s: s.drafted > 0):
        run = list(run)
        if drafts:
            for s in run:
                kind = KIND_NAMES[s.kind] if 0 <= s.kind < len(KIND_NAMES) else "-"
                lines.append(f"  @{s.position:<5d} drafted {s.drafted:3d} accepted {s.accepted:3d}  "
                             f"{kind} match {s.match_length}  {s.ms:.1f} ms")
        else:
            lines.append(f"  @{run[0].position:<5d} {len(run)} pass{'es' if len(run) > 1 else ''} without a draft  "
                         f"{sum(s.ms for s in run):.1f} ms")
    return "\n".join(lines)


def format_priors(name: str, rates: np.ndarray) -> str:
    """The table as lookahead/drafter/priors.py spells it: one row per source kind."""
    rows = [f"    ({', '.join(f'{x:.3f}' for x in row)}),  # {kind}" for kind, row in zip(KIND_NAMES, rates)]
    return "\n".join([f"{name} = (", *rows, ")"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lookahead.simulate", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("replay", "priors", "steps"), default="replay")
    parser.add_argument("traces")
    parser.add_argument("--curve", type=_parse_curve, default=DEFAULT_CURVE,
                        help="verify cost t(n) in ms as N:MS,N:MS,... (default: %(default)s)")
    parser.add_argument("--padding", type=_parse_padding, default=None,
                        help="FROM:MULTIPLE: decodes of FROM or more tokens cost as one padded to a multiple of "
                             "MULTIPLE (the set-up's exact K-quant kernel: 12:16)")
    parser.add_argument("--prefill", type=_parse_prefill, default=None, metavar="MS",
                        help="the prompt's prefill in ms per token, for the end-to-end figures "
                             "(default: t(64)/64 of the curve)")
    parser.add_argument("--temperature", type=float, action="append",
                        help="only traces recorded at this temperature (repeatable)")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per trace")
    parser.add_argument("--id", help="steps: the trace to show pass by pass, the drafter's passes then the oracle's")
    args = parser.parse_args(argv)
    traces = json.load(open(args.traces))
    if args.temperature:
        traces = [t for t in traces if float(t.get("temperature", 0.0)) in args.temperature]
    cost = pinned_cost(args.curve, padding=args.padding)
    if args.command == "steps":
        if args.id is None:
            parser.error("steps: give the trace to show with --id")
        chosen = [t for t in traces if t.get("id") == args.id]
        if not chosen:
            parser.error(f"--id {args.id!r}: no trace of that id in {args.traces}")
        for trace in chosen:
            policy, oracle = trace_steps(trace, cost)
            print(f"{args.id} ({trace['category']}, temperature {trace.get('temperature', 0.0)}, "
                  f"{len(trace['output'])} tokens)")
            print(format_steps("drafter", policy))
            print(format_steps("oracle", oracle))
        return
    if args.command == "priors":
        for sampled in (False, True):
            chosen = [t for t in traces if (float(t.get("temperature", 0.0)) > 0) == sampled]
            if chosen:
                print(format_priors("_PRIOR_MEAN_SAMPLED" if sampled else "_PRIOR_MEAN",
                                    fit_priors(chosen, lambda: Drafter(cost, sampled=sampled))))
        return
    for temperature in sorted({float(t.get("temperature", 0.0)) for t in traces}):
        chosen = [t for t in traces if float(t.get("temperature", 0.0)) == temperature]
        print(f"temperature {temperature}: {len(chosen)} traces, curve {dict(args.curve)}"
              + (f", padding {args.padding[0]}:{args.padding[1]}" if args.padding else ""))
        print(format_report(report(chosen, cost, lambda sampled: Drafter(cost, sampled=sampled), args.verbose,
                                   args.prefill)))


if __name__ == "__main__":  # pragma: no cover
    main()
