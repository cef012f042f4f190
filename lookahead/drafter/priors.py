"""What the drafter believes before a request's first step: the kinds of candidate, the
match-length buckets, and the prior per-token acceptance of each (kind, bucket).

The tables are private and read through this module at call time (`priors._PRIOR_MEAN`), so
that a test can install its own with `monkeypatch.setattr(lookahead.drafter.priors, ...)`.
"""
from __future__ import annotations

CONTEXT_KIND = 0  # the candidate follows an occurrence in the running context (prompt + output)
REFERENCE_KIND = 1  # ... in a registered reference
REJOIN_KIND = 2  # ... just after the place where a copy of a source was left (either source)
N_KINDS = 3
KIND_NAMES = ("context", "reference", "rejoin")

# Match-length buckets (upper bounds, inclusive).
_BUCKET_UPPER = (1, 2, 3, 5, 7, 11, 15, 23, 31, 47, 63, 1 << 30)
# The prior per-token acceptance by [source kind][bucket]: the probability that a
# candidate token is the target's next token, given the earlier ones were, when the matched
# suffix (grown by the accepted tokens) has that length. Measured at every output position of
# recorded plain outputs of samples/workloads.jsonl and samples/examples/short_rag.jsonl
# (no workload registers references, so the reference rows are the pooled rates), greedy and
# sampled at 0.7 (a replayed sample decides acceptance exactly as the point-mass rule does).
# Reproduce with (tests/test_simulate.py checks that they match):
#     .venv/bin/python samples/examples/record_traces.py      # -> samples/examples/traces.json
#     .venv/bin/python -m lookahead.simulate priors samples/examples/traces.json
# The posterior of each request moves away from them with every step.
_PRIOR_MEAN = (
    (0.210, 0.503, 0.647, 0.802, 0.820, 0.868, 0.926, 0.954, 0.954, 0.993, 0.993, 0.995),  # context
    (0.224, 0.530, 0.678, 0.822, 0.836, 0.894, 0.928, 0.953, 0.953, 0.993, 0.993, 0.995),  # reference
    (0.276, 0.615, 0.758, 0.864, 0.867, 0.938, 0.938, 0.951, 0.951, 0.991, 0.995, 0.995),  # rejoin
)
_PRIOR_MEAN_SAMPLED = (
    (0.210, 0.477, 0.539, 0.710, 0.773, 0.809, 0.885, 0.933, 0.933, 0.975, 0.984, 0.995),  # context
    (0.220, 0.505, 0.594, 0.750, 0.818, 0.818, 0.898, 0.924, 0.924, 0.972, 0.985, 0.995),  # reference
    (0.253, 0.597, 0.751, 0.833, 0.890, 0.890, 0.918, 0.918, 0.934, 0.954, 0.995, 0.995),  # rejoin
)
_PRIOR_STRENGTH = 10.0


def _bucket(match_length: int) -> int:
    for b, upper in enumerate(_BUCKET_UPPER):
        if match_length <= upper:
            return b
    return len(_BUCKET_UPPER) - 1


# Past the end of a sentence a copy often stops: a short answer quotes a sentence of a passage
# and ends where the passage goes on, while a whole-file edit copies on. So a candidate token
# that starts a new sentence (policy.sentence_break) is accepted with at most the request's
# own rate there, a Beta posterior from this prior with a weak strength, so that an edit that
# keeps copying through sentence ends lifts it within a few of them. Chosen by replaying the
# default model's traces (docs/simulator.md), not fitted: greedy 0.6 lifted the replay over
# all 41 by 2.8% and its worst request from 0.80x to 0.93x; sampled, 0.9 (0.5-0.7 lost on the
# bug fixes there).
_PRIOR_BOUNDARY = 0.6
_PRIOR_BOUNDARY_SAMPLED = 0.9
_BOUNDARY_STRENGTH = 1.0
