"""The ASGI app: OpenAI's /v1/chat/completions, /v1/completions, /v1/models, and /health, and
lookahead's /v1/lookahead/edits.

A thin front end over `lookahead.Lookahead`: requests are validated (`protocol`), turned into
the library's `create_chat_completion` / `create_completion` arguments, decoded one at a time
(`decoder`), and answered in OpenAI's shapes: JSON, or server-sent events ending with
`data: [DONE]`. `prediction` becomes a reference for its request; the usage block counts the
prediction tokens the verifier accepted and rejected; the library's speculation stats go in
a `speculation` field, which OpenAI clients ignore.

/v1/lookahead/edits is the editing API (`lookahead.edit.rewrite`) over HTTP: a buffer, an
instruction and optionally a region in; the new region text out, streamed as
`lookahead.edit.chunk` events and then one `lookahead.edit` event with the result.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lookahead.adapters.llama_cpp import prompt_cache_off

from .decoder import CHUNK, END, ERROR, Decoder, Job, QueueFull
from .protocol import (APIError, ChatRequest, CompletionRequest, EditRequest, parse_json_body, parse_request,
                       usage_block)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass
class SamplingDefaults:
    """What a request gets for the fields it leaves out (the `serve` command's options)."""

    temperature: float = 0.0
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    max_tokens: int | None = None  # None: up to the end of the context


@dataclass
class ServerConfig:
    model_id: str  # the name /v1/models lists and requests may name
    aliases: tuple[str, ...] = ()  # other names accepted for it (the file name, its path)
    api_key: str | None = None
    max_queue: int = 8
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    created: int = field(default_factory=lambda: int(time.time()))


def sampling_of(req: Any, defaults: SamplingDefaults) -> dict[str, Any]:
    """The sampling arguments of a request (chat, completion or edit), the server's defaults
    filling what it leaves out."""
    return dict(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        top_k=defaults.top_k if req.top_k is None else req.top_k,
        min_p=defaults.min_p if req.min_p is None else req.min_p,
        repeat_penalty=defaults.repeat_penalty if req.repeat_penalty is None else req.repeat_penalty,
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
    )


def library_error(e: Exception, n_ctx: int) -> APIError:
    """The OpenAI error for an exception raised while a request runs."""
    if isinstance(e, APIError):
        return e
    message = str(e)
    if isinstance(e, ValueError) and ("context window" in message or "does not fit the context" in message):
        return APIError(400, f"{message}: this server's context holds {n_ctx} tokens (prompt and completion); "
                             "shorten the prompt or restart the server with a larger --n-ctx",
                        code="context_length_exceeded")
    if isinstance(e, (ValueError, TypeError)):
        return APIError(400, message or type(e).__name__)
    return APIError(500, f"internal error: {type(e).__name__}: {message}", type="server_error")


def create_app(fast: Any, config: ServerConfig) -> Starlette:
    """The app serving `fast` (a `lookahead.Lookahead`) with the settings in `config`."""
    n_ctx = int(fast.llm.n_ctx())
    n_vocab = int(fast.llm.n_vocab())
    model_names = {config.model_id, *config.aliases}
    defaults = config.defaults
    decoder = Decoder(config.max_queue, lambda e: library_error(e, n_ctx))

    def count_tokens(text: str) -> int:
        return len(fast.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)) if text else 0

    # ---- checks shared by both endpoints -----------------------------------------------------
    def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise APIError(401, "missing API key: send the header 'Authorization: Bearer <key>' "
                                "(the key given to `lookahead serve --api-key`)", code="invalid_api_key")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
            raise APIError(401, "incorrect API key in the Authorization header", code="invalid_api_key")

    async def read_body(request: Request) -> dict:
        limit = config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"request body of {int(declared)} bytes exceeds this server's limit of {limit} "
                                "bytes (lookahead serve --max-body-mib)", code="request_too_large")
        parts, size = [], 0
        try:
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise APIError(413, f"request body exceeds this server's limit of {limit} bytes "
                                        "(lookahead serve --max-body-mib)", code="request_too_large")
                parts.append(part)
        except ClientDisconnect:
            raise APIError(400, "the client disconnected while sending the body") from None
        return parse_json_body(b"".join(parts))

    def check_model(name: str | None) -> None:
        if name is not None and name not in model_names:
            raise APIError(404, f"the model {name!r} does not exist: this server serves {config.model_id!r} "
                                "(see GET /v1/models)", param="model", code="model_not_found")

    def refuse(param: str, why: str) -> APIError:
        return APIError(400, f"'{param}' is not supported by lookahead: {why}", param=param,
                        code="unsupported_parameter")

    def max_tokens_of(req: Any) -> int | None:
        given = {name: getattr(req, name) for name in ("max_completion_tokens", "max_tokens")
                 if getattr(req, name, None) is not None}
        if len(set(given.values())) > 1:
            raise APIError(400, f"'max_tokens' ({req.max_tokens}) and 'max_completion_tokens' "
                                f"({req.max_completion_tokens}) disagree; give one of them",
                           param="max_tokens", code="invalid_value")
        name, value = next(iter(given.items()), ("max_tokens", defaults.max_tokens))
        if value is not None and not 1 <= value <= n_ctx:
            raise APIError(400, f"invalid '{name}': {value}; expected an integer from 1 to {n_ctx}, this "
                                "server's context size", param=name, code="invalid_value")
        return value

    def library_kwargs(req: Any) -> dict:
        check_model(req.model)
        if req.n not in (None, 1):
            raise refuse("n", f"one choice per request (n=1), got n={req.n}")
        if req.logit_bias:
            raise refuse("logit_bias", "token biases are not implemented")
        if req.logprobs not in (None, False):  # llama-cpp-python computes them only with logits_all=True
            raise refuse("logprobs", "this server's Llama keeps no logits for every position (logits_all=False)")
        kwargs: dict[str, Any] = dict(
            max_tokens=max_tokens_of(req),
            **sampling_of(req, defaults),
            stop=req.stop_list(),
            seed=req.seed,
            stream=True,  # a non-streamed request is assembled from the chunks (see `submit`)
            model=config.model_id,
        )
        if req.speculate is not None:
            kwargs["speculate"] = req.speculate
        references = [r for r in (req.references or []) if r]
        prediction = req.prediction.text() if req.prediction is not None else ""
        if prediction:
            kwargs["prediction"] = prediction  # a reference whose drafts are counted apart
        kwargs["references"] = references
        return kwargs

    # ---- running a request -------------------------------------------------------------------
    def library_chunks(call: Callable[[], Iterator[dict]], cache_prompt: bool) -> Iterator[dict]:
        """The library's stream for one request, started in the decoding thread. With
        `cache_prompt` off it starts from an empty KV cache and skips the saved prefix states."""
        if cache_prompt:
            yield from call()
            return
        with prompt_cache_off(fast.llm):
            yield from call()  # closing this generator closes the library's stream

    def submit(run: Callable[..., Any], collect: Callable[[list], dict] | None = None, with_job: bool = False) -> Job:
        """Queue a job; `collect`: a non-streamed request, whose response is built from its chunks
        in the decoding thread (so that a client leaving stops it, as it stops a stream).
        `with_job`: `run` is called with the job (to watch `job.cancelled` itself)."""
        job = Job(run, asyncio.get_running_loop(), collect)
        if with_job:
            job.run = lambda: run(job)
        try:
            decoder.submit(job)
        except QueueFull as e:
            raise APIError(429, f"the server is busy: {decoder.max_queue} requests are already waiting "
                                f"(lookahead serve --max-queue); retry in {e.retry_after_s} s",
                           type="requests", code="rate_limit_exceeded",
                           headers={"Retry-After": str(e.retry_after_s)}) from None
        return job

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
        kind, item = await first_item(job, request)
        if kind == ERROR:
            raise item
        if kind == END:  # cancelled before it produced anything: nobody is listening
            return Response(status_code=499)
        if not stream:
            return JSONResponse(item)
        from sse_starlette import EventSourceResponse

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

    def finish_result(result: dict) -> dict:
        """The library's whole response with OpenAI's usage block."""
        usage = result.get("usage") or {}
        result["model"] = config.model_id
        result["usage"] = usage_block(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                                      result.get("speculation"))
        return result

    def whole_response(chunks: list[dict], chat: bool, echo_text: str = "") -> dict:
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
        return finish_result({"id": first["id"], "object": "chat.completion" if chat else "text_completion",
                              "created": first["created"], "model": config.model_id, "choices": [choice],
                              "usage": last.get("usage"), "speculation": last.get("speculation")})

    def stream_with_usage(chunks: Iterator[dict], include_usage: bool, text_of: Callable[[dict], str],
                          skip_first: bool = False) -> Iterator[dict]:
        """The library's chunks, then (include_usage) OpenAI's last chunk: no choices, the usage.

        Runs in the decoding thread. The completion tokens are counted by tokenizing the text
        streamed, unless the library's last chunk carries its own `usage`.
        """
        texts: list[str] = []
        last: dict | None = None
        speculation: dict | None = None
        library_usage: dict | None = None
        try:
            for i, chunk in enumerate(chunks):
                chunk["model"] = config.model_id
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
                completion_tokens = count_tokens("".join(texts))
            yield {"id": last["id"], "object": last["object"], "created": last["created"], "model": config.model_id,
                   "choices": [], "usage": usage_block(prompt_tokens, completion_tokens, speculation)}

    # ---- endpoints -----------------------------------------------------------------------------
    async def chat_completions(request: Request) -> Response:
        authorize(request)
        req = parse_request(ChatRequest, await read_body(request))
        kwargs = library_kwargs(req)
        for param in ("tools", "functions"):
            if getattr(req, param):
                raise refuse(param, "tool and function calls are not implemented; send plain messages")
        if req.tool_choice not in (None, "none"):
            raise refuse("tool_choice", "tool calls are not implemented")
        if req.function_call not in (None, "none"):
            raise refuse("function_call", "function calls are not implemented")
        if req.response_format is not None and req.response_format.get("type") not in (None, "text"):
            raise refuse("response_format", f"only {{'type': 'text'}}, got {req.response_format.get('type')!r}")
        if req.modalities is not None and list(req.modalities) != ["text"]:
            raise refuse("modalities", f"text output only, got {req.modalities}")
        if req.audio is not None:
            raise refuse("audio", "text output only")
        if req.top_logprobs:
            raise refuse("top_logprobs", "this server's Llama keeps no logits for every position (logits_all=False)")
        kwargs["messages"] = chat_messages(req)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = lambda: library_chunks(lambda: fast.create_chat_completion(**kwargs), req.cache_prompt is not False)
        if not req.stream:
            return await respond(submit(chunks, lambda kept: whole_response(kept, chat=True)), request, False)
        return await respond(submit(lambda: stream_with_usage(chunks(), include_usage, chat_chunk_text)), request, True)

    async def completions(request: Request) -> Response:
        authorize(request)
        req = parse_request(CompletionRequest, await read_body(request))
        kwargs = library_kwargs(req)
        if req.best_of not in (None, 1):
            raise refuse("best_of", f"one candidate per request, got best_of={req.best_of}")
        if req.suffix:
            raise refuse("suffix", "fill-in-the-middle suffixes are not implemented; put the FIM markers "
                                   "of your model in 'prompt'")
        prompt = req.prompt
        if isinstance(prompt, list):
            if not prompt:
                raise APIError(400, "'prompt' is an empty list", param="prompt", code="invalid_value")
            if all(isinstance(p, str) for p in prompt):
                if len(prompt) > 1:
                    raise refuse("prompt", f"one prompt per request, got a list of {len(prompt)}")
                prompt = prompt[0]
            else:
                bad = next((t for t in prompt if not 0 <= t < n_vocab), None)
                if bad is not None:
                    raise APIError(400, f"token id {bad} in 'prompt' is outside the vocabulary (0..{n_vocab - 1})",
                                   param="prompt", code="invalid_value")
        kwargs.update(prompt=prompt, echo=bool(req.echo))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        echoed = bool(req.echo) and isinstance(prompt, str) and bool(prompt)
        chunks = lambda: library_chunks(lambda: fast.create_completion(**kwargs), req.cache_prompt is not False)
        if not req.stream:
            def collect(kept: list[dict]) -> dict:  # echo: the prompt before the text, as the library does
                echo_text = "" if not req.echo else prompt if isinstance(prompt, str) else b"".join(
                    fast.target.piece(int(t)) for t in prompt).decode("utf-8", errors="ignore")
                return whole_response(kept, chat=False, echo_text=echo_text)

            return await respond(submit(chunks, collect), request, False)
        return await respond(submit(lambda: stream_with_usage(chunks(), include_usage, completion_chunk_text,
                                                              skip_first=echoed)), request, True)

    def edit_events(cancelled: threading.Event, req: EditRequest, region: tuple[int, int], sampling: dict,
                    whole: bool) -> Iterator[dict | None]:
        """The events of one edit, made in the decoding thread: a `lookahead.edit.chunk` per piece of
        new text, then the `lookahead.edit` result (with `text` and `document` when `whole`)."""
        from lookahead import edit

        head = {"id": f"edit-{uuid.uuid4().hex}", "object": "lookahead.edit.chunk", "created": int(time.time()),
                "model": config.model_id}
        try:
            rw = edit.rewrite(_StopWhenCancelled(fast, cancelled), req.text, req.instruction, region=region,
                              filename=req.filename, max_tokens=req.max_tokens, **sampling)
        except ValueError as e:  # the fields are checked: the instruction leaves the text no room
            raise APIError(400, f"{e}: this server's context holds {n_ctx} tokens; shorten the instruction or "
                                "restart the server with a larger --n-ctx", param="instruction",
                           code="context_length_exceeded") from None
        try:
            for piece in rw:
                yield {**head, "piece": rw.piece, "text": piece}
        except _Cancelled:  # the client left: the rewrite stopped at its next model step
            yield None  # the decoder sees the cancellation and counts it
            return
        finally:
            rw.close()  # closes the model's stream (a client leaving between pieces of text)
        result = rw.result
        spec = result.speculation
        fields = {"text": result.text, "document": result.document} if whole else {}
        fields.update(
            finish_reason=result.finish_reason, warnings=list(result.warnings),
            lines_kept=round(result.lines_kept, 4), diverged=result.diverged, region=list(result.region),
            pieces=[{"start": p.start, "end": p.end, "finish_reason": p.finish_reason} for p in result.pieces],
            speculation=spec,
            usage=usage_block(spec.get("prompt_tokens", 0), spec.get("generated_tokens", 0), spec))
        yield {**head, "object": "lookahead.edit", **fields}

    async def edits(request: Request) -> Response:
        """POST /v1/lookahead/edits: `lookahead.edit.rewrite` of a buffer, or a region of it."""
        authorize(request)
        req = parse_request(EditRequest, await read_body(request))
        check_model(req.model)
        if not req.instruction.strip():
            raise APIError(400, "'instruction' is empty: say what to change, e.g. \"Fix the typos\"",
                           param="instruction", code="invalid_value")
        region = req.checked_region()
        if req.max_tokens is not None and req.max_tokens < 1:
            raise APIError(400, f"invalid 'max_tokens': {req.max_tokens}; expected an integer >= 1 (the most tokens "
                                "the whole rewrite may generate; without it each piece is bounded by its length)",
                           param="max_tokens", code="invalid_value")
        sampling: dict[str, Any] = dict(
            **sampling_of(req, defaults),
            seed=req.seed,
        )
        if req.speculate is not None:
            sampling["speculate"] = req.speculate
        if req.references:
            sampling["references"] = [r for r in req.references if r]  # other open buffers
        whole = not req.stream

        def run(job: Job) -> Iterator[dict | None]:
            return library_chunks(lambda: edit_events(job.cancelled, req, region, sampling, whole),
                                  req.cache_prompt is not False)

        if whole:
            return await respond(submit(run, lambda kept: kept[-1], with_job=True), request, False)
        return await respond(submit(run, with_job=True), request, True)

    def model_card() -> dict:
        return {"id": config.model_id, "object": "model", "created": config.created, "owned_by": "lookahead",
                "n_ctx": n_ctx}

    async def list_models(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def get_model(request: Request) -> Response:
        authorize(request)
        check_model(request.path_params["model"])
        return JSONResponse(model_card())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": config.model_id, "n_ctx": n_ctx,
                             "decoding": decoder.decoding, "waiting": decoder.waiting,
                             "max_queue": decoder.max_queue, "served": decoder.served,
                             "cancelled": decoder.cancelled, "rejected": decoder.rejected})

    # ---- errors ------------------------------------------------------------------------------
    async def on_api_error(request: Request, e: APIError) -> Response:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    async def on_http_error(request: Request, e: HTTPException) -> Response:
        if e.status_code == 404:
            message = f"unknown endpoint: {request.method} {request.url.path} (this server has /v1/chat/completions, " \
                      "/v1/completions, /v1/models, /v1/lookahead/edits, /health)"
        elif e.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(e.detail)
        return JSONResponse(APIError(e.status_code, message).body(), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    async def on_crash(request: Request, e: Exception) -> Response:
        return JSONResponse(library_error(e, n_ctx).body(), status_code=500)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/lookahead/edits", edits, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.get_running_loop().run_in_executor(None, decoder.close)  # finish the queued jobs

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: on_api_error, HTTPException: on_http_error, Exception: on_crash})
    app.state.decoder = decoder
    return app


