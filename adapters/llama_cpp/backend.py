"""The `llama_cpp` module, imported on first use: importing lookahead never loads the backend."""
from __future__ import annotations

from typing import Any


def lib() -> Any:
    import llama_cpp

    return llama_cpp
