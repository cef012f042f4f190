"""The checks every endpoint shares, and a request's arguments for the library.

Each function raises `APIError` with OpenAI's status and wording when a request is refused.
"""
from __future__ import annotations

import hmac
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .protocol import APIError, parse_json_body
from .state import ServerState


def authorize(state: ServerState, request: Request) -> None:
    api_key = state.config.api_key
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise APIError(401, "missing API key: send the header 'Authorization: Bearer <key>' "
                            "(the key given to `lookahead serve --api-key`)", code="invalid_api_key")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "incorrect API key in the Authorization header", code="invalid_api_key")


async def read_body(state: ServerState, request: Request) -> dict:
    """The body as a JSON object, read no further than the server's size limit."""
    limit = state.config.max_body_bytes
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


def check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name not in state.model_names:
        raise APIError(404, f"the model {name!r} does not exist: this server serves {state.config.model_id!r} "
                            "(see GET /v1/models)", param="model", code="model_not_found")


def refuse(param: str, why: str) -> APIError:
    return APIError(400, f"'{param}' is not supported by lookahead: {why}", param=param,
                    code="unsupported_parameter")


def sampling_of(state: ServerState, req: Any) -> dict[str, Any]:
    """The sampling arguments of a request (chat, completion or edit), the server's defaults
    filling what it leaves out."""
    defaults = state.config.sampling
    return dict(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        top_k=defaults.top_k if req.top_k is None else req.top_k,
        min_p=defaults.min_p if req.min_p is None else req.min_p,
        repeat_penalty=defaults.repeat_penalty if req.repeat_penalty is None else req.repeat_penalty,
        frequency_penalty=defaults.frequency_penalty if req.frequency_penalty is None else req.frequency_penalty,
        presence_penalty=defaults.presence_penalty if req.presence_penalty is None else req.presence_penalty,
    )


def max_tokens_of(state: ServerState, req: Any) -> int | None:
    given = {name: getattr(req, name) for name in ("max_completion_tokens", "max_tokens")
             if getattr(req, name, None) is not None}
    if len(set(given.values())) > 1:
        raise APIError(400, f"'max_tokens' ({req.max_tokens}) and 'max_completion_tokens' "
                            f"({req.max_completion_tokens}) disagree; give one of them",
                       param="max_tokens", code="invalid_value")
    name, value = next(iter(given.items()), ("max_tokens", state.config.max_tokens))
    if value is not None and not 1 <= value <= state.n_ctx:
        raise APIError(400, f"invalid '{name}': {value}; expected an integer from 1 to {state.n_ctx}, this "
                            "server's context size", param=name, code="invalid_value")
    return value


def library_kwargs(state: ServerState, req: Any) -> dict:
    """The `create_completion` / `create_chat_completion` arguments of a chat or completion
    request, after the checks both endpoints share."""
    check_model(state, req.model)
    if req.n not in (None, 1):
        raise refuse("n", f"one choice per request (n=1), got n={req.n}")
    if req.logit_bias:
        raise refuse("logit_bias", "token biases are not implemented")
    if req.logprobs not in (None, False):  # llama-cpp-python computes them only with logits_all=True
        raise refuse("logprobs", "this server's Llama keeps no logits for every position (logits_all=False)")
    kwargs: dict[str, Any] = dict(
        max_tokens=max_tokens_of(state, req),
        **sampling_of(state, req),
        stop=req.stop_list(),
        seed=req.seed,
        stream=True,  # a non-streamed request is assembled from the chunks (see `ServerState.submit`)
        model=state.config.model_id,
    )
    if req.speculate is not None:
        kwargs["speculate"] = req.speculate
    references = [r for r in (req.references or []) if r]
    prediction = req.prediction.text() if req.prediction is not None else ""
    if prediction:
        kwargs["prediction"] = prediction  # a reference whose drafts are counted apart
    kwargs["references"] = references
    return kwargs
