"""A request's stream as `Lookahead` hands it out: the chunk iterator with its stats, the
clock of the library's own time, and the helpers that put the stats on the last chunk."""
from __future__ import annotations

import time
from typing import Callable, Iterator

from .stats import SpeculationStats


class Clock:
    """The library's own time for one request (`speculation["request_ms"]`): it runs from the
    call until the call returns, then, for a stream, only while the next chunk is being made,
    so the time the consumer spends between chunks (a server writing them out) is not counted."""

    def __init__(self):
        self._ms = 0.0
        self._since: float | None = time.perf_counter()

    def pause(self) -> None:
        if self._since is not None:
            self._ms += 1000 * (time.perf_counter() - self._since)
            self._since = None

    def resume(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def ms(self) -> float:
        running = 1000 * (time.perf_counter() - self._since) if self._since is not None else 0.0
        return self._ms + running


class CompletionStream:
    """A streamed response: an iterator of llama-cpp-python's chunks (the last one carries the
    `speculation` stats), whose `speculation` property gives the request's stats at any time,
    also after `close()` ends it early (generation stops at the next step)."""

    def __init__(self, chunks: Iterator[dict], speculation: Callable[[], dict | None], clock: Clock | None = None):
        self._chunks = chunks
        self._speculation = speculation
        self._clock = clock
        if clock is not None:
            clock.pause()  # the call returns: the consumer's time starts

    def __iter__(self) -> "CompletionStream":
        return self

    def __next__(self) -> dict:
        if self._clock is None:
            return next(self._chunks)
        self._clock.resume()
        try:
            return next(self._chunks)
        finally:
            self._clock.pause()

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()

    @property
    def speculation(self) -> dict | None:
        return self._speculation()


class closing:
    """Close a generator when the block ends, however it ends (a stream closed early, too)."""

    def __init__(self, gen):
        self.gen = gen

    def __enter__(self):
        return self.gen

    def __exit__(self, *exc):
        close = getattr(self.gen, "close", None)
        if close is not None:
            close()
        return False


def recording_speculation(chunks: Iterator[dict], captured: list[dict], usage: list[dict]) -> Iterator[dict]:
    """Pass a completion stream through, noting its stats and usage (the last chunk's)."""
    with closing(chunks):
        for item in chunks:
            if isinstance(item, dict) and "speculation" in item:
                captured.append(item["speculation"])
            if isinstance(item, dict) and "usage" in item:
                usage.append(item["usage"])
            yield item


def may_be_last(chunk: dict) -> bool:
    """Whether a stream chunk can be its last: one that ends a choice (a `finish_reason`), or
    one without choices. A chunk of text in the middle of a choice never is."""
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return not choices or any(c.get("finish_reason") is not None for c in choices)


def with_speculation_last(chunks: Iterator[dict], captured: list[dict], t0: float | None = None,
                           stats: SpeculationStats | None = None,
                           usage: list[dict] | None = None, clock: Clock | None = None) -> Iterator[dict]:
    """Yield the chunks; the last one gets the request's stats (`captured[-1]`, with the
    request's time on `clock`) and, when the stream's own chunks dropped it, its usage.

    Only a chunk that may be the last (`may_be_last`: a stream ends with its finish_reason) is
    held until the next one comes; text is passed on as soon as it is made."""
    with closing(chunks):
        previous = None
        for item in chunks:
            if previous is not None:
                yield previous
                previous = None
            if may_be_last(item):
                previous = item
            else:
                yield item
    if previous is not None:
        if stats is not None and t0 is not None:
            stats.total_ms = 1000 * (time.perf_counter() - t0)
            captured = [stats.to_dict()]
        speculation = captured[-1] if captured else None
        if speculation is not None and clock is not None:
            speculation = {**speculation, "request_ms": round(clock.ms(), 3)}
        previous["speculation"] = speculation
        if usage and "usage" not in previous:
            previous["usage"] = usage[-1]
        yield previous
