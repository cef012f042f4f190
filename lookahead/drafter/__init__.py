"""Choosing what to draft: a measured verify-cost curve and the evidence from the index.

A draft of k tokens is checked in one decode of k + 1 tokens ([last token] + draft), which
costs t(k + 1) milliseconds. If the i-th draft token is accepted with probability c_i (given
the earlier ones were), the pass emits on average

    E(k) = 1 + sum_{i=1..k} prod_{j<=i} c_j      tokens      (the 1 is the corrected/bonus token)

so the rate is E(k) / t(k + 1) tokens per ms, against 1 / t(1) for a plain decode. The
drafter picks the k (0 = no draft) with the best rate. On a CPU, where t(n) grows almost
linearly, that means drafting only when acceptance is likely; on a flat curve (GPU, larger
model) it drafts long.

With a backend that can verify several branches in one decode (llama.cpp sequence ids,
`tree_width` > 1), the draft may be a tree: nodes are added best-first by the probability of
reaching them, and the size (and width) that maximises E / t(n + 1) is kept, so a tree is
proposed only where the occurrences disagree and a wider batch pays for itself.

c_i comes from two pieces of evidence:
* a per-token acceptance estimate for the match's kind (context, reference, or a rejoin: see
  rejoin.py) and length, a Beta posterior that starts at a prior measured by replay (see
  priors.py) and is updated from the first step of every request: by the verified drafts and,
  for free, by comparing every step's candidate with the tokens the target then emitted,
  drafted or not;
* the agreement of the occurrences: when several earlier occurrences of the suffix continue
  differently, the branch followed carries count(branch) / count(parent) of them.

One module per job:
    cost.py        CostModel: the verify-cost curve t(n), learned from timed decodes
    priors.py      candidate kinds, match-length buckets, the prior acceptance tables
    acceptance.py  AcceptanceModel: the per-request posteriors
    draft.py       Draft, EMPTY_DRAFT, Candidate: what is proposed and what it is read from
    follow.py      the majority continuation of a match's occurrences
    rejoin.py      rejoining a source after an edit point, and learned substitutions
    tree.py        tree drafts over disagreeing occurrences
    policy.py      best_length and the Drafter that puts them together

This package exports what callers use. The prior tables and rejoin.py's thresholds are read
at call time from their own modules, so a patch (a test's) goes there:
`lookahead.drafter.priors._PRIOR_MEAN`, `lookahead.drafter.rejoin.MAX_RULES`. They are not
exported here, so that patching them on the package fails instead of silently missing.
"""
from .acceptance import AcceptanceModel
from .cost import CURVE_TOLERANCE, SCALE_TOLERANCE, CostModel
from .draft import EMPTY_DRAFT, Candidate, Draft
from .policy import Drafter, best_length
from .priors import CONTEXT_KIND, KIND_NAMES, N_KINDS, REFERENCE_KIND, REJOIN_KIND

__all__ = [
    "AcceptanceModel", "CURVE_TOLERANCE", "SCALE_TOLERANCE", "CostModel",
    "EMPTY_DRAFT", "Candidate", "Draft", "Drafter", "best_length",
    "CONTEXT_KIND", "KIND_NAMES", "N_KINDS", "REFERENCE_KIND", "REJOIN_KIND",
]
