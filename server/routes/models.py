"""GET /v1/models and /v1/models/{model}: the one model this server serves."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..checks import authorize, check_model
from ..state import ServerState, state_of


def model_card(state: ServerState) -> dict:
    return {"id": state.config.model_id, "object": "model", "created": state.config.created,
            "owned_by": "lookahead", "n_ctx": state.n_ctx}


async def list_models(request: Request) -> Response:
    state = state_of(request)
    authorize(state, request)
    return JSONResponse({"object": "list", "data": [model_card(state)]})


async def get_model(request: Request) -> Response:
    state = state_of(request)
    authorize(state, request)
    check_model(state, request.path_params["model"])
    return JSONResponse(model_card(state))
