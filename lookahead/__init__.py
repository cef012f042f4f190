"""lookahead: exact prompt-lookup speculative decoding for local llama.cpp models.

    import lookahead
    fast = lookahead.wrap(llm)            # an existing llama_cpp.Llama
    out = fast.create_completion(prompt, max_tokens=256, temperature=0)
    out["speculation"]                    # drafted, accepted, tokens per pass, timings

    fast = lookahead.load()               # the embedded SmolLM2-135M-Instruct, or load(path)

The core (index, drafter, sampling, verify, engine) imports numpy only; the llama.cpp
binding lives in lookahead.adapters.
"""
from .api import Lookahead, load, wrap
from .drafter import CostModel, Drafter
from .index import SuffixIndex
from .sampling import SamplingParams
from .stats import SpeculationStats

__version__ = "0.1.0"
__all__ = ["Lookahead", "wrap", "load", "SuffixIndex", "Drafter", "CostModel", "SamplingParams", "SpeculationStats"]
