"""lookahead.server: an OpenAI-compatible HTTP server with Predicted Outputs (`lookahead serve`).

    protocol   OpenAI's wire format: request models, the error body, the usage block (pure data)
    decoder    the thread that owns the Llama: one request at a time, a bounded queue, cancellation
    state      what the routes of one app share: settings, the wrapper, the decoder (ServerState)
    checks     the checks every endpoint makes (key, body size, model, max_tokens) and the library's arguments
    responses  a job's answer: JSON or server-sent events, OpenAI's whole-response and usage shapes
    errors     exceptions as OpenAI errors, and the app's error handlers
    routes/    one module per endpoint: chat, completions, edits, models, health
    app        `create_app`: the Starlette app over a `lookahead.Lookahead`
    cli        the `serve` command (uvicorn)
    client     `timed_request`: one streamed request through HTTP, timed (standard library only)

Nothing is imported here, so `lookahead --help` works without the server's extras installed.
"""
