"""From generated tokens to the text of one completion: EOS, stop strings, UTF-8, streaming.

Pure: it sees token ids, their bytes (through a `piece` function) and, for stopping criteria,
the logits row each token was sampled from; it never calls a model. The rules are
llama-cpp-python's (`Llama._create_completion`), so the wrapper's text, finish reason and
stream slicing match the plain path's for the same tokens:

* an end-of-generation token ends the completion (finish "stop") and is not part of it;
* while the text ends inside a UTF-8 sequence, nothing is checked or streamed (and the
  completion may run past max_tokens to finish the character, as llama-cpp-python's does);
* the first stop string found cuts the text there (finish "stop");
* a stream never shows bytes that could be the start of a stop string, nor half a character;
* `max_tokens` tokens end it (finish "length");
* stopping criteria get (input ids evaluated so far, logits row of the new token) before the
  token is taken, and once more at the end, as llama-cpp-python calls them.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np


def utf8_complete_length(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 sequence."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n


def stop_prefix_hold(text: bytes, stops: Sequence[bytes]) -> int:
    """How many trailing bytes of `text` could be the start of a stop string."""
    hold = 0
    for s in stops:
        for i in range(min(len(s), len(text)), 0, -1):
            if text.endswith(s[:i]):
                hold = max(hold, i)
                break
    return hold


class CompletionText:
    """The text of one completion, built token by token.

    Call `push(token, row)` for each generated token until `finished`, then `close()`.
    `push` returns the bytes that became safe to stream (b"" when `stream` is off). After
    `close()`, `text`, `tokens` and `finish_reason` are final, and it returns the bytes not
    streamed yet.
    """

    def __init__(self, piece: Callable[[int], bytes], is_eog: Callable[[int], bool], max_tokens: int,
                 stops: Sequence[str] = (), stream: bool = False, prompt_tokens: Sequence[int] = (),
                 stopping_criteria: Callable[[np.ndarray, Any], bool] | None = None):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self._piece = piece
        self._is_eog = is_eog
        self.max_tokens = int(max_tokens)
        self.stops = [s.encode("utf-8") for s in stops if s]
        self.stream = bool(stream)
        self._criteria = stopping_criteria
        self._ids = np.asarray(list(prompt_tokens), dtype=np.intc)  # evaluated ids, grown on demand
        self._n_prompt = len(self._ids)
        self._n_filled = self._n_prompt
        self._last_row: Any = None
        self.tokens: list[int] = []
        self.text = b""
        self.finish_reason: str | None = None
        self._streamed = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def push(self, token: int, row: Any = None) -> bytes:
        """Take one generated token (and the logits row it was sampled from, for criteria)."""
        if self.finished:
            raise RuntimeError("push after the completion finished")
        if self._criteria is not None:
            # llama-cpp-python: the ids evaluated so far (not the new token) and the new token's row
            self._last_row = row
            if self._criteria(self._evaluated_ids(), row):
                self.finish_reason = "stop"
                return b""
        if self._is_eog(token):
            self.finish_reason = "stop"
            return b""
        self.tokens.append(int(token))
        self.text += self._piece(token)
        if utf8_complete_length(self.text) < len(self.text):
            return b""  # inside a character: no checks, nothing shown, no length limit yet
        hit = next((s for s in self.stops if s in self.text), None)  # the first in list order
        if hit is not None:
            self.text = self.text[: self.text.index(hit)]
            self.finish_reason = "stop"
            return b""
        if len(self.tokens) >= self.max_tokens:
            self.finish_reason = "length"
        if not self.stream or self.finished:
            return b""  # finished: close() gives the rest
        safe = len(self.text) - stop_prefix_hold(self.text[self._streamed:], self.stops)
        return self._take(utf8_complete_length(self.text[:safe]))

    def close(self) -> bytes:
        """The generation is over (finished here, or the tokens ran out): the bytes not streamed."""
        if self.finish_reason is None:
            self.finish_reason = "length"
        if self._criteria is not None and self._last_row is not None and self._criteria(
                self._evaluated_ids(), self._last_row):
            self.finish_reason = "stop"
        return self._take(len(self.text)) if self.stream else b""

    def _take(self, upto: int) -> bytes:
        if upto <= self._streamed:
            return b""
        out = self.text[self._streamed: upto]
        self._streamed = upto
        return out

    def _evaluated_ids(self) -> np.ndarray:
        """The prompt and the tokens taken so far, as one int array (grown, never rebuilt)."""
        n = self._n_prompt + len(self.tokens)
        if len(self._ids) < n:
            grown = np.zeros(max(n, 2 * len(self._ids), 16), dtype=np.intc)
            grown[: self._n_filled] = self._ids[: self._n_filled]
            self._ids = grown
        self._ids[self._n_filled: n] = self.tokens[self._n_filled - self._n_prompt:]
        self._n_filled = n
        return self._ids[:n]
