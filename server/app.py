"""The ASGI app: OpenAI's /v1/chat/completions, /v1/completions, /v1/models, and /health, and
lookahead's /v1/lookahead/edits.

A thin front end over `lookahead.Lookahead`: requests are validated (`protocol`, `checks`),
turned into the library's `create_chat_completion` / `create_completion` arguments, decoded
one at a time (`decoder`), and answered in OpenAI's shapes (`responses`): JSON, or server-sent
events ending with `data: [DONE]`. `prediction` becomes a reference for its request; the usage
block counts the prediction tokens the verifier accepted and rejected; the library's
speculation stats go in a `speculation` field, which OpenAI clients ignore. Each endpoint is a
module of `routes`; what they share is the app's `ServerState` (`state`); errors are answered
by `errors`.
"""
from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette

from .errors import HANDLERS
from .routes import ROUTES
from .state import DEFAULT_MAX_BODY_BYTES, ServerConfig, ServerState

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServerConfig", "ServerState", "create_app", "model_id_for"]


def create_app(fast: Any, config: ServerConfig) -> Starlette:
    """The app serving `fast` (a `lookahead.Lookahead`) with the settings in `config`."""
    state = ServerState(fast, config)

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.get_running_loop().run_in_executor(None, state.decoder.close)  # finish the queued jobs

    app = Starlette(routes=ROUTES, lifespan=lifespan, exception_handlers=HANDLERS)
    app.state.server = state
    return app


def model_id_for(path: os.PathLike | str) -> str:
    """The name a model file is served under: its file name without `.gguf`."""
    name = os.path.basename(str(path))
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