class _Cancelled(Exception):
    """The client of an edit left: raised in the model's stream to end the rewrite there."""


class _StopWhenCancelled:
    """A `Lookahead` as `lookahead.edit.rewrite` uses it, whose chat streams end at the first model
    step after `cancelled` is set (raising `_Cancelled`; the rewrite closes the stream).

    Waiting for the rewrite's next piece of text would not do: it holds lines back while they
    might start a loop, and a piece's answer may be chatter it drops.
    """

    def __init__(self, fast: Any, cancelled: threading.Event):
        self._fast = fast
        self._cancelled = cancelled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fast, name)

    def create_chat_completion(self, *args: Any, **kwargs: Any) -> "_CancellableStream":
        if self._cancelled.is_set():  # before the next piece's prefill
            raise _Cancelled
        return _CancellableStream(self._fast.create_chat_completion(*args, **kwargs), self._cancelled)


class _CancellableStream:
    """The library's chat stream, ending with `_Cancelled` before the step after a cancellation."""

    def __init__(self, stream: Any, cancelled: threading.Event):
        self._stream = stream
        self._chunks = iter(stream)
        self._cancelled = cancelled

    def __iter__(self) -> "_CancellableStream":
        return self

    def __next__(self) -> dict:
        if self._cancelled.is_set():
            raise _Cancelled
        return next(self._chunks)

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()

    @property
    def speculation(self) -> dict | None:  # the stats so far (what the rewrite reads from a closed stream)
        return getattr(self._stream, "speculation", None)


