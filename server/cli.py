"""`lookahead serve`: the OpenAI-compatible server, as a command of the `lookahead` CLI."""
from __future__ import annotations

import dataclasses
import ipaddress
import time

import click

from lookahead.cli.options import load_wrapped, model_options, resolve_model
from lookahead.sampling import FRONT_END_DEFAULTS as DEFAULTS


def _require_server_stack() -> None:
    missing = []
    for module in ("starlette", "uvicorn", "sse_starlette", "pydantic"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise click.ClickException(
            f"`lookahead serve` needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
            "installed: run `pip install 'lookahead[server]'` (in a checkout: .venv/bin/pip install -e "
            "'.[server]', or bash scripts/setup.sh)"
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. The default accepts connections from this machine only; "
                   "0.0.0.0 opens the server to the network (set --api-key then).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="TCP port.")
@click.option("--api-key", envvar="LOOKAHEAD_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1/* (also from $LOOKAHEAD_API_KEY). "
                   "Default: no key.")
@model_options()
@click.option("--model-name", default=None,
              help="The model id clients send and /v1/models lists. Default: the file name without .gguf.")
@click.option("--max-draft", type=click.IntRange(min=1, max=256), default=64, show_default=True,
              help="Longest draft the cost model may choose.")
@click.option("--temperature", "-t", type=click.FloatRange(0.0, 2.0), default=DEFAULTS.temperature, show_default=True,
              help="Default for requests that send no temperature (0 = greedy).")
@click.option("--top-k", type=click.IntRange(min=0), default=DEFAULTS.top_k, show_default=True,
              help="Default top-k (0 = all tokens); requests may send `top_k`.")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0), default=DEFAULTS.top_p, show_default=True,
              help="Default nucleus sampling mass for requests that send no top_p.")
@click.option("--min-p", type=click.FloatRange(0.0, 1.0), default=DEFAULTS.min_p, show_default=True,
              help="Default min-p; requests may send `min_p`.")
@click.option("--repeat-penalty", type=click.FloatRange(min=0.0, min_open=True), default=DEFAULTS.repeat_penalty,
              show_default=True, help="Default repeat penalty (1 = off); requests may send `repeat_penalty`.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Default output limit for requests that send none. Default: up to the end of the context. "
                   "(Not for /v1/lookahead/edits: an edit is bounded by its text's length.)")
@click.option("--max-queue", type=click.IntRange(min=0), default=8, show_default=True,
              help="Requests that may wait while one decodes; beyond them the server answers 429 with Retry-After.")
@click.option("--max-body-mib", type=click.FloatRange(min=0.0, min_open=True), default=8.0, show_default=True,
              help="Largest request body in MiB; a larger one is answered 413.")
@click.option("--warmup/--no-warmup", default=True, show_default=True,
              help="Before listening, run one short request so the first client does not pay the one-off "
                   "measurements (decode threads, verify cost curve).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="uvicorn's log level (info logs one line per request).")
def serve(host, port, api_key, model_path, model_name, n_ctx, threads, gpu_layers, tree_width, max_draft,
          temperature, top_k, top_p, min_p, repeat_penalty, max_tokens, max_queue, max_body_mib, warmup, log_level):
    """Serve the model over OpenAI's HTTP API, with Predicted Outputs.

    \b
    Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health.
    Point an OpenAI client (Continue, Zed, the openai package, curl) at http://HOST:PORT/v1.
    Also POST /v1/lookahead/edits: {"text": BUFFER, "instruction": ..., "region": [start, end]}
    rewrites the buffer (or the region) with the buffer as the reference (lookahead.edit).

    A request's `prediction` ({"type": "content", "content": TEXT}) is used as a reference for
    that request: the tokens it drafts and the verifier accepts or rejects are counted in
    usage.completion_tokens_details. Extensions: `references` (more texts to copy from),
    `speculate: false` (plain decoding), `cache_prompt: false` (no reuse of cached prompt
    prefixes: the whole prefill, for timing), `top_k`, `min_p`, `repeat_penalty`; the
    speculation stats come back in a `speculation` field. One model, one request decoding at
    a time; a client that disconnects stops its generation.

    \b
    Example:
      lookahead serve --port 8000
      curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20}'
    """
    _require_server_stack()
    import uvicorn

    from lookahead.server.app import ServerConfig, create_app, model_id_for

    if max_tokens is not None and max_tokens > n_ctx:
        raise click.BadParameter(f"{max_tokens} is larger than the context (--n-ctx {n_ctx})", param_hint="--max-tokens")
    if api_key is not None and not api_key.strip():
        raise click.BadParameter("the API key is empty", param_hint="--api-key")
    path = resolve_model(model_path)
    fast = load_wrapped(path, n_ctx, threads, gpu_layers, tree_width, max_draft=max_draft)
    model_id = model_name or model_id_for(path)
    if warmup:
        t0 = time.perf_counter()
        try:
            fast.create_completion("Warm-up: one two three one two three", max_tokens=4, temperature=0.0)
        except RuntimeError as e:  # e.g. an RPC server lost already: say so, not a traceback
            raise click.ClickException(f"the warm-up request failed: {e}") from None
        click.echo(f"warm-up: {time.perf_counter() - t0:.1f} s", err=True)
    config = ServerConfig(
        model_id=model_id, aliases=(path.name, str(path)), api_key=api_key, max_queue=max_queue,
        max_body_bytes=int(max_body_mib * 1024 * 1024),
        sampling=dataclasses.replace(DEFAULTS, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                     repeat_penalty=repeat_penalty),
        max_tokens=max_tokens,
    )
    app = create_app(fast, config)
    if not _is_loopback(host) and api_key is None:
        click.echo(f"warning: listening on {host} without --api-key: anyone who can reach this port can use "
                   "the model", err=True)
    click.echo(f"lookahead serve: model {model_id!r} ({n_ctx}-token context) at http://{host}:{port}/v1", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
