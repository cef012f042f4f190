"""The endpoints, one module each; every handler reads the app's `ServerState` (`state_of`).

    chat         POST /v1/chat/completions
    completions  POST /v1/completions
    edits        POST /v1/lookahead/edits (lookahead.edit over HTTP)
    models       GET /v1/models, GET /v1/models/{model}
    health       GET /health
"""
from __future__ import annotations

from starlette.routing import Route

from .chat import chat_completions
from .completions import completions
from .edits import edits
from .health import health
from .models import get_model, list_models

ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/lookahead/edits", edits, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", get_model, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]
