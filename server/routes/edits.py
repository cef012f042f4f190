"""POST /v1/lookahead/edits: `lookahead.edit.rewrite` of a buffer, or a region of it, over HTTP.

A buffer, an instruction and optionally a region in; the new region text out, streamed as
`lookahead.edit.chunk` events and then one `lookahead.edit` event with the result (or, not
streamed, that result alone, with the whole `document`).
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Iterator

from starlette.requests import Request
from starlette.responses import Response

from ..checks import authorize, check_model, read_body, sampling_of
from ..decoder import Job
from ..protocol import APIError, EditRequest, parse_request, usage_block
from ..responses import respond
from ..state import ServerState, state_of


async def edits(request: Request) -> Response:
    state = state_of(request)
    authorize(state, request)
    req = parse_request(EditRequest, await read_body(state, request))
    check_model(state, req.model)
    if not req.instruction.strip():
        raise APIError(400, "'instruction' is empty: say what to change, e.g. \"Fix the typos\"",
                       param="instruction", code="invalid_value")
    region = req.checked_region()
    if req.max_tokens is not None and req.max_tokens < 1:
        raise APIError(400, f"invalid 'max_tokens': {req.max_tokens}; expected an integer >= 1 (the most tokens "
                            "the whole rewrite may generate; without it each piece is bounded by its length)",
                       param="max_tokens", code="invalid_value")
    sampling: dict[str, Any] = dict(**sampling_of(state, req), seed=req.seed)
    if req.speculate is not None:
        sampling["speculate"] = req.speculate
    if req.references:
        sampling["references"] = [r for r in req.references if r]  # other open buffers
    whole = not req.stream

    def run(job: Job) -> Iterator[dict | None]:
        return state.library_chunks(lambda: edit_events(state, job.cancelled, req, region, sampling, whole),
                                    req.cache_prompt is not False)

    if whole:
        return await respond(state.submit(run, lambda kept: kept[-1], with_job=True), request, False)
    return await respond(state.submit(run, with_job=True), request, True)


def edit_events(state: ServerState, cancelled: threading.Event, req: EditRequest, region: tuple[int, int],
                sampling: dict, whole: bool) -> Iterator[dict | None]:
    """The events of one edit, made in the decoding thread: a `lookahead.edit.chunk` per piece of
    new text, then the `lookahead.edit` result (with `text` and `document` when `whole`)."""
    from lookahead import edit

    head = {"id": f"edit-{uuid.uuid4().hex}", "object": "lookahead.edit.chunk", "created": int(time.time()),
            "model": state.config.model_id}
    try:
        rw = edit.rewrite(StopWhenCancelled(state.fast, cancelled), req.text, req.instruction, region=region,
                          filename=req.filename, max_tokens=req.max_tokens, **sampling)
    except ValueError as e:  # the fields are checked: the instruction leaves the text no room
        raise APIError(400, f"{e}: this server's context holds {state.n_ctx} tokens; shorten the instruction or "
                            "restart the server with a larger --n-ctx", param="instruction",
                       code="context_length_exceeded") from None
    try:
        for piece in rw:
            yield {**head, "piece": rw.piece, "text": piece}
    except Cancelled:  # the client left: the rewrite stopped at its next model step
        yield None  # the decoder sees the cancellation and counts it
        return
    finally:
        rw.close()  # closes the model's stream (a client leaving between pieces of text)
    result = rw.result
    spec = result.speculation
    fields = {"text": result.text, "document": result.document} if whole else {}
    fields.update(
        finish_reason=result.finish_reason, warnings=list(result.warnings),
        lines_kept=round(result.lines_kept, 4), length_ratio=round(result.length_ratio, 4),
        diverged=result.diverged, region=list(result.region),
        pieces=[{"start": p.start, "end": p.end, "finish_reason": p.finish_reason} for p in result.pieces],
        speculation=spec,
        usage=usage_block(spec.get("prompt_tokens", 0), spec.get("generated_tokens", 0), spec))
    yield {**head, "object": "lookahead.edit", **fields}


class Cancelled(Exception):
    """The client of an edit left: raised in the model's stream to end the rewrite there."""


class StopWhenCancelled:
    """A `Lookahead` as `lookahead.edit.rewrite` uses it, whose chat streams end at the first model
    step after `cancelled` is set (raising `Cancelled`; the rewrite closes the stream).

    Waiting for the rewrite's next piece of text would not do: it holds lines back while they
    might start a loop, and a piece's answer may be chatter it drops.
    """

    def __init__(self, fast: Any, cancelled: threading.Event):
        self._fast = fast
        self._cancelled = cancelled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fast, name)

    def create_chat_completion(self, *args: Any, **kwargs: Any) -> "CancellableStream":
        if self._cancelled.is_set():  # before the next piece's prefill
            raise Cancelled
        return CancellableStream(self._fast.create_chat_completion(*args, **kwargs), self._cancelled)


class CancellableStream:
    """The library's chat stream, ending with `Cancelled` before the step after a cancellation."""

    def __init__(self, stream: Any, cancelled: threading.Event):
        self._stream = stream
        self._chunks = iter(stream)
        self._cancelled = cancelled

    def __iter__(self) -> "CancellableStream":
        return self

    def __next__(self) -> dict:
        if self._cancelled.is_set():
            raise Cancelled
        return next(self._chunks)

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()

    @property
    def speculation(self) -> dict | None:  # the stats so far (what the rewrite reads from a closed stream)
        return getattr(self._stream, "speculation", None)
