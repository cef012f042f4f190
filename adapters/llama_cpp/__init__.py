"""The llama.cpp backend, through llama-cpp-python's low-level API.

It drives the context of an existing `llama_cpp.Llama` directly:

* one `llama_batch` of its own, filled by hand, asking logits only for the rows the verifier
  needs (the last prompt row of each prefill chunk is the only prompt row computed);
* the KV cache is cut back with `llama_memory_seq_rm` after a rejection;
* the Llama's own bookkeeping (`input_ids`, `n_tokens`) is kept true after each request, so
  plain `llm.create_completion` calls and lookahead calls on the same object can both reuse
  the cached prompt prefix, as llama-cpp-python does between its own calls;
* the thread count of one-token decodes is measured, not assumed, and the Llama's settings
  are restored after each request.

Modules: `wrapping` (wrap, load, enable_tree_drafts), `target` (LlamaCppTarget), `one_off`
(its one-off work: prepare, tune, calibrate), `threads` (decode threads and contention),
`prefix_states` (saved prompt prefixes, clear_kv_cache,
prompt_cache_off), `chat` (chat completions), `state` (what is kept per Llama: LlamaState,
state_of, the measurement cache), `rpc` (llama.cpp RPC servers, registered before a model
loads), `backend` (the lazy import of llama_cpp: importing this
package does not load it).
"""
from .prefix_states import PrefixStates, clear_kv_cache, prompt_cache_off
from .state import MEASUREMENTS, LlamaState, measurement_key, state_of
from .target import MAX_TREE_WIDTH, LlamaCppTarget
from .threads import (CONTENTION_BAND, CONTENTION_HOLD_S, CONTENTION_SHARE, CONTENTION_SLOWDOWN,
                      CONTENTION_WINDOW, DECODE_GROWTH_TOKENS, ThreadCheck, quiet_decode_s, tuned_threads)
from .wrapping import enable_tree_drafts, load, wrap

__all__ = [
    "wrap", "load", "enable_tree_drafts", "LlamaCppTarget", "MAX_TREE_WIDTH",
    "clear_kv_cache", "prompt_cache_off", "PrefixStates", "tuned_threads", "ThreadCheck", "quiet_decode_s",
    "CONTENTION_BAND", "CONTENTION_HOLD_S", "CONTENTION_SHARE", "CONTENTION_SLOWDOWN", "CONTENTION_WINDOW",
    "DECODE_GROWTH_TOKENS", "LlamaState", "state_of", "MEASUREMENTS", "measurement_key",
]
