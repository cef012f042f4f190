"""Chat completions: llama-cpp-python's own `create_chat_completion`, completing through lookahead."""
from __future__ import annotations

from typing import Any, Callable


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


def chat_completion(llm: Any, complete: Callable[..., Any], messages: list[dict], **kwargs: Any):
    """`llm`'s create_chat_completion, with `complete` as its completion call.

    The Llama's method runs with a proxy as `self`: the same defaults, chat handler and
    template, stop tokens and chunk conversion; only its create_completion is `complete`.
    """
    return type(llm).create_chat_completion(_CompletionProxy(llm, complete), messages, **kwargs)
