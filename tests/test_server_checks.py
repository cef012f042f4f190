"""The server's checks without a model: `create_app` over the fake target (tests/fake_target.py),
through Starlette's TestClient, and `lookahead serve --help` through click's CliRunner.

Every request here is refused before it reaches the model, or needs nothing of it but a
context size and a tokenizer: OpenAI's error body, the right status and parameter.
"""
from __future__ import annotations

import openai
import pytest

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")

from click.testing import CliRunner  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from fake_target import FakeTarget  # noqa: E402
from lookahead.api import Lookahead  # noqa: E402
from server_helpers import HELLO, KEY, MODEL, N_CTX, assert_openai_error  # noqa: E402


@pytest.fixture(scope="module")
def http():
    from lookahead.server.app import ServerConfig, create_app

    fast = Lookahead(FakeTarget(n_ctx=N_CTX), calibrate=False)
    config = ServerConfig(model_id=MODEL, api_key=KEY, max_queue=1, max_body_bytes=1024 * 1024, max_tokens=64)
    with TestClient(create_app(fast, config)) as client:
        yield client


@pytest.fixture(scope="module")
def client(http):
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key=KEY, http_client=http, max_retries=0, timeout=60)


def post(http, route, body, key=KEY):
    return http.post(route, json=body, headers={"Authorization": f"Bearer {key}"} if key else {})


def test_serve_help_explains_the_options():
    from lookahead.cli.main import main

    out = CliRunner().invoke(main, ["serve", "--help"])
    assert out.exit_code == 0, out.output
    for flag in ("--host", "--port", "--api-key", "--model", "--n-ctx", "--threads", "--temperature", "--top-p",
                 "--max-tokens", "--max-queue", "--max-body-mib", "prediction", "127.0.0.1"):
        assert flag in out.output
    assert "serve" in CliRunner().invoke(main, ["--help"]).output


def test_client_library_errors(http, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=4)
    assert e.value.body["code"] == "model_not_found" and "gpt-4o" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HELLO, n=2)
    assert e.value.body["param"] == "n"
    for bad in (0, N_CTX + 1):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=bad)
        assert e.value.body["param"] == "max_tokens" and str(bad) in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_completion_tokens=-5)
    assert e.value.body["param"] == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HELLO, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {}}}}])
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HELLO, logprobs=True, max_tokens=4)
    assert e.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as e:  # a prompt longer than the context
        client.completions.create(model=MODEL, prompt="lorem ipsum " * N_CTX, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded" and str(N_CTX) in e.value.body["message"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=client.base_url, api_key="wrong", http_client=http, max_retries=0).models.list()


def test_http_errors(http):
    assert_openai_error(post(http, "/v1/chat/completions", {"messages": HELLO}, key=None), 401,
                        code="invalid_api_key", says="Authorization")
    r = http.post("/v1/chat/completions", content=b'{"messages": [',
                  headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert_openai_error(r, 400, code="invalid_json")
    assert_openai_error(post(http, "/v1/chat/completions", {"messages": HELLO, "max_tokens": "12"}), 400,
                        param="max_tokens", code="invalid_type", says="'12'")
    assert_openai_error(post(http, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
                        400, param="messages[0].role")
    assert_openai_error(post(http, "/v1/chat/completions", {"messages": HELLO, "temperature": 9}), 400,
                        param="temperature", says="9")
    assert_openai_error(post(http, "/v1/chat/completions", {"messages": HELLO, "prediction": {"type": "x"}}),
                        400, param="prediction.type")
    assert_openai_error(post(http, "/v1/completions", {"max_tokens": 3}), 400, param="prompt",
                        code="missing_required_parameter")
    big = {"prompt": "x" * (1024 * 1024 + 10), "max_tokens": 1}
    assert_openai_error(post(http, "/v1/completions", big), 413, code="request_too_large")
    assert_openai_error(post(http, "/v1/embeddings", {"input": "x"}), 404, says="/v1/embeddings")
    assert_openai_error(http.get("/v1/chat/completions"), 405)
    assert http.get("/health").json()["status"] == "ok"


def test_fields_with_nothing_to_do_here_are_accepted(http):
    # OpenAI's and editors' labels and routing hints: a local model has no use for them, and
    # refusing them would break clients that always send them
    extra = {"user": "u-1", "metadata": {"task": "edit"}, "store": False, "service_tier": "auto",
             "environment": {"os": "linux"}}
    r = post(http, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2, **extra})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"
    # a field that would change the answer is still refused, extras or not
    assert_openai_error(post(http, "/v1/chat/completions", {"messages": HELLO, "logit_bias": {"1": 5}, **extra}),
                        400, param="logit_bias")
