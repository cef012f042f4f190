"""GET /health: the model, the context, and the decoding thread's counters (no key needed);
503 once requests can no longer be served (an RPC server that held layers went away)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..state import state_of


async def health(request: Request) -> Response:
    state = state_of(request)
    decoder = state.decoder
    body = {"status": "ok" if state.unavailable is None else "unavailable", "model": state.config.model_id,
            "n_ctx": state.n_ctx, "decoding": decoder.decoding, "waiting": decoder.waiting,
            "max_queue": decoder.max_queue, "served": decoder.served, "cancelled": decoder.cancelled,
            "rejected": decoder.rejected}
    if state.unavailable is not None:
        body["error"] = state.unavailable
    return JSONResponse(body, status_code=200 if state.unavailable is None else 503)
