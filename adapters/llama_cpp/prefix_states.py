"""The prompt cache beyond the live KV: saved KV states of recent prompt prefixes
(`PrefixStates`), and the caller's controls of it (`clear_kv_cache`, `prompt_cache_off`)."""
from __future__ import annotations

import ctypes
from collections import OrderedDict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from lookahead.sequences import agreeing_prefix

from .backend import lib
from .state import state_of

if TYPE_CHECKING:  # pragma: no cover
    import llama_cpp


class PrefixStates:
    """Recent KV states of sequence 0, keyed by the tokens they hold: a bounded LRU in memory.

    When a request is about to overwrite a long cached prefix (another document), the state is
    copied out first (llama.cpp's per-sequence state API: the KV cells only); a later request
    sharing more of its prompt with a saved state than with the live cache gets that state
    back instead of a prefill. Bounded in bytes; the least recently used state goes first.
    """

    MIN_TOKENS = 128  # shorter prefixes are cheaper to prefill again than to keep

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._entries: "OrderedDict[tuple[int, ...], bytes]" = OrderedDict()

    @property
    def bytes(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def save(self, ctx: Any, tokens: Sequence[int]) -> None:
        llama = lib()
        key = tuple(int(t) for t in tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        size = int(llama.llama_state_seq_get_size(ctx, 0))
        if size <= 0 or size > self.max_bytes:
            return
        buffer = (ctypes.c_uint8 * size)()
        written = int(llama.llama_state_seq_get_data(ctx, buffer, size, 0))
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
            n = agreeing_prefix(key, prompt)
            if n > best_len:
                best, best_len = key, n
        if best is None:
            return None
        llama = lib()
        data = self._entries[best]
        self._entries.move_to_end(best)
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        llama.llama_memory_seq_rm(memory, -1, -1, -1)
        if int(llama.llama_state_seq_set_data(ctx, buffer, len(data), 0)) <= 0:
            llama.llama_memory_clear(memory, True)
            return []
        return list(best)

    def clear(self) -> None:
        self._entries.clear()


def clear_kv_cache(llm: "llama_cpp.Llama") -> None:
    """Empty the Llama's KV cache, its saved prefix states and prompt bookkeeping: its next
    request prefills everything."""
    states = state_of(llm).prefix_states
    if states is not None:
        states.clear()
    llm.reset()
    llm._ctx.kv_cache_clear()


@contextmanager
def prompt_cache_off(llm: "llama_cpp.Llama") -> Iterator[None]:
    """Requests on `llm` inside the block start from an empty KV cache and neither use nor fill
    its saved prefix states: each pays its whole prompt prefill (the server's `cache_prompt:
    false`, for benches). The saved states stay for the requests after the block."""
    state = state_of(llm)
    states, state.prefix_states = state.prefix_states, None
    llm.reset()  # nothing cached: the next prefill keeps no KV entry (and drops the others)
    try:
        yield
    finally:
        if states is not None and state.prefix_states is None:
            state.prefix_states = states
