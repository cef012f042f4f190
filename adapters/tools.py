"""Bench tools over llama.cpp: re-quantize a GGUF file, and score a text's perplexity under one
(`lookahead bench --quant`: cli/bench/quant.py)."""
from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .llama_cpp import LlamaCppTarget, clear_kv_cache
from .llama_cpp.backend import lib

if TYPE_CHECKING:  # pragma: no cover
    import llama_cpp

QUANT_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def quantize_model(source: str | os.PathLike, destination: str | os.PathLike, fmt: str,
                   threads: int | None = None) -> None:
    """Write `source` re-quantized to `fmt` (e.g. "Q8_0") at `destination`, atomically.

    llama.cpp's own quantizer (`llama_model_quantize`), allowed to re-quantize an already
    quantized file: the result carries the source's rounding plus its own.
    """
    if fmt not in QUANT_TYPES:
        raise ValueError(f"unknown quantization {fmt!r}; one of {', '.join(QUANT_TYPES)}")
    llama = lib()
    params = llama.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[fmt]
    params.allow_requantize = True
    params.nthread = int(threads or os.cpu_count() or 1)
    tmp = f"{destination}.part"
    from llama_cpp._utils import suppress_stdout_stderr  # llama.cpp logs every tensor to stderr

    with suppress_stdout_stderr(disable=False):
        rc = llama.llama_model_quantize(os.fsencode(str(source)), os.fsencode(tmp), ctypes.byref(params))
    if rc != 0:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise RuntimeError(f"llama_model_quantize({str(source)!r} -> {fmt}) failed with code {rc}")
    os.replace(tmp, destination)


def perplexity(llm: "llama_cpp.Llama", tokens: Sequence[int], window: int = 512) -> float:
    """exp(mean negative log-likelihood) of `tokens` under the model, in windows of `window`.

    Each window is decoded from an empty cache with logits on every row; token i + 1 is scored
    by row i. A quality measure for comparing quantizations of one model on the same text.
    """
    target = LlamaCppTarget(llm, threads="keep")
    nll, count = 0.0, 0
    window = min(window, target.max_batch, target.n_ctx)
    for start in range(0, len(tokens) - 1, window):
        chunk = [int(t) for t in tokens[start: start + window]]
        if len(chunk) < 2:
            break
        clear_kv_cache(llm)
        target.n_past = 0
        rows = np.array(target.decode(chunk, len(chunk)), dtype=np.float64)  # [len(chunk), n_vocab]
        rows -= rows.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(rows).sum(axis=1))
        picked = rows[np.arange(len(chunk) - 1), chunk[1:]]
        nll += float((log_z[:-1] - picked).sum())
        count += len(chunk) - 1
    clear_kv_cache(llm)
    if count == 0:
        raise ValueError("perplexity needs at least 2 tokens")
    return float(np.exp(nll / count))


def file_perplexity(model_path: str | os.PathLike, text: str, max_tokens: int = 4096,
                    **llama_kwargs: Any) -> tuple[float, int, str]:
    """(perplexity, tokens scored, llama.cpp's model description) of `text` under a GGUF file."""
    llm = lib().Llama(model_path=str(model_path), **{"verbose": False, **llama_kwargs})
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:max_tokens]
    return perplexity(llm, tokens), len(tokens), llm._model.desc()
