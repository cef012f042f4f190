"""A Target without a model: a seeded Markov chain over a small vocabulary, with a checked KV cache.

The logits after a token depend on that token only, so plain greedy decoding cycles through
a few tokens and the suffix index finds long matches: drafts happen, get accepted and get
rejected. The fake keeps the tokens its "KV cache" holds and checks what a real backend
would refuse (overflowing the context, a batch too large, a tree wider than its sequences),
so the engine's rollbacks, early closes and tree steps can be checked exactly.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

EOS = 1


class FakeTarget:
    def __init__(self, n_vocab: int = 24, n_ctx: int = 256, max_batch: int = 32, tree_width: int = 1,
                 seed: int = 0, sharp: float = 4.0):
        rng = np.random.default_rng(seed)
        self.n_vocab, self.n_ctx, self.max_batch, self.tree_width = n_vocab, n_ctx, max_batch, tree_width
        self.table = sharp * rng.standard_normal((n_vocab, n_vocab))  # [previous token, next token]
        self.table[:, EOS] -= 100.0  # never end unless a test asks for it
        self.kv: list[int] = []
        self.decodes: list[int] = []  # size of every decode (the prefill's chunks included)
        self.ended_with: list[int] | None = None
        self._tree: tuple[int, list[int], list[int]] | None = None
        self.penalty_last_n = 64
        self.model_name = "fake"

    # ---- text ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool, special: bool = True) -> list[int]:
        return ([2] if add_bos else []) + [3 + (ord(c) % (self.n_vocab - 3)) for c in text]

    def completion_prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        return self.tokenize(prompt, add_bos=True) if isinstance(prompt, str) else [int(t) for t in prompt]

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def is_eog(self, token: int) -> bool:
        return token == EOS

    # ---- decoding -----------------------------------------------------------------------
    def logits(self, token: int) -> np.ndarray:
        return self.table[token].astype(np.float32)

    def begin(self, prompt: Sequence[int]) -> tuple[int, int]:
        assert self._tree is None, "a tree step was left open"
        keep = 0
        for a, b in zip(self.kv, prompt[:-1]):
            if a != b:
                break
            keep += 1
        self.kv = self.kv[:keep]
        n_chunks = -(-(len(prompt) - keep) // self.max_batch)
        last_chunk_start = keep + (n_chunks - 1) * self.max_batch
        for start in range(keep, last_chunk_start, self.max_batch):
            self._append(prompt[start: start + self.max_batch])
        return keep, last_chunk_start

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        assert 1 <= n_logits <= len(tokens)
        self._append(tokens)
        return np.stack([self.logits(t) for t in tokens[len(tokens) - n_logits:]])

    def _append(self, tokens: Sequence[int]) -> None:
        assert 1 <= len(tokens) <= self.max_batch, f"batch of {len(tokens)} > {self.max_batch}"
        assert len(self.kv) + len(tokens) <= self.n_ctx, "context overflow"
        self.decodes.append(len(tokens))
        self.kv.extend(int(t) for t in tokens)

    def rollback(self, n_keep: int) -> None:
        assert 0 <= n_keep <= len(self.kv)
        del self.kv[n_keep:]

    def end(self, kv_tokens: Sequence[int]) -> None:
        if self._tree is not None:  # interrupted between decode_tree and keep_path
            self.kv = self.kv[: self._tree[0]]
            self._tree = None
        if len(self.kv) != len(kv_tokens):
            self.rollback(min(len(self.kv), len(kv_tokens)))
        self.ended_with = list(kv_tokens)

    def calibrate(self, sizes: Sequence[int]) -> dict[int, float]:
        return {n: 10.0 + 0.01 * n for n in sizes}

    # ---- trees --------------------------------------------------------------------------
    def decode_tree(self, root: int, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        leaves = len(set(range(len(tokens))) - set(parents))
        assert leaves <= self.tree_width, f"{leaves} branches > {self.tree_width} sequences"
        assert len(self.kv) + len(tokens) + 1 <= self.n_ctx
        self.decodes.append(len(tokens) + 1)
        self._tree = (len(self.kv), list(tokens), list(parents))
        self.kv.append(int(root))
        return np.stack([self.logits(root), *(self.logits(t) for t in tokens)])

    def keep_path(self, path: Sequence[int]) -> None:
        base, tokens, parents = self._tree
        for a, b in zip(path, path[1:]):
            assert parents[b] == a, "the path does not follow the tree"
        self._tree = None
        self.kv = self.kv[: base + 1] + [tokens[j] for j in path]

    # ---- for the wrapper ----------------------------------------------------------------------
    def chat_completion(self, complete: Callable[..., Any], messages: list[dict], **kwargs: Any):
        prompt = "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"
        return complete(prompt, **kwargs)


def plain_greedy(target: FakeTarget, prompt: Sequence[int], n: int) -> list[int]:
    """What greedy decoding gives, straight from the table."""
    out, last = [], prompt[-1]
    for _ in range(n):
        last = int(np.argmax(target.table[last]))
        out.append(last)
    return out
