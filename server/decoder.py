"""One thread owns the Llama: requests are decoded one at a time, from a bounded queue.

A request is a `Job`: a function that runs in the decoding thread and returns either a dict
(a whole response) or an iterator of chunks (a `None` item is not sent: a job that notices
its cancellation itself yields one, so that it is stopped and counted like the others). A
stream's chunks are handed to the event loop through an asyncio queue, one at a time, so
the HTTP side never blocks on the model; a job with `collect` keeps its chunks in the
decoding thread and hands over `collect(chunks)`, the whole response, at the end (a
non-streamed request: decoded as a stream so that it can be stopped). `Job.cancel()` (the
client went away) is seen by the decoding thread after the next chunk: the iterator is
closed there, which stops the library's generation at its next step and leaves the KV cache
consistent for the next request.
"""
from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from typing import Any, Callable, Iterator

from .protocol import APIError

log = logging.getLogger("lookahead.server")

CHUNK, RESULT, END, ERROR = "chunk", "result", "end", "error"


class QueueFull(Exception):
    """More requests are waiting than the queue holds."""

    def __init__(self, retry_after_s: int):
        super().__init__(f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Job:
    """One request on its way through the decoding thread."""

    def __init__(self, run: Callable[[], dict | Iterator[Any]], loop: asyncio.AbstractEventLoop,
                 collect: Callable[[list], dict] | None = None):
        self.run = run
        self.collect = collect  # chunks -> the whole response (a non-streamed request), or None
        self.cancelled = threading.Event()
        self._loop = loop
        self._items: asyncio.Queue = asyncio.Queue()

    def cancel(self) -> None:
        self.cancelled.set()

    def put(self, kind: str, item: Any = None) -> None:
        """Called from the decoding thread."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, (kind, item))
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self.cancel()

    async def get(self) -> tuple[str, Any]:
        """The next (kind, item): (CHUNK, chunk), (RESULT, dict), (END, None) or (ERROR, APIError)."""
        return await self._items.get()


class Decoder:
    """The decoding thread and its bounded queue.

    One job decodes while up to `max_queue` wait; a job beyond that is refused with
    `QueueFull`, whose `retry_after_s` estimates from recent request times when a place frees
    up. `error_of(exception)` turns an exception raised by a job into the APIError to answer.
    """

    def __init__(self, max_queue: int, error_of: Callable[[Exception], APIError]):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_queue = max_queue
        self._error_of = error_of
        self._jobs: "queue.Queue[Job | None]" = queue.Queue()
        self._lock = threading.Lock()
        self._admitted = 0  # waiting + decoding
        self.decoding = 0
        self.served = 0
        self.cancelled = 0
        self.rejected = 0
        self.mean_request_s = 1.0  # moving average of request times, for Retry-After
        self._thread = threading.Thread(target=self._loop, name="lookahead-decoder", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._admitted - self.decoding

    def submit(self, job: Job) -> None:
        """Queue a job, or raise QueueFull."""
        with self._lock:
            if self._admitted >= self.max_queue + 1:
                self.rejected += 1
                raise QueueFull(max(1, math.ceil(self.mean_request_s * (self._admitted - self.decoding + 1))))
            self._admitted += 1
        self._jobs.put(job)

    def close(self) -> None:
        """Stop the thread once the jobs already queued are done."""
        self._jobs.put(None)
        self._thread.join(timeout=30)

    # ---- the decoding thread ---------------------------------------------------------------
    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            self.decoding = 1
            t0 = time.perf_counter()
            try:
                if job.cancelled.is_set():  # its client left while it waited
                    job.put(END)
                else:
                    self._run(job)
                    self.served += 1
                    self.mean_request_s = 0.7 * self.mean_request_s + 0.3 * (time.perf_counter() - t0)
            finally:
                with self._lock:
                    self._admitted -= 1
                    self.decoding = 0

    def _run(self, job: Job) -> None:
        try:
            out = job.run()
            if isinstance(out, dict):
                job.put(RESULT, out)
                return
            chunks = iter(out)
            kept: list[Any] = []
            try:
                for chunk in chunks:
                    if chunk is None:
                        pass
                    elif job.collect is None:
                        job.put(CHUNK, chunk)
                    else:
                        kept.append(chunk)
                    if job.cancelled.is_set():
                        self.cancelled += 1
                        log.info("client disconnected: generation stopped")
                        break
                else:
                    if job.collect is not None:
                        job.put(RESULT, job.collect(kept))
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # stops the library's generator at its next step
            job.put(END)
        except Exception as e:  # noqa: BLE001 - every failure is answered, the thread lives on
            error = self._error_of(e)
            if error.status >= 500:
                log.exception("request failed")
            job.put(ERROR, error)
