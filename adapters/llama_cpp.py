"""The llama.cpp target, through llama-cpp-python's low-level API.

It drives the context of an existing `llama_cpp.Llama` directly:

* one `llama_batch` of its own, filled by hand, asking logits only for the rows the verifier
  needs (the last prompt row of each prefill chunk is the only prompt row computed);
* the KV cache is cut back with `llama_memory_seq_rm` after a rejection;
* the Llama's own bookkeeping (`input_ids`, `n_tokens`) is kept true after each request, so
  plain `llm.create_completion` calls and lookahead calls on the same object can both reuse
  the cached prompt prefix, as llama-cpp-python does between its own calls;
* the thread count of one-token decodes is measured, not assumed (see `tune`): llama-cpp-python
  defaults to half the CPUs for them (right with SMT siblings, slow on a 2-vCPU machine
  without them), and never more than the Llama's own `n_threads_batch` is tried. Thread
  counts do not change llama.cpp's CPU results (checked bit for bit), only their speed. The
  Llama's settings are restored after each request.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import time
import weakref
from collections import deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from lookahead import cache
from lookahead.api import Lookahead
from lookahead.drafter import CostModel
from lookahead.models import check_gguf, default_model_path

if TYPE_CHECKING:  # pragma: no cover
    import llama_cpp


def _lib():
    import llama_cpp  # lazy: the core never imports the backend

    return llama_cpp


MAX_TREE_WIDTH = 8  # branches of one tree draft, at most (= sequence ids used)

# Thread count chosen for one-token decodes, per Llama (measured once, in its first request).
_TUNED_THREADS: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
# The verify-cost curve belongs to the model and machine, not to one wrapper: every wrapper
# of the same Llama shares it, so it is measured once.
_COST_MODELS: "weakref.WeakKeyDictionary[Any, CostModel]" = weakref.WeakKeyDictionary()
# Contention (see LlamaCppTarget._watch_contention): decodes whose threads got under this share
# of their cores, over this many decodes, mean another process wants them; the Llama's own
# thread count is then kept this long (monotonic deadline per Llama).
CONTENTION_SHARE = 0.85
CONTENTION_WINDOW = 12
CONTENTION_HOLD_S = 30.0
CONTENTION_SLOWDOWN = 1.4
# A one-token decode gets dearer with its position (attention): quiet, 2x the fastest at 2,000
# tokens against 10. So the fastest is kept per band of this many positions, per Llama, and
# carried to a later position as if a decode took (1 + position / DECODE_GROWTH_TOKENS) times
# its time at 0 (SmolLM2-135M here: 7.6 ms at 200, 10.9 at 1,400, 2x at 2,000; a model whose
# attention is a smaller share grows slower, and is then judged more leniently, not less).
CONTENTION_BAND = 256
DECODE_GROWTH_TOKENS = 2048
_FASTEST_DECODE: "weakref.WeakKeyDictionary[Any, dict[int, float]]" = weakref.WeakKeyDictionary()  # band -> s
_CONTENDED_UNTIL: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()
# The tuned thread count is checked while it serves (see ThreadCheck), per Llama.
_THREAD_CHECKS: "weakref.WeakKeyDictionary[Any, ThreadCheck]" = weakref.WeakKeyDictionary()


class ThreadCheck:
    """Is the thread count of one-token decodes still the faster one? Checked while decoding.

    `tune` measures it once and the result is cached per model, build and CPU model; but a VM
    of the same CPU model, or the same VM with a neighbour on part of a core, can turn the
    answer round (two threads wait for each other at every layer, one does not). Measured
    here in one bench run: on prose where nothing was drafted, lookahead's two-thread decodes
    ran 0.90-0.94x the speed of plain's one thread, where the run before had 1.07-1.10x.

    So every `every`-th one-token decode runs with the other candidate count instead, and its
    time is divided by the median of the last few decodes with the chosen count, taken just
    before (the same position, within a few tokens: attention cost drifts along a request).
    Once the median of the last `window` such ratios is under `margin`, the other count is
    faster and becomes the choice. When the other count is clearly slower (ratio median over
    1 / `margin` ** 3), it is tried `settled` times less often. Thread counts do not change
    the logits, so the check never changes an output; it costs about (ratio - 1) / every of
    the one-token decode time (under 1% here).
    """

    def __init__(self, every: int = 16, window: int = 5, margin: float = 0.97, settled: int = 4):
        self.every, self.window, self.margin, self.settled = int(every), int(window), float(margin), int(settled)
        self.ratios: deque[float] = deque(maxlen=self.window)
        self.recent: deque[float] = deque(maxlen=3)  # seconds of the last decodes with the chosen count
        self.count = 0  # one-token decodes with the chosen count since the last check
        self.checks = 0  # checks made (for stats and tests)

    def due(self) -> bool:
        """Should the next one-token decode run with the other count?"""
        if len(self.recent) < self.recent.maxlen:
            return False
        settled = (len(self.ratios) == self.window
                   and statistics.median(self.ratios) > 1 / self.margin ** 3)
        return self.count >= self.every * (self.settled if settled else 1)

    def chosen(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.count += 1

    def other(self, seconds: float) -> bool:
        """Record a decode with the other count; True if it is now the faster one."""
        self.ratios.append(seconds / statistics.median(self.recent))
        self.count = 0
        self.checks += 1
        if len(self.ratios) == self.window and statistics.median(self.ratios) < self.margin:
            self.ratios.clear()
            self.recent.clear()
            return True
        return False


MEASUREMENTS = "measurements"  # cache kind: verify-cost timings and decode threads per model and machine


def measurement_key(llm: "llama_cpp.Llama") -> str:
    """What one-off measurements depend on: the model file, the build, the CPU, the threads,
    the batch size and the GPU offload. A change of any of them measures again."""
    from .health import build_identity

    path = str(getattr(llm, "model_path", ""))
    try:
        st = os.stat(path)
        model = f"{os.path.abspath(path)}:{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        model = path
    params = llm.model_params
    return (f"{model}|threads={llm.n_threads},{llm.n_threads_batch}|n_batch={llm.n_batch}"
            f"|gpu_layers={getattr(params, 'n_gpu_layers', 0)}|{build_identity()}")


def wrap(llm: "llama_cpp.Llama", speculate: bool = True, max_draft: int = 64, calibrate: bool = True,
         threads: int | str = "auto", observer=None, prefix_cache_mb: float = 256) -> Lookahead:
    """Wrap an existing `llama_cpp.Llama`: same completion API, exact speculative decoding.

    `prefix_cache_mb`: memory for saved KV states of recent prompt prefixes (see
    `PrefixStates`): a document sent again after another one skips its prefill. 0: off.

    `threads`: threads of one-token decodes. "auto" times the Llama's `n_threads` against its
    `n_threads_batch` once and keeps the faster (llama-cpp-python's default is half the CPUs,
    slow where they are not SMT siblings); "keep" uses the Llama's own; an int that many.
    Outputs do not depend on it; the Llama's settings are restored after each request.
    """
    if not isinstance(prefix_cache_mb, (int, float)) or isinstance(prefix_cache_mb, bool) or prefix_cache_mb < 0:
        raise ValueError(f"prefix_cache_mb must be a number >= 0, got {prefix_cache_mb!r}")
    target = LlamaCppTarget(llm, threads=threads)
    if prefix_cache_mb > 0:
        states = _PREFIX_STATES.get(llm)
        if states is None:
            _PREFIX_STATES[llm] = PrefixStates(int(prefix_cache_mb * 2**20))
        else:
            states.max_bytes = int(prefix_cache_mb * 2**20)
    else:
        _PREFIX_STATES.pop(llm, None)
    cost = _COST_MODELS.get(llm)
    if cost is None or cost.max_batch != target.max_batch:
        # The curve measured for this model, build and machine in an earlier process: no
        # calibration in the first request. It is on probation: if the first real decodes
        # disagree with it by more than 1.5x (another load, another machine), it is dropped
        # and measured again (CostModel.from_dict).
        known = cache.get(MEASUREMENTS, target.measurement_key) or {}
        try:
            cost = CostModel.from_dict({"max_batch": target.max_batch, "ms": known["verify_ms"]})
        except (KeyError, ValueError):
            cost = CostModel(max_batch=target.max_batch)
        if known.get("decode_threads") and threads == "auto" and llm not in _TUNED_THREADS:
            _TUNED_THREADS[llm] = int(known["decode_threads"])
        _COST_MODELS[llm] = cost
    return Lookahead(target, speculate=speculate, max_draft=max_draft, calibrate=calibrate, cost=cost,
                     observer=observer)


def load(model_path: str | os.PathLike | None = None, n_ctx: int = 4096, n_threads: int | None = None,
         verbose: bool = False, speculate: bool = True, max_draft: int = 64, tree_width: int = 1,
         threads: int | str = "auto", **llama_kwargs: Any) -> Lookahead:
    """Load a GGUF model (default: the embedded SmolLM2-135M-Instruct) and wrap it.

    `llama_kwargs` go to `llama_cpp.Llama` (n_gpu_layers, n_threads_batch, n_batch, ...).
    `tree_width` > 1 builds the context with that many sequences over a unified KV cache,
    so that drafts may branch where the index's occurrences disagree (each decode verifies
    up to `tree_width` branches; the cost model decides when a wider batch pays). A plain
    `llama_cpp.Llama` has one sequence: `wrap` then drafts chains only.
    """
    if isinstance(tree_width, bool) or not isinstance(tree_width, int) or not 1 <= tree_width <= MAX_TREE_WIDTH:
        raise ValueError(f"tree_width must be an integer in 1..{MAX_TREE_WIDTH}, got {tree_width!r}")
    path = check_gguf(model_path if model_path is not None else default_model_path())
    llama_cpp = _lib()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=verbose, **llama_kwargs)
    if tree_width > 1:
        enable_tree_drafts(llm, tree_width)
    return wrap(llm, speculate=speculate, max_draft=max_draft, threads=threads)


def clear_kv_cache(llm: "llama_cpp.Llama") -> None:
    """Empty the Llama's KV cache, its saved prefix states and prompt bookkeeping: its next
    request prefills everything."""
    states = _PREFIX_STATES.get(llm)
    if states is not None:
        states.clear()
    llm.reset()
    llm._ctx.kv_cache_clear()


@contextmanager
def prompt_cache_off(llm: "llama_cpp.Llama") -> Iterator[None]:
    """Requests on `llm` inside the block start from an empty KV cache and neither use nor fill
    its saved prefix states: each pays its whole prompt prefill (the server's `cache_prompt:
    false`, for benches). The saved states stay for the requests after the block."""
    states = _PREFIX_STATES.pop(llm, None)
    llm.reset()  # nothing cached: the next prefill keeps no KV entry (and drops the others)
    try:
        yield
    finally:
        if states is not None:
            _PREFIX_STATES.setdefault(llm, states)


def enable_tree_drafts(llm: "llama_cpp.Llama", width: int = 4) -> "llama_cpp.Llama":
    """Give `llm` a context with `width` sequences over one unified KV cache, for tree drafts.

    llama-cpp-python builds its context with a single sequence, so one decode cannot hold
    several branches. This replaces the context (same parameters otherwise; the KV cache
    starts empty) and returns the Llama. Call it before `lookahead.wrap(llm)`. Plain calls
    keep working: they use sequence 0, like before.
    """
    from llama_cpp import _internals

    if not 2 <= width <= MAX_TREE_WIDTH:
        raise ValueError(f"width must be in 2..{MAX_TREE_WIDTH}, got {width}")
    params = llm.context_params
    params.n_seq_max = int(width)
    params.kv_unified = True
    old = llm._ctx
    llm._ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=llm.verbose)
    old.close()
    llm.n_tokens = 0
    return llm


def tuned_threads(llm: Any) -> int | None:
    """The one-token decode thread count lookahead measured for `llm`, or None if not yet."""
    return _TUNED_THREADS.get(llm)


class LlamaCppTarget:
    """A `lookahead.engine.Target` over a `llama_cpp.Llama`.

    `threads`: threads for one-token decodes. "auto" (default) measures the Llama's own
    `n_threads` against its `n_threads_batch` once, at a real context position, and keeps the
    faster; "keep" leaves the Llama's setting; an int uses that many. Batched decodes (prefill,
    drafts) always run with the Llama's `n_threads_batch`.
    """

    def __init__(self, llm: "llama_cpp.Llama", max_batch: int | None = None, threads: int | str = "auto"):
        if not (threads in ("auto", "keep") or (isinstance(threads, int) and not isinstance(threads, bool)
                                                and threads >= 1)):
            raise ValueError(f"threads must be 'auto', 'keep' or a positive integer, got {threads!r}")
        lib = _lib()
        from .health import ensure_batched_decodes

        ensure_batched_decodes(llm.model_path)  # a build known to crash here: a clear error instead
        self.llm = llm
        self._lib = lib
        self._context = llm._ctx  # the LlamaContext wrapped; enable_tree_drafts replaces it
        self._ctx = llm._ctx.ctx
        self._memory = lib.llama_get_memory(self._ctx)
        self.n_ctx = int(llm.n_ctx())
        self.n_vocab = int(llm.n_vocab())
        self.max_batch = int(max_batch or llm.n_batch)
        # Tree drafts need several sequences over one shared (unified) KV cache; a Llama made
        # by llama-cpp-python has one sequence unless built with `enable_tree_drafts`.
        unified = bool(getattr(llm.context_params, "kv_unified", False))
        self.tree_width = min(int(lib.llama_n_seq_max(self._ctx)), MAX_TREE_WIDTH) if unified else 1
        self._batch = lib.llama_batch_init(self.max_batch, 0, max(1, self.tree_width))
        self._vocab = llm._model.vocab
        self._pieces: dict[int, bytes] = {}
        self._tree = None  # (base position, sequence ids per node) between decode_tree and keep_path
        self.threads = threads
        self._llama_threads: tuple[int, int] | None = None  # the Llama's (n_threads, n_threads_batch)
        self._measurement_key: str | None = None
        self._saved_observations = 0  # the cost curve's observation count when last saved
        self.contended = False  # see _watch_contention
        # (with layers on a GPU the CPU threads mostly wait for it: their CPU time says nothing)
        self._watch = int(getattr(llm.model_params, "n_gpu_layers", 0) or 0) == 0
        self._shares: deque[float] = deque(maxlen=CONTENTION_WINDOW)  # CPU / wall / threads per decode
        self._walls: deque[float] = deque(maxlen=CONTENTION_WINDOW)  # seconds of one-token decodes

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
        if self._measurement_key is None:
            self._measurement_key = measurement_key(self.llm)
        return self._measurement_key

    def _remember(self, **values: Any) -> None:
        """Keep one-off measurements for the next process (lookahead.cache; LOOKAHEAD_NO_CACHE=1: off)."""
        key = self.measurement_key
        known = cache.get(MEASUREMENTS, key) or {}
        cache.put(MEASUREMENTS, key, {**known, **values})

    # ---- what the wrapper asks of a backend -------------------------------------------
    @property
    def model_name(self) -> str:
        return str(getattr(self.llm, "model_path", ""))

    @property
    def penalty_last_n(self) -> int:
        """Tokens the repeat/frequency/presence penalties look back on (the Llama's setting)."""
        return int(getattr(self.llm, "last_n_tokens_size", 64))

    def chat_completion(self, complete: Callable[..., Any], messages: list[dict], **kwargs: Any):
        """llama-cpp-python's own create_chat_completion, with `complete` as its completion call.

        The Llama's method runs with a proxy as `self`: the same defaults, chat handler and
        template, stop tokens and chunk conversion; only its create_completion is the wrapper's.
        """
        return type(self.llm).create_chat_completion(_CompletionProxy(self.llm, complete), messages, **kwargs)

    def plain_completion(self, **kwargs: Any):
        """The Llama's own create_completion (for arguments the engine does not implement)."""
        return self.llm.create_completion(**kwargs)

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
        # The Llama's own settings (what its constructor set), restored by `end`.
        self._llama_threads = (int(llm.n_threads), int(llm.n_threads_batch))
        self._shares.clear()
        self._walls.clear()
        self.contended = time.monotonic() < _CONTENDED_UNTIL.get(llm, 0.0)
        if self.contended:  # contention was seen a moment ago: start where it left off
            self._lib.llama_set_n_threads(self._ctx, self._llama_threads[0], self._llama_threads[0])
        else:
            self._set_decode_threads(self._chosen_threads())
        cached = llm._input_ids[: llm.n_tokens].tolist() if llm.n_tokens > 0 else []
        keep = _common_prefix(cached, prompt[:-1])  # always decode the last prompt token again
        self._drop_branches()  # of an interrupted tree draft
        states = _PREFIX_STATES.get(llm)
        if states is not None:
            # Keep what is about to be overwritten, and take a saved state that shares more of
            # this prompt than the cache does (an editor sending one file back after another).
            if len(cached) - keep >= PrefixStates.MIN_TOKENS:
                states.save(self._ctx, cached)
            restored = states.restore_best(self._ctx, self._memory, prompt[:-1], better_than=keep)
            if restored is not None:
                cached, keep = restored, _common_prefix(restored, prompt[:-1])
        # seq -1: every sequence; nothing of another request survives past `keep`.
        if not self._lib.llama_memory_seq_rm(self._memory, -1, keep, -1):
            self._lib.llama_memory_clear(self._memory, True)
            keep = 0
        self._sync_llama(prompt[:keep])
        self.n_past = keep
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
        if n == 1 and self.threads == "auto" and not self.contended and self._llama_threads is not None:
            self._checked_decode()
        else:
            self._decode()
        self.n_past += n
        ptr = self._lib.llama_get_logits(self._ctx)
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
        ptr = self._lib.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(n + 1, self.n_vocab))

    def keep_path(self, path: Sequence[int]) -> None:
        """After `decode_tree`: keep the root and the accepted nodes `path`, all in sequence 0."""
        base, seqs = self._tree
        self._tree = None
        mem, lib = self._memory, self._lib
        end = base + 1 + len(path)
        winner = seqs[path[-1]][0] if path else 0  # a branch through the last accepted node
        if winner != 0:
            lib.llama_memory_seq_rm(mem, 0, base + 1, -1)  # sequence 0's own branch
            lib.llama_memory_seq_cp(mem, winner, 0, base + 1, end)
        lib.llama_memory_seq_rm(mem, 0, end, -1)
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
        cost = _COST_MODELS.get(self.llm)
        if cost is not None and cost.calibrated and cost.observations - self._saved_observations >= 64:
            # what real decodes taught the curve, for the next process (not only the calibration)
            self._remember(verify_ms=cost.to_dict()["ms"])
            self._saved_observations = cost.observations
        if self._llama_threads is not None:  # give the Llama back its own thread settings
            self._lib.llama_set_n_threads(self._ctx, *self._llama_threads)
            self._llama_threads = None
        if getattr(self, "n_past", None) is None:
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
        threads = 0
        if self._watch and not self.contended and self._llama_threads is not None:
            single = self._batch.n_tokens == 1
            threads = int(self._lib.llama_n_threads(self._ctx) if single else self._lib.llama_n_threads_batch(self._ctx))
        if threads > 1:
            c0, t0 = time.process_time(), time.perf_counter()
        rc = self._lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} (position {self.n_past}, context {self.n_ctx})")
        if threads > 1:
            self._watch_contention(time.perf_counter() - t0, time.process_time() - c0, threads,
                                   int(self._batch.n_tokens))

    # ---- threads -------------------------------------------------------------------
    def _checked_decode(self) -> None:
        """A one-token decode with the tuned thread count, or now and then with the other
        candidate, to see whether it has become the faster one (ThreadCheck)."""
        chosen = _TUNED_THREADS.get(self.llm)
        own, batch = self._llama_threads
        other = batch if chosen == own else own  # the candidates tune() chose between
        if chosen is None or other == chosen:
            self._decode()
            return
        check = _THREAD_CHECKS.get(self.llm)
        if check is None:
            check = _THREAD_CHECKS[self.llm] = ThreadCheck()
        if not check.due():
            t0 = time.perf_counter()
            self._decode()
            check.chosen(time.perf_counter() - t0)
            return
        self._set_decode_threads(other)
        t0 = time.perf_counter()
        try:
            self._decode()
        finally:
            seconds = time.perf_counter() - t0
            if not self.contended:  # (else the contention watch has just set the relief: keep it)
                self._set_decode_threads(chosen)
        if not self.contended and check.other(seconds):
            _TUNED_THREADS[self.llm] = other
            self._remember(decode_threads=other)
            self._set_decode_threads(other)

    @property
    def decode_threads(self) -> int:
        """Threads of one-token decodes right now."""
        return int(self._lib.llama_n_threads(self._ctx))

    def _chosen_threads(self) -> int | None:
        if self.threads == "keep":
            return None
        if self.threads == "auto":
            return _TUNED_THREADS.get(self.llm)
        return int(self.threads)

    def _watch_contention(self, wall_s: float, cpu_s: float, threads: int, n_tokens: int) -> None:
        """After a decode with `threads` > 1: did its threads get the cores?

        llama.cpp's threads wait for each other at every layer, so when another process takes
        a core a decode with as many threads as cores stalls. Measured on 2 cores with one
        busy process beside it: one-token decodes with 2 threads 7.3 -> 12-16 ms (up to 375),
        with 1 thread unchanged at 7.9; 8-token decodes 27 -> 57 ms with 2, 41 with 1. Two
        signs together, over the last CONTENTION_WINDOW decodes: the process's CPU time over
        wall time per thread (1.0 quiet, 0.5-0.7 with the busy process; quiet one-token
        decodes alternate between 0.8 and 1.15, so it is not enough alone) under
        CONTENTION_SHARE, and one-token decodes CONTENTION_SLOWDOWN times slower than a quiet
        one at this position: the fastest seen in each CONTENTION_BAND of positions, carried to
        this one by DECODE_GROWTH_TOKENS (a quiet decode at 2,000 tokens takes 2x the fastest
        at 10, so the fastest of all would make the second sign always true on long requests).
        Then every decode of the rest of the request, and of the requests in the next
        CONTENTION_HOLD_S seconds, uses the Llama's own `n_threads` (llama-cpp-python's
        default: half the cores), and `contended` is True.
        """
        self._shares.append(cpu_s / wall_s / threads if wall_s > 0 else 1.0)
        band = self.n_past // CONTENTION_BAND
        fastest = _FASTEST_DECODE.setdefault(self.llm, {})
        if n_tokens == 1:
            self._walls.append(wall_s)
            fastest[band] = min(fastest.get(band, wall_s), wall_s)
        if len(self._shares) < CONTENTION_WINDOW or len(self._walls) < CONTENTION_WINDOW // 2:
            return
        # (statistics.median: a dozen values, at every decode; numpy's costs tens of microseconds)
        if (statistics.median(self._shares) < CONTENTION_SHARE
                and statistics.median(self._walls) > CONTENTION_SLOWDOWN * quiet_decode_s(fastest, band)):
            self.contended = True
            _CONTENDED_UNTIL[self.llm] = time.monotonic() + CONTENTION_HOLD_S
            own = self._llama_threads[0] if self._llama_threads is not None else int(self.llm.n_threads)
            self._lib.llama_set_n_threads(self._ctx, own, own)

    def _set_decode_threads(self, n: int | None) -> None:
        if n is not None and self._llama_threads is not None and n != self.decode_threads:
            self._lib.llama_set_n_threads(self._ctx, n, self._llama_threads[1])

    def tune(self, reps: int = 5) -> dict[int, float]:
        """Choose the thread count of one-token decodes by timing them: {threads: median ms}.

        Only with threads="auto", once per Llama, inside a request (after its prompt, where the
        attention cost is that of real work). Candidates: the Llama's `n_threads` and
        `n_threads_batch`, timed alternately `reps` times each on a dummy token that is rolled
        back. The Llama's own count is kept unless another is at least 3% faster.
        """
        if self.threads != "auto" or self.llm in _TUNED_THREADS or self._llama_threads is None or self.contended:
            return {}  # (contended: timings now would say nothing about this machine; a later request)
        own, batch = self._llama_threads
        candidates = sorted({own, batch})
        if len(candidates) == 1 or self.n_past + 1 > self.n_ctx:
            _TUNED_THREADS[self.llm] = own
            return {}
        base = self.n_past
        times: dict[int, list[float]] = {n: [] for n in candidates}
        for _ in range(reps):
            for n in candidates:
                self._lib.llama_set_n_threads(self._ctx, n, batch)
                t0 = time.perf_counter()
                self.decode([97 % self.n_vocab], 1)
                times[n].append(1000 * (time.perf_counter() - t0))
                self.rollback(base)
        if self.contended:  # it began during the timings: they are not this machine's; keep the relief
            self._lib.llama_set_n_threads(self._ctx, own, own)
            return {}
        medians = {n: float(np.median(v)) for n, v in times.items()}
        best = min(medians, key=medians.get)
        chosen = best if medians[best] < 0.97 * medians[own] else own
        _TUNED_THREADS[self.llm] = chosen
        self._remember(decode_threads=chosen)
        self._lib.llama_set_n_threads(self._ctx, chosen, batch)
        return medians

    def calibrate(self, sizes: Sequence[int], reps: int = 3) -> dict[int, float]:
        """Time decodes of each size at the current position, rolled back: {n: median ms}.

        Call it with a real context in the KV cache: attention makes a decode at position
        600 markedly dearer than the same decode at position 0. The sizes are timed in turn,
        `reps` rounds, and the median kept: the result is cached for later processes, and one
        unlucky timing would mislead them.
        """
        base = self.n_past
        sizes = [n for n in sizes if n <= self.max_batch and base + n <= self.n_ctx]
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(max(1, reps)):
            for n in sizes:
                tokens = [(97 + i) % self.n_vocab for i in range(n)]  # content does not change the cost
                t0 = time.perf_counter()
                self.decode(tokens, n)
                times[n].append(1000 * (time.perf_counter() - t0))
                self.rollback(base)
        out = {n: float(np.median(v)) for n, v in times.items()}
        if out:
            self._remember(verify_ms={str(n): round(ms, 3) for n, ms in out.items()})
        return out


def quiet_decode_s(fastest: dict[int, float], band: int) -> float:
    """What a quiet one-token decode takes in position band `band`, from the fastest seen per
    band: each band's fastest carried forward by DECODE_GROWTH_TOKENS (a later band's as it
    is: a lenient guess), the least of them."""
    def growth(b: int) -> float:
        return 1.0 + b * CONTENTION_BAND / DECODE_GROWTH_TOKENS

    return min(s * growth(band) / growth(b) if b < band else s for b, s in fastest.items())


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixStates:
    """Recent KV states of sequence 0, keyed by the tokens they hold: a bounded LRU in memory.

    When a request is about to overwrite a long cached prefix (another document), the state is
    copied out first (llama.cpp's per-sequence state API: the KV cells only); a later request
    sharing more of its prompt with a saved state than with the live cache gets that state
    back instead of a prefill. Bounded in bytes; the least recently used state goes first.
    """

    MIN_TOKENS = 128  # shorter prefixes are cheaper to prefill again than to keep

    def __init__(self, max_bytes: int):
        from collections import OrderedDict

        self.max_bytes = int(max_bytes)
        self._entries: "OrderedDict[tuple[int, ...], bytes]" = OrderedDict()

    @property
    def bytes(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def save(self, ctx: Any, tokens: Sequence[int]) -> None:
        lib = _lib()
        key = tuple(int(t) for t in tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        size = int(lib.llama_state_seq_get_size(ctx, 0))
        if size <= 0 or size > self.max_bytes:
            return
        buffer = (ctypes.c_uint8 * size)()
        written = int(lib.llama_state_seq_get_data(ctx, buffer, size, 0))
        if written <= 0:
            return
        self._entries[key] = bytes(buffer)[:written]
        while self.bytes > self.max_bytes:
            self._entries.popitem(last=False)

    def restore_best(self, ctx: Any, memory: Any, prompt: Sequence[int], better_than: int) -> list[int] | None:
        """Load the saved state sharing the longest prefix with `prompt`, if it beats `better_than`
        by MIN_TOKENS; returns the tokens it holds, or None (the cache is left as it was)."""
        best, best_len = None, better_than + self.MIN_TOKENS - 1
        for key in self._entries:
            n = _common_prefix(key, prompt)
            if n > best_len:
                best, best_len = key, n
        if best is None:
            return None
        lib = _lib()
        data = self._entries[best]
        self._entries.move_to_end(best)
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        lib.llama_memory_seq_rm(memory, -1, -1, -1)
        if int(lib.llama_state_seq_set_data(ctx, buffer, len(data), 0)) <= 0:
            lib.llama_memory_clear(memory, True)
            return []
        return list(best)

    def clear(self) -> None:
        self._entries.clear()


# Saved prefix states per Llama (see PrefixStates; wrap(..., prefix_cache_mb=0) turns them off).
_PREFIX_STATES: "weakref.WeakKeyDictionary[Any, PrefixStates]" = weakref.WeakKeyDictionary()


class _CompletionProxy:
    """Looks like the Llama to a chat handler, but completes through `complete`."""

    def __init__(self, llm: Any, complete: Callable[..., Any]):
        self._llm = llm
        self._complete = complete

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def create_completion(self, *args: Any, **kwargs: Any):
        return self._complete(*args, **kwargs)

    __call__ = create_completion
