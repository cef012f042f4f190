"""What every route of one app shares: the settings, the wrapper, the decoding thread.

One `ServerState` per app, at `app.state.server` (`state_of(request)`). The routes are
module-level functions that read it; nothing here parses a request or shapes a response.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from starlette.requests import Request

from lookahead.sampling import FRONT_END_DEFAULTS, SamplingParams

from .decoder import Decoder, Job, QueueFull
from .errors import library_error
from .protocol import APIError

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass
class ServerConfig:
    model_id: str  # the name /v1/models lists and requests may name
    aliases: tuple[str, ...] = ()  # other names accepted for it (the file name, its path)
    api_key: str | None = None
    max_queue: int = 8
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # What a request gets for the sampling fields it leaves out (the `serve` command's options)
    sampling: SamplingParams = FRONT_END_DEFAULTS
    max_tokens: int | None = None  # the default output limit; None: up to the end of the context
    created: int = field(default_factory=lambda: int(time.time()))


class ServerState:
    """The app's wrapper (`fast`, a `lookahead.Lookahead`), its `config`, and the `decoder`
    thread that runs one request at a time."""

    def __init__(self, fast: Any, config: ServerConfig):
        self.fast = fast
        self.config = config
        self.n_ctx = int(fast.n_ctx)
        self.n_vocab = int(fast.n_vocab)
        self.model_names = {config.model_id, *config.aliases}
        self.decoder = Decoder(config.max_queue, self.error_of)
        self.unavailable: str | None = None  # why every request now fails (a lost RPC server)

    def error_of(self, e: Exception) -> APIError:
        """The OpenAI error for an exception raised while a request runs."""
        error = library_error(e, self.n_ctx)
        if error.status == 503:
            self.unavailable = error.message
        return error

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` by the wrapper's one rule (`Lookahead.count_tokens`)."""
        return self.fast.count_tokens(text) if text else 0

    def library_chunks(self, call: Callable[[], Iterator[dict]], cache_prompt: bool) -> Iterator[dict]:
        """The library's stream for one request, started in the decoding thread. With
        `cache_prompt` off it starts from an empty KV cache and skips the saved prefix states."""
        if cache_prompt:
            yield from call()
            return
        with self.fast.prompt_cache_off():
            yield from call()  # closing this generator closes the library's stream

    def submit(self, run: Callable[..., Any], collect: Callable[[list], dict] | None = None,
               with_job: bool = False) -> Job:
        """Queue a job; `collect`: a non-streamed request, whose response is built from its chunks
        in the decoding thread (so that a client leaving stops it, as it stops a stream).
        `with_job`: `run` is called with the job (to watch `job.cancelled` itself)."""
        job = Job(run, asyncio.get_running_loop(), collect)
        if with_job:
            job.run = lambda: run(job)
        try:
            self.decoder.submit(job)
        except QueueFull as e:
            raise APIError(429, f"the server is busy: {self.decoder.max_queue} requests are already waiting "
                                f"(lookahead serve --max-queue); retry in {e.retry_after_s} s",
                           type="requests", code="rate_limit_exceeded",
                           headers={"Retry-After": str(e.retry_after_s)}) from None
        return job


def state_of(request: Request) -> ServerState:
    return request.app.state.server
