"""`LlamaCppTarget`: the engine's Target over a `llama_cpp.Llama`, driving its context through
llama-cpp-python's low-level API (prefill, decode, tree decode, rollback; its one-off work,
preparation and calibration, in `one_off`)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Sequence

import numpy as np

from lookahead.sequences import agreeing_prefix

from .. import exact, health
from .backend import lib
from .chat import chat_completion
from .one_off import OneOffWork
from . import rpc
from .prefix_states import PrefixStates, prompt_cache_off
from .state import Measurements, state_of
from .threads import CONTENDED_BATCH_FACTOR, DecodeThreads

if TYPE_CHECKING:  # pragma: no cover
    import llama_cpp

MAX_TREE_WIDTH = 8  # branches of one tree draft, at most (= sequence ids used)


class LlamaCppTarget(OneOffWork):
    """A `lookahead.engine.Target` over a `llama_cpp.Llama`.

    `threads`: threads for one-token decodes. "auto" (default) measures the Llama's own
    `n_threads` against its `n_threads_batch` once, at a real context position, and keeps the
    faster; "keep" leaves the Llama's setting; an int uses that many. Batched decodes (prefill,
    drafts) always run with the Llama's `n_threads_batch` (see threads.DecodeThreads).
    """

    def __init__(self, llm: "llama_cpp.Llama", max_batch: int | None = None, threads: int | str = "auto"):
        if not (threads in ("auto", "keep") or (isinstance(threads, int) and not isinstance(threads, bool)
                                                and threads >= 1)):
            raise ValueError(f"threads must be 'auto', 'keep' or a positive integer, got {threads!r}")
        llama = lib()
        from ..health import ensure_batched_decodes

        ensure_batched_decodes(llm.model_path)  # a build known to crash here: a clear error instead
        self.llm = llm
        self._lib = llama
        self._context = llm._ctx  # the LlamaContext wrapped; enable_tree_drafts replaces it
        self._ctx = llm._ctx.ctx
        self._memory = llama.llama_get_memory(self._ctx)
        self.n_ctx = int(llm.n_ctx())
        self.n_vocab = int(llm.n_vocab())
        self.max_batch = int(max_batch or llm.n_batch)
        # Tree drafts need several sequences over one shared (unified) KV cache; a Llama made
        # by llama-cpp-python has one sequence unless built with `enable_tree_drafts`.
        unified = bool(getattr(llm.context_params, "kv_unified", False))
        self.tree_width = min(int(llama.llama_n_seq_max(self._ctx)), MAX_TREE_WIDTH) if unified else 1
        self._batch = llama.llama_batch_init(self.max_batch, 0, max(1, self.tree_width))
        self._vocab = llm._model.vocab
        self._pieces: dict[int, bytes] = {}
        self.n_past = 0  # KV entries of sequence 0: the position of the next decode
        self._began = False  # a request got as far as its prefill: `end` then syncs the Llama
        self._tree = None  # (base position, sequence ids per node) between decode_tree and keep_path
        self.measurements = Measurements(llm)  # one-off measurements, kept for later processes
        self._threads = DecodeThreads(llm, self._ctx, threads, self.measurements, llama)
        self._saved_observations = 0  # the cost curve's observation count when last saved
        self._exactness = exact.of_llama(llm)
        # a layer on an RPC server that goes away: an error, never a token from zeroed logits
        self._rpc = rpc.LossWatch() if rpc.registered() else None

    def __del__(self):
        batch = getattr(self, "_batch", None)
        if batch is not None:
            try:
                self._lib.llama_batch_free(batch)
            except Exception:  # interpreter shutdown: the library may be gone
                pass
            self._batch = None

    @property
    def measurement_key(self) -> str:
        return self.measurements.key

    # ---- what the wrapper asks of a backend -------------------------------------------
    @property
    def model_name(self) -> str:
        return str(getattr(self.llm, "model_path", ""))

    @property
    def model_path(self) -> str:
        return str(self.llm.model_path)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.llm.metadata.get("tokenizer.chat_template"))

    def prompt_cache_off(self) -> ContextManager[None]:
        """A block whose requests start from an empty KV cache and neither use nor fill the
        saved prompt prefixes (the whole prefill is paid, for timing)."""
        return prompt_cache_off(self.llm)

    @property
    def batch_exact(self) -> bool:
        """Batched rows equal one-token rows bit for bit (lookahead.adapters.exact)."""
        return self._exactness.exact

    @property
    def batch_exact_reason(self) -> str:
        return self._exactness.reason

    @property
    def batch_padding(self) -> tuple[int, int] | None:
        """How this build pads batches (lookahead.engine.PaddedTarget; adapters.exact)."""
        patches = health.build_patches()
        return exact.batch_padding(self._exactness, self.llm.metadata.get("general.file_type"),
                                   health.system_info().get("AVX512_VNNI") == "1",
                                   packed=exact.packing_on() and health.PACKED_WEIGHTS in patches,
                                   lanes=health.ROWS_IN_LANES in patches)

    @property
    def penalty_last_n(self) -> int:
        """Tokens the repeat/frequency/presence penalties look back on (the Llama's setting)."""
        return int(getattr(self.llm, "last_n_tokens_size", 64))

    def chat_completion(self, complete: Callable[..., Any], messages: list[dict], **kwargs: Any):
        """llama-cpp-python's own create_chat_completion, with `complete` as its completion call."""
        return chat_completion(self.llm, complete, messages, **kwargs)

    def plain_completion(self, **kwargs: Any):
        """The Llama's own create_completion (for arguments the engine does not implement)."""
        if self._rpc is None:
            return self.llm.create_completion(**kwargs)
        try:
            result = self.llm.create_completion(**kwargs)
        except Exception:
            self._rpc.check()  # llama-cpp-python's "llama_decode returned -3": say why
            raise
        if isinstance(result, dict):
            self._rpc.check()
            return result
        return self._rpc_checked(result)

    def _rpc_checked(self, chunks):
        try:
            for chunk in chunks:
                self._rpc.check()  # the chunk's token came from a decode that has synchronised
                yield chunk
        except rpc.RpcServerLost:
            raise
        except Exception:
            self._rpc.check()
            raise

    @property
    def contended(self) -> bool:
        """Another process holds the cores: decodes run with the Llama's own thread count."""
        return self._threads.contended

    @property
    def batch_cost_factor(self) -> float:
        """How much dearer a batch is than the cost curve says: > 1 while contended."""
        return CONTENDED_BATCH_FACTOR if self._threads.contended else 1.0

    @property
    def decode_threads(self) -> int:
        """Threads of one-token decodes right now."""
        return self._threads.current

    # ---- tokens and text ---------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool, special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def completion_prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        """Tokens of a completion prompt, exactly as `Llama.create_completion` makes them."""
        llm = self.llm
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        model = llm._model
        bos = model.token_cls() if model.token_cls() != -1 else llm.token_bos()
        bos_tokens = [bos] if model.add_bos_token() and bos != -1 else []
        sep = model.token_sep()
        eos_tokens = [] if (not model.add_eos_token() and sep == -1) else [sep if sep != -1 else llm.token_eos()]
        body = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True) if prompt else []
        if not prompt:
            return [llm.token_bos()]
        return bos_tokens + body + eos_tokens

    def piece(self, token: int) -> bytes:
        """The bytes of one token, as llama-cpp-python's detokenize gives them (no specials)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self.llm.detokenize([token])
            self._pieces[token] = piece
        return piece

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token))

    # ---- KV cache and decoding ---------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> tuple[int, int]:
        """Prefill the prompt but its last chunk, reusing the longest cached prefix.

        Chunks start at the reused prefix and are `max_batch` long, as in llama-cpp-python's
        `Llama.eval`, so the logits of the prompt's last row come from the same computation.
        Returns (reused entries, prompt tokens in the KV cache).
        """
        llm = self.llm
        if llm._ctx is not self._context:
            raise RuntimeError("the Llama's context was replaced after lookahead wrapped it "
                               "(enable_tree_drafts after wrap?): wrap the Llama again")
        prompt = list(prompt)
        self._threads.begin()  # the Llama's own settings are restored by `end`
        cached = llm._input_ids[: llm.n_tokens].tolist() if llm.n_tokens > 0 else []
        keep = agreeing_prefix(cached, prompt[:-1])  # always decode the last prompt token again
        self._drop_branches()  # of an interrupted tree draft
        states = state_of(llm).prefix_states
        if states is not None:
            # Keep what is about to be overwritten, and take a saved state that shares more of
            # this prompt than the cache does (an editor sending one file back after another).
            if len(cached) - keep >= PrefixStates.MIN_TOKENS:
                states.save(self._ctx, cached)
            restored = states.restore_best(self._ctx, self._memory, prompt[:-1], better_than=keep)
            if restored is not None:
                cached, keep = restored, agreeing_prefix(restored, prompt[:-1])
        # seq -1: every sequence; nothing of another request survives past `keep`.
        if not self._lib.llama_memory_seq_rm(self._memory, -1, keep, -1):
            self._lib.llama_memory_clear(self._memory, True)
            keep = 0
        self._sync_llama(prompt[:keep])
        self.n_past = keep
        self._began = True
        n_chunks = -(-(len(prompt) - keep) // self.max_batch)
        last_chunk_start = keep + (n_chunks - 1) * self.max_batch
        for start in range(keep, last_chunk_start, self.max_batch):
            chunk = prompt[start : start + self.max_batch]
            self._fill(chunk, n_logits=1)
            self._decode()
            self.n_past += len(chunk)
        return keep, last_chunk_start

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        n = len(tokens)
        if self.n_past + n > self.n_ctx:
            raise ValueError(f"decode of {n} tokens at position {self.n_past} overflows the context of {self.n_ctx}")
        self._fill(tokens, n_logits)
        if n == 1 and self._threads.checking:
            self._threads.checked_decode(self._decode)
        else:
            self._decode()
        self.n_past += n
        ptr = self._lib.llama_get_logits(self._ctx)  # waits for the decode's outputs
        if self._rpc is not None:
            self._rpc.check()
        return np.ctypeslib.as_array(ptr, shape=(n_logits, self.n_vocab))  # [n_logits, n_vocab], a view

    def decode_tree(self, root: int, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Decode the root (the newest token) and a tree of draft nodes in one batch.

        Each leaf's path gets a sequence id of its own (the history is shared into it with
        `llama_memory_seq_cp`, which in a unified cache only tags cells), so a node attends
        to the history, the root and its own ancestors only. Row 0 of the result follows
        the root, row j + 1 node j. Call `keep_path` next.
        """
        n = len(tokens)
        depth = [0] * n
        has_child = [False] * n
        for j, p in enumerate(parents):
            if not -1 <= p < j:
                raise ValueError(f"parents[{j}] must be in [-1, {j}), got {p}")
            depth[j] = 1 if p < 0 else depth[p] + 1
            if p >= 0:
                has_child[p] = True
        leaves = [j for j in range(n) if not has_child[j]]
        if len(leaves) > self.tree_width:
            raise ValueError(f"a tree of {len(leaves)} branches exceeds the {self.tree_width} sequences available")
        if self.n_past + n + 1 > self.n_ctx:
            raise ValueError(f"tree of {n} nodes at position {self.n_past} overflows the context of {self.n_ctx}")
        if n + 1 > self.max_batch:
            raise ValueError(f"batch of {n + 1} tokens: must be 1..{self.max_batch}")
        seqs: list[list[int]] = [[] for _ in range(n)]  # sequence ids of each node: its leaves'
        for s, leaf in enumerate(leaves):
            j = leaf
            while j >= 0:
                seqs[j].append(s)
                j = parents[j]
        for s in range(1, len(leaves)):  # the history belongs to every branch
            self._lib.llama_memory_seq_cp(self._memory, 0, s, -1, -1)
        batch = self._batch
        batch.n_tokens = n + 1
        base = self.n_past
        entries = [(root, base, range(len(leaves)))]
        entries += [(tokens[j], base + depth[j], seqs[j]) for j in range(n)]
        for i, (tok, pos, ids) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(ids)
            for k, seq in enumerate(ids):
                batch.seq_id[i][k] = seq
            batch.logits[i] = True
        self._tree = (base, seqs)
        self._decode()
        ptr = self._lib.llama_get_logits(self._ctx)  # waits for the decode's outputs
        if self._rpc is not None:
            self._rpc.check()
        return np.ctypeslib.as_array(ptr, shape=(n + 1, self.n_vocab))

    def keep_path(self, path: Sequence[int]) -> None:
        """After `decode_tree`: keep the root and the accepted nodes `path`, all in sequence 0."""
        base, seqs = self._tree
        self._tree = None
        mem, llama = self._memory, self._lib
        end = base + 1 + len(path)
        winner = seqs[path[-1]][0] if path else 0  # a branch through the last accepted node
        if winner != 0:
            llama.llama_memory_seq_rm(mem, 0, base + 1, -1)  # sequence 0's own branch
            llama.llama_memory_seq_cp(mem, winner, 0, base + 1, end)
        llama.llama_memory_seq_rm(mem, 0, end, -1)
        self._drop_branches()
        self.n_past = end

    def _drop_branches(self) -> None:
        """Remove every sequence but 0: untags the shared history, frees the branches' cells."""
        for seq in range(1, self.tree_width):
            self._lib.llama_memory_seq_rm(self._memory, seq, -1, -1)

    def rollback(self, n_keep: int) -> None:
        self._lib.llama_memory_seq_rm(self._memory, -1, n_keep, -1)
        self.n_past = n_keep

    def end(self, kv_tokens: Sequence[int]) -> None:
        cost = state_of(self.llm).cost
        if cost is not None and cost.calibrated and cost.observations - self._saved_observations >= 64:
            # what real decodes taught the curve, for the next process (not only the calibration)
            self._remember_curve(cost.to_dict()["ms"])
            self._saved_observations = cost.observations
        self._threads.end()
        if not self._began:
            return
        # Interrupted between decode_tree and keep_path (the tree sits past n_past), or
        # between decode and rollback.
        interrupted_tree = self._tree is not None
        if interrupted_tree:
            self._tree = None
            self._drop_branches()
        if interrupted_tree or self.n_past != len(kv_tokens):
            self.rollback(min(self.n_past, len(kv_tokens)))
            kv_tokens = list(kv_tokens)[: self.n_past]
        self._sync_llama(kv_tokens)

    def _sync_llama(self, kv_tokens: Sequence[int]) -> None:
        """Tell the Llama object what its KV cache holds, so its own prefix reuse stays right."""
        llm = self.llm
        n = len(kv_tokens)
        llm.input_ids[:n] = kv_tokens
        llm.n_tokens = n
        if hasattr(llm, "_requires_eval"):
            # the logits buffer belongs to our last batch: never sample from it directly
            llm._requires_eval = True

    def _fill(self, tokens: Sequence[int], n_logits: int) -> None:
        """Fill the batch at the current position; logits only for the last n_logits rows."""
        batch = self._batch
        n = len(tokens)
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"batch of {n} tokens: must be 1..{self.max_batch}")
        if not 1 <= n_logits <= n:
            raise ValueError(f"n_logits must be in 1..{n}, got {n_logits}")
        batch.n_tokens = n
        pos0 = self.n_past
        first_logit = n - n_logits
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_logit

    def _decode(self) -> None:
        n_tokens = int(self._batch.n_tokens)
        threads = self._threads.watched(n_tokens)  # > 1: timed, for the contention watch
        if threads > 1:
            c0, t0 = time.process_time(), time.perf_counter()
        rc = self._lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            if self._rpc is not None:
                self._rpc.check()
            raise RuntimeError(f"llama_decode failed with code {rc} (position {self.n_past}, context {self.n_ctx})")
        if threads > 1:
            self._threads.watch(time.perf_counter() - t0, time.process_time() - c0, threads, n_tokens, self.n_past)
