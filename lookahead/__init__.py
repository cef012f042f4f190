"""lookahead: exact prompt-lookup speculative decoding for local llama.cpp models.

    import lookahead
    fast = lookahead.wrap(llm)            # an existing llama_cpp.Llama
    out = fast.create_completion(prompt, max_tokens=256, temperature=0)
    out["speculation"]                    # drafted, accepted, tokens per pass, timings

    fast = lookahead.load()               # the embedded SmolLM2-135M-Instruct, or load(path)

The core (index, drafter, sampling, verify, pipeline, engine, api) imports numpy only and
works with any `lookahead.engine.Target`; the llama.cpp binding, and `wrap`/`load` that build
on it, live in lookahead.adapters.llama_cpp (imported here, lazily importing llama_cpp).
"""
from .api import Lookahead
from lookahead.adapters.llama_cpp import load, wrap
from .drafter import CostModel, Drafter
from .index import SuffixIndex
from .sampling import SamplingParams
from .stats import SpeculationStats

__version__ = "0.1.0"
__all__ = ["Lookahead", "wrap", "load", "SuffixIndex", "Drafter", "CostModel", "SamplingParams", "SpeculationStats"]
