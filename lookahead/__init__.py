"""lookahead: exact prompt-lookup speculative decoding for local llama.cpp models.

    import lookahead
    fast = lookahead.wrap(llm)            # an existing llama_cpp.Llama
    out = fast.create_completion(prompt, max_tokens=256, temperature=0)
    out["speculation"]                    # drafted, accepted, tokens per pass, timings

    fast = lookahead.load()               # qwen2.5-coder-1.5b, or load("smollm2-135m"), load(path)

The core (index, drafter, sampling, verify, pipeline, engine, api) imports numpy only and
works with any `lookahead.engine.Target`; the llama.cpp binding, and `wrap`/`load` that build
on it, live in lookahead.adapters.llama_cpp, imported when `wrap` or `load` is first used.
"""
from typing import Any

from .api import Lookahead
from .drafter import CostModel, Drafter
from .index import SuffixIndex
from .sampling import SamplingParams
from .stats import SpeculationStats

__version__ = "0.1.0"

# Exact batches (lookahead.adapters.exact) must be chosen before llama.cpp loads a model: on
# unless $LOOKAHEAD_EXACT_BATCHES says otherwise. It only sets that variable.
from .adapters import exact as _exact  # noqa: E402

_exact.choose_default()


def __getattr__(name: str) -> Any:
    """`lookahead.wrap` and `lookahead.load`: the llama.cpp adapter, imported on first use."""
    if name in ("wrap", "load"):
        from lookahead.adapters import llama_cpp

        return getattr(llama_cpp, name)
    raise AttributeError(f"module 'lookahead' has no attribute {name!r}")
__all__ = ["Lookahead", "wrap", "load", "SuffixIndex", "Drafter", "CostModel", "SamplingParams", "SpeculationStats"]
