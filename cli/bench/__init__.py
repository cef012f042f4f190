"""`lookahead bench`: time lookahead against plain decoding and other prompt-lookup methods.

One process, one model, every method on the same workloads, interleaved: for each workload,
temperature and repetition, each method runs once, and the order of the methods rotates
from one repetition to the next, so drift in the machine's speed (heat, the other processes)
falls on all of them alike. Before every timed call the Llama's KV cache is cleared, so each
method pays its whole prompt prefill: no method profits from a prefix another one left.

Methods:
* plain          the Llama's own create_chat_completion / create_completion;
* lookahead      `lookahead.wrap(llm)` with the same call;
* no-draft       `lookahead.wrap(llm, max_draft=0)`: the same engine and decode threads, never
                 drafting, so the table shows how much of lookahead's speedup is speculation
                 (the rest is the one-token decode thread count it measures; see
                 `lookahead.adapters.llama_cpp`);
* prompt-lookup  llama-cpp-python's built-in LlamaPromptLookupDecoding (a second Llama built
                 with `draft_model=`; same model file, n_ctx and threads);
* server-*       with --llama-server PATH: llama.cpp's server, plain and in each of its
                 speculation modes (methods.SERVER_SPEC_MODES: ngram-simple, ngram-map-k,
                 ngram-mod, --spec-default; see `LlamaServer`). Each speculative call runs
                 in a fresh server process (`ColdServer`: ngram-mod remembers earlier
                 requests' n-grams). scripts/llama-server.sh builds one from current
                 llama.cpp (no CI test: CI builds no binary).

With --serve / --server the methods are instead http-plain, http-lookahead and
http-prediction, through `lookahead serve`'s HTTP API (see `http`).

All local calls stream: the time between consecutive non-empty chunks gives the
inter-token latencies for the plot (speculation makes that histogram bimodal).

Every run's text is also scored for loops (`measures.repeat_share`: the share of it that
repeats the output's own earlier text and not the prompt). A workload whose plain output loops
is counted per category, and each category also gets its speedups over the workloads that do
not loop: a loop is cheap to draft, so only those say something about real output.

The pure computations (alpha fit, predicted speedup, geometric mean, summaries, loops) are
small functions in `measures` and `summary`; tests/test_bench.py checks them by hand.
"""
from .command import bench
from .local import LocalMethods, timed_stream
from .measures import (LOOP_SHARE, fit_alpha, geometric_mean, mean_draft_length, predicted_speedup, prompt_text,
                       relative_verify_cost, repeat_share, resolve_prompt_lookup_calls, rotated, workload_seed)
from .methods import LOOKAHEAD, NO_DRAFT, PLAIN, PROMPT_LOOKUP
from .plot import require_matplotlib
from .summary import Run, summarise, summarise_group, summarise_workload
from .table import format_table
from .workloads import load_workloads

__all__ = ["bench", "LocalMethods", "timed_stream", "LOOP_SHARE", "prompt_text", "repeat_share", "fit_alpha",
           "geometric_mean", "mean_draft_length", "predicted_speedup", "relative_verify_cost",
           "resolve_prompt_lookup_calls", "rotated", "workload_seed",
           "LOOKAHEAD", "NO_DRAFT", "PLAIN", "PROMPT_LOOKUP", "require_matplotlib", "Run", "summarise",
           "summarise_group", "summarise_workload", "format_table", "load_workloads"]