def chat_chunk_text(chunk: dict) -> str:
    return (chunk["choices"][0].get("delta") or {}).get("content") or "" if chunk["choices"] else ""


def completion_chunk_text(chunk: dict) -> str:
    return chunk["choices"][0].get("text") or "" if chunk["choices"] else ""


def chat_messages(req: ChatRequest) -> list[dict]:
    """OpenAI messages as the chat template takes them: text (a list of text parts joined with
    newlines), `developer` as `system`; tool messages and non-text parts are refused."""
    out = []
    for i, message in enumerate(req.messages):
        if message.role in ("tool", "function") or message.tool_calls or message.function_call:
            raise APIError(400, f"messages[{i}] is a tool or function message: tool calls are not implemented "
                                "by lookahead", param=f"messages[{i}].role", code="unsupported_parameter")
        content = message.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"content part of type {part.get('type')!r} is not supported: lookahead "
                                        "serves text models (parts of type 'text' with a string 'text')",
                                   param=f"messages[{i}].content[{j}]", code="unsupported_parameter")
                texts.append(part["text"])
            content = "\n".join(texts)
        out.append({"role": "system" if message.role == "developer" else message.role, "content": content or ""})
    return out


def model_id_for(path: os.PathLike | str) -> str:
    """The name a model file is served under: its file name without `.gguf`."""
    name = os.path.basename(str(path))
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
