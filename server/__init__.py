"""lookahead.server: an OpenAI-compatible HTTP server with Predicted Outputs (`lookahead serve`).

    protocol   OpenAI's wire format: request models, the error body, the usage block (pure data)
    decoder    the thread that owns the Llama: one request at a time, a bounded queue, cancellation
    app        the ASGI app (Starlette + sse-starlette): endpoints, checks, errors
    cli        the `serve` command (uvicorn)
    client     `timed_request`: one streamed request through HTTP, timed (standard library only)

Nothing is imported here, so `lookahead --help` works without the server's extras installed.
"""
