"""Errors in OpenAI's shape: the library's exceptions as API errors, and the app's handlers."""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lookahead.adapters.llama_cpp.rpc import RpcServerLost

from .protocol import APIError


def library_error(e: Exception, n_ctx: int) -> APIError:
    """The OpenAI error for an exception raised while a request runs."""
    if isinstance(e, APIError):
        return e
    message = str(e)
    if isinstance(e, ValueError) and ("context window" in message or "does not fit the context" in message):
        return APIError(400, f"{message}: this server's context holds {n_ctx} tokens (prompt and completion); "
                             "shorten the prompt or restart the server with a larger --n-ctx",
                        code="context_length_exceeded")
    if isinstance(e, RpcServerLost):  # every request fails the same way until a restart
        return APIError(503, message, type="server_error", code="rpc_server_lost")
    if isinstance(e, (ValueError, TypeError)):
        return APIError(400, message or type(e).__name__)
    return APIError(500, f"internal error: {type(e).__name__}: {message}", type="server_error")


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
    return JSONResponse(request.app.state.server.error_of(e).body(), status_code=500)


HANDLERS = {APIError: on_api_error, HTTPException: on_http_error, Exception: on_crash}
