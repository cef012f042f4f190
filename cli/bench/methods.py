"""The methods the bench compares, and what each one's speedup is measured against."""
from __future__ import annotations

PLAIN = "plain"
LOOKAHEAD = "lookahead"
NO_DRAFT = "no-draft"
PROMPT_LOOKUP = "prompt-lookup"
LOCAL_METHODS = (PLAIN, LOOKAHEAD, NO_DRAFT, PROMPT_LOOKUP)
DEFAULT_METHODS = (PLAIN, LOOKAHEAD, PROMPT_LOOKUP)
SERVER_PLAIN = "server-plain"
# llama-server's own speculation (llama.cpp b11434, scripts/llama-server.sh): each mode and its
# command-line arguments; the method is "server-" + the mode.
SERVER_SPEC_MODES = {"ngram-simple": ("--spec-type", "ngram-simple"),
                     "ngram-map-k": ("--spec-type", "ngram-map-k"),
                     "ngram-mod": ("--spec-type", "ngram-mod"),
                     "spec-default": ("--spec-default",)}
SERVER_METHODS = (SERVER_PLAIN, *(f"server-{s}" for s in SERVER_SPEC_MODES))
PREFIX_CACHE_POLICY = "cleared before every timed call: every method pays its whole prompt prefill"
WARMUP_TOKENS = 4


def baseline_of(method: str) -> str:
    """The method a method's speedup is measured against: the server's n-gram modes against the
    plain server (as llama.cpp's own speculation gains), everything else, server-plain included,
    against plain llama-cpp-python."""
    return SERVER_PLAIN if method.startswith("server-") and method != SERVER_PLAIN else PLAIN


SERVER_SPEC_POLICY = ("every call in a fresh llama-server process, started and sent one short request before it: "
                      "llama.cpp's n-gram modes keep n-grams of earlier requests (ngram-mod's shared pool), so a "
                      "repeated workload would draft from its previous output")
SERVER_PLAIN_BASIS = ("server-plain: decode time per output token against plain's (the server applies the chat "
                      "template its own way, so outputs and end-to-end times are not comparable)")


def method_order(method: str) -> int:
    """Where a method goes in tables: local methods first, then the server's."""
    order = (*LOCAL_METHODS, *SERVER_METHODS)
    return order.index(method) if method in order else len(order)
