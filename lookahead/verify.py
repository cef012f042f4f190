"""Checking a draft against the target's logits, so that the output is distributed exactly as
the plain path's (see sampling.py for the target distribution). Pure: no model calls.

Point-mass drafts (prompt lookup, trees of lookups): at each position draw a token from the
target distribution; if the draft has it, keep going, else emit the drawn token and stop. Every
emitted token is then a plain-path draw, so the output distribution is the plain one, for any
sampling settings, greedy included (the draw is an argmax there).

Drafts from a distribution q (a draft model): the speculative-sampling rule of Leviathan et al.
and Chen et al. (2023): accept x if target(x) >= q(x), else with probability target(x) / q(x);
on rejection emit a draw from normalise(max(0, target - q)) and stop.

Rows are looked at lazily: only the rows on the accepted path, plus the one that decides the
emitted token, are read; nothing after the first mismatch is touched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .sampling import SamplingParams, draw_token, recent_window, sample_token, target_probs


@dataclass
class Verdict:
    accepted: int  # draft tokens accepted (for a tree: depth of the accepted path)
    tokens: list[int]  # to emit: the accepted draft tokens, then the corrected-or-bonus token
    path: list[int]  # node indices accepted, in order (linear draft: list(range(accepted)))


def verify_draft(logits_rows, draft: Sequence[int], params: SamplingParams,
                 rng: np.random.Generator, generated: Sequence[int] = ()) -> Verdict:
    """Point-mass draft. logits_rows [len(draft) + 1, n_vocab]: row i predicts draft[i], the
    last row the bonus token. generated: this request's tokens so far (penalty window)."""
    chain_parents = list(range(-1, len(draft) - 1))  # a linear draft is a tree without branches
    return verify_tree(logits_rows, draft, chain_parents, params, rng, generated)


def verify_tree(logits_rows, tree_tokens: Sequence[int], tree_parents: Sequence[int],
                params: SamplingParams, rng: np.random.Generator,
                generated: Sequence[int] = ()) -> Verdict:
    """A tree of point-mass branches. Nodes 0..n-1 in topological order, tree_parents[j] = -1
    for children of the root. logits_rows [n + 1, n_vocab]: row 0 at the root, row j + 1 after
    node j. Walks down while the target's draw is a child; emits the first draw that is not."""
    children = _children(tree_tokens, tree_parents)  # [n + 1] dicts token -> node, by row
    _check_rows(logits_rows, len(tree_tokens) + 1, "len(tree_tokens) + 1")
    window = list(recent_window(generated, params))
    path: list[int] = []
    tokens: list[int] = []
    node = -1  # the root
    while True:
        recent = recent_window(window + tokens, params)
        token = sample_token(logits_rows[node + 1], params, rng, recent)
        tokens.append(token)
        node = children[node + 1].get(token, None)
        if node is None:
            return Verdict(accepted=len(path), tokens=tokens, path=path)
        path.append(node)


def verify_draft_with_probs(logits_rows, draft: Sequence[int], draft_probs, params: SamplingParams,
                            rng: np.random.Generator, generated: Sequence[int] = ()) -> Verdict:
    """A draft sampled from q. draft_probs [len(draft), n_vocab]: dense rows, draft_probs[i] is
    the q that draft[i] was drawn from (read lazily, like logits_rows)."""
    _check_rows(logits_rows, len(draft) + 1, "len(draft) + 1")
    if len(draft_probs) != len(draft):
        raise ValueError(
            f"draft_probs must have len(draft) = {len(draft)} rows, got {len(draft_probs)}")
    window = list(recent_window(generated, params))
    tokens: list[int] = []
    for i, drafted in enumerate(draft):
        drafted = int(drafted)
        row = np.asarray(logits_rows[i])  # [n_vocab]
        q_row = np.asarray(draft_probs[i], dtype=np.float64)  # [n_vocab]
        if q_row.shape != row.shape:
            raise ValueError(
                f"draft_probs[{i}] must have shape {row.shape} like the logits, got {q_row.shape}")
        token_ids, probs = target_probs(row, params, recent_window(window + tokens, params))
        target = np.zeros(row.size)  # [n_vocab]
        target[token_ids] = probs
        if _accepts(target[drafted], q_row[drafted], rng):
            tokens.append(drafted)
            continue
        residual = residual_probs(target, q_row)
        tokens.append(draw_token(np.arange(residual.size), residual, rng))
        return Verdict(accepted=i, tokens=tokens, path=list(range(i)))
    recent = recent_window(window + tokens, params)
    bonus_token = sample_token(logits_rows[len(draft)], params, rng, recent)
    return Verdict(accepted=len(draft), tokens=tokens + [bonus_token], path=list(range(len(draft))))


def residual_probs(target: np.ndarray, draft_row: np.ndarray) -> np.ndarray:
    """normalise(max(0, target - draft_row)), both [n_vocab]; the target itself if that is all 0
    (target == draft_row, where a rejection can only come from rounding)."""
    residual = np.maximum(target - draft_row, 0.0)
    total = residual.sum()
    return residual / total if total > 0 else target


def _accepts(target_prob: float, draft_prob: float, rng: np.random.Generator) -> bool:
    if target_prob >= draft_prob:
        return True
    return rng.random() * draft_prob < target_prob


def _check_rows(logits_rows, expected: int, what: str) -> None:
    if len(logits_rows) != expected:
        raise ValueError(f"logits_rows must have {what} = {expected} rows, got {len(logits_rows)}")


def _children(tree_tokens: Sequence[int], tree_parents: Sequence[int]) -> list[dict[int, int]]:
    """children[j + 1] maps token -> child node of node j (children[0]: of the root)."""
    if len(tree_parents) != len(tree_tokens):
        raise ValueError(
            f"tree_parents must have len(tree_tokens) = {len(tree_tokens)} entries, "
            f"got {len(tree_parents)}")
    children: list[dict[int, int]] = [{} for _ in range(len(tree_tokens) + 1)]
    for node, (token, parent) in enumerate(zip(tree_tokens, tree_parents)):
        if not -1 <= parent < node:
            raise ValueError(f"tree_parents[{node}] must be in [-1, {node}), got {parent}")
        siblings = children[parent + 1]
        if int(token) in siblings:
            raise ValueError(
                f"nodes {siblings[int(token)]} and {node} are siblings with the same token {token}")
        siblings[int(token)] = node
    return children
