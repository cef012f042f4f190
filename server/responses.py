"""Answering a queued job: a JSON response, or server-sent events ending with `data: [DONE]`,
and OpenAI's whole-response and usage shapes made from the library's chunks."""
from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Iterator

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .decoder import CHUNK, END, ERROR, Job
from .protocol import usage_block
from .state import ServerState


async def first_item(job: Job, request: Request) -> tuple[str, Any]:
    """The job's first item; a client leaving meanwhile cancels the job."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel()

    watcher = asyncio.create_task(watch())
    try:
        return await job.get()
    finally:
        watcher.cancel()


async def respond(job: Job, request: Request, stream: bool) -> Response:
    """The job's answer: its whole response, or (stream) its chunks as server-sent events."""
    kind, item = await first_item(job, request)
    if kind == ERROR:
        raise item
    if kind == END:  # cancelled before it produced anything: nobody is listening
        return Response(status_code=499)
    if not stream:
        return JSONResponse(item)

    async def events():
        try:
            yield json.dumps(item, ensure_ascii=False)
            while True:
                kind, chunk = await job.get()
                if kind == CHUNK:
                    yield json.dumps(chunk, ensure_ascii=False)
                elif kind == ERROR:
                    yield json.dumps(chunk.body(), ensure_ascii=False)
                    break
                else:
                    break
            yield "[DONE]"
        finally:
            job.cancel()  # the client went away (or the stream ended): stop at the next step

    return EventSourceResponse(events(), sep="\n", ping=15)


def chat_chunk_text(chunk: dict) -> str:
    return (chunk["choices"][0].get("delta") or {}).get("content") or "" if chunk["choices"] else ""


def completion_chunk_text(chunk: dict) -> str:
    return chunk["choices"][0].get("text") or "" if chunk["choices"] else ""


def finish_result(state: ServerState, result: dict) -> dict:
    """The library's whole response with OpenAI's usage block."""
    usage = result.get("usage") or {}
    result["model"] = state.config.model_id
    result["usage"] = usage_block(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                                  result.get("speculation"))
    return result


def whole_response(state: ServerState, chunks: list[dict], chat: bool, echo_text: str = "") -> dict:
    """The response a non-streamed call of the library gives, from its stream's chunks."""
    first, last = chunks[0], chunks[-1]
    finish = next((c["choices"][0].get("finish_reason") for c in reversed(chunks)
                   if c["choices"] and c["choices"][0].get("finish_reason")), None)
    if chat:
        text = "".join(chat_chunk_text(c) for c in chunks)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
    else:
        text = echo_text + "".join(completion_chunk_text(c) for c in chunks)
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    return finish_result(state, {"id": first["id"], "object": "chat.completion" if chat else "text_completion",
                                 "created": first["created"], "model": state.config.model_id, "choices": [choice],
                                 "usage": last.get("usage"), "speculation": last.get("speculation")})


def stream_with_usage(state: ServerState, chunks: Iterator[dict], include_usage: bool,
                      text_of: Callable[[dict], str], skip_first: bool = False) -> Iterator[dict]:
    """The library's chunks, then (include_usage) OpenAI's last chunk: no choices, the usage.

    Runs in the decoding thread. The completion tokens are counted by tokenizing the text
    streamed, unless the library's last chunk carries its own `usage`.
    """
    model_id = state.config.model_id
    texts: list[str] = []
    last: dict | None = None
    speculation: dict | None = None
    library_usage: dict | None = None
    try:
        for i, chunk in enumerate(chunks):
            chunk["model"] = model_id
            if not (skip_first and i == 0):
                texts.append(text_of(chunk))
            speculation = chunk.get("speculation") or speculation
            library_usage = chunk.pop("usage", None) or library_usage
            if include_usage:
                chunk["usage"] = None
            last = chunk
            yield chunk
    finally:  # closed early (the client left): close the library's stream now, in this thread
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    if include_usage and last is not None:
        if library_usage is not None:
            prompt_tokens, completion_tokens = library_usage["prompt_tokens"], library_usage["completion_tokens"]
        else:
            prompt_tokens = (speculation or {}).get("prompt_tokens", 0)
            completion_tokens = state.count_tokens("".join(texts))
        yield {"id": last["id"], "object": last["object"], "created": last["created"], "model": model_id,
               "choices": [], "usage": usage_block(prompt_tokens, completion_tokens, speculation)}
