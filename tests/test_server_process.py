"""`lookahead serve` as a real process on a free 127.0.0.1 port: what only a process shows.

Start-up and a bad model path, streaming through uvicorn, clients that close their
connection (the server must stop that generation), the standard-library client the benches
use, and Ctrl-C (the module's server is stopped with SIGINT and must exit cleanly). The
endpoints' behaviour is tested in process, in test_server.py.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from lookahead.cli.bench.llama_server import free_port
from server_helpers import (BUFFER, HELLO, KEY, LONG_BUFFER, MODEL, N_CTX, NO_TIE, assert_openai_error,
                            sse_data)

BIN = Path(sys.executable).parent / "lookahead"
pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The base URL of a `lookahead serve` process (one request may wait while one decodes).
    Stopped with Ctrl-C (SIGINT) at the end: it must exit with status 0 and no traceback."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    with open(log_path, "w") as log:
        # One thread: llama.cpp's spinning threads crawl when the 2 cores are shared.
        proc = subprocess.Popen([str(BIN), "serve", "--port", str(port), "--n-ctx", str(N_CTX), "--api-key", KEY,
                                 "--max-queue", "1", "--max-body-mib", "1", "--max-tokens", "64", "--threads", "1",
                                 "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"server exited with {proc.returncode}:\n{log_path.read_text()}"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server not ready after 180 s:\n{log_path.read_text()}"
            time.sleep(0.3)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            returncode = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            returncode = None
    assert returncode == 0, f"Ctrl-C: exit status {returncode}\n{log_path.read_text()}"
    assert "Traceback" not in log_path.read_text(), log_path.read_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def local(model_path):
    """The same model in this process: what the server's answers must equal."""
    import llama_cpp

    import lookahead

    # flash attention on, as `lookahead serve` loads its model: it changes the logits
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=N_CTX, n_threads=1, n_threads_batch=1, flash_attn=True,
                          verbose=False)
    return lookahead.wrap(llm, calibrate=False, threads="keep")


def health(server) -> dict:
    return httpx.get(server + "/health", timeout=10).json()


def post(server, route, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server + route, json=body, headers=headers, timeout=120, **kw)


def wait_idle(server) -> dict:
    deadline = time.monotonic() + 120
    while (h := health(server))["decoding"] or h["waiting"]:
        assert time.monotonic() < deadline, h
        time.sleep(0.1)
    return h


# ---- the command ------------------------------------------------------------------------------
def test_serve_refuses_a_missing_model(tmp_path):
    out = subprocess.run([str(BIN), "serve", "--model", str(tmp_path / "nope.gguf")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "model file not found" in out.stderr and "nope.gguf" in out.stderr and "Traceback" not in out.stderr


def test_health_and_models(server, client):
    assert health(server)["status"] == "ok"
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_streaming_completion_ends_with_done(server):
    with httpx.stream("POST", server + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                      json={"prompt": "One, two, three,", "max_tokens": 8, "stream": True}) as r:
        chunks = [json.loads(d) for d in sse_data(r)]
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "speculation" in chunks[-1]
    assert "usage" not in chunks[0]  # only with stream_options.include_usage


def test_timed_request_for_benches(server, client):
    from lookahead.server.client import timed_request

    body = {"messages": HELLO, "max_tokens": 12, "temperature": 0, "speculate": False}
    run = timed_request(server, body, api_key=KEY)
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0,
                                           extra_body={"speculate": False})
    assert run.text == plain.choices[0].message.content
    assert run.usage["completion_tokens"] == plain.usage.completion_tokens
    assert 0 < run.ttft_s <= run.total_s
    assert run.speculation["speculative"] is False
    completion = timed_request(server, {"prompt": "One, two, three,", "max_tokens": 6}, api_key=KEY)
    assert completion.text and completion.usage["completion_tokens"] >= 1
    with pytest.raises(RuntimeError, match="404.*'nope' does not exist"):
        timed_request(server, {**body, "model": "nope"}, api_key=KEY)


# ---- clients that leave, a queue of one ----------------------------------------------------------
def test_disconnect_stops_generation_and_a_full_queue_answers_429(server, client, local):
    before = health(server)
    long_body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": N_CTX - 64, "temperature": 0, "stream": True}
    waiting: dict[str, object] = {}

    def queued_request():
        waiting["out"] = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0,
                                                        extra_body={"speculate": False})

    with httpx.stream("POST", server + "/v1/completions", json=long_body, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it is decoding
        second = threading.Thread(target=queued_request)
        second.start()
        deadline = time.monotonic() + 60
        while health(server)["waiting"] < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.05)
        third = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 4})
        assert_openai_error(third, 429, code="rate_limit_exceeded")
        assert int(third.headers["Retry-After"]) >= 1
    # The stream is closed: the server stops that generation at its next step ...
    deadline = time.monotonic() + 60
    while health(server)["cancelled"] == before["cancelled"]:
        assert time.monotonic() < deadline, "the abandoned stream was never stopped"
        time.sleep(0.1)
    second.join(timeout=120)
    # ... and the request that waited behind it gets the right answer.
    want = local.create_chat_completion(HELLO, max_tokens=12, temperature=0, speculate=False)
    assert waiting["out"].choices[0].message.content == want["choices"][0]["message"]["content"]
    after = health(server)
    assert after["rejected"] == before["rejected"] + 1 and after["status"] == "ok"


def test_chat_stream_closed_early_then_next_answer_is_right(server, client, local):
    before = health(server)["cancelled"]
    story = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]
    stream = client.chat.completions.create(model=MODEL, messages=story, max_tokens=N_CTX - 64, temperature=0,
                                            stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 60
    while health(server)["cancelled"] == before:
        assert time.monotonic() < deadline, "the abandoned stream was never stopped"
        time.sleep(0.1)
    out = client.completions.create(model=MODEL, prompt=NO_TIE, max_tokens=12, temperature=0)
    want = local.create_completion(NO_TIE, max_tokens=12, temperature=0)
    assert out.choices[0].text == want["choices"][0]["text"]


def abandon_mid_decode(server: str, route: str, body: dict, deadline: float) -> None:
    """POST `body` (not streamed) over a raw socket and close it once the server is decoding:
    a client that leaves without reading its answer (httpx would wait for the whole body)."""
    raw = json.dumps(body).encode()
    host, port = server.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw)
    try:
        while not health(server)["decoding"]:
            assert time.monotonic() < deadline, f"the request to {route} never started decoding"
            time.sleep(0.02)
    finally:
        sock.close()


def test_a_non_streamed_request_whose_client_leaves_is_stopped(server, client, local):
    """The client closes its connection while a long non-streamed completion decodes: the
    generation is stopped (the `cancelled` counter), and the next answer is right."""
    before = wait_idle(server)  # idle, so the request decodes at once
    deadline = time.monotonic() + 120
    abandon_mid_decode(server, "/v1/completions", {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,",
                                                    "max_tokens": N_CTX - 64, "temperature": 0}, deadline)
    while health(server)["cancelled"] == before["cancelled"]:
        assert time.monotonic() < deadline, "the abandoned non-streamed request was never stopped"
        time.sleep(0.1)
    after = health(server)
    assert after["served"] == before["served"] + 1 and after["status"] == "ok"
    out = client.completions.create(model=MODEL, prompt=NO_TIE, max_tokens=12, temperature=0)
    want = local.create_completion(NO_TIE, max_tokens=12, temperature=0)
    assert out.choices[0].text == want["choices"][0]["text"]


def test_edit_whose_client_leaves_is_stopped_then_next_answer_is_right(server, local):
    """A streamed edit closed after its first event, then a non-streamed one whose connection
    closes while it decodes: both are stopped (the `cancelled` counter), and the next edit is
    right."""
    from lookahead import edit

    before = wait_idle(server)
    body = {"text": LONG_BUFFER, "instruction": "Fix the typos", "filename": "plan.md", "temperature": 0}
    with httpx.stream("POST", server + "/v1/lookahead/edits", json={**body, "stream": True}, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[len("data: "):])["object"] == "lookahead.edit.chunk"  # it is decoding
    deadline = time.monotonic() + 120
    while health(server)["cancelled"] == before["cancelled"]:
        assert time.monotonic() < deadline, "the abandoned edit stream was never stopped"
        time.sleep(0.1)
    middle = wait_idle(server)
    assert middle["served"] == before["served"] + 1 and middle["cancelled"] == before["cancelled"] + 1

    abandon_mid_decode(server, "/v1/lookahead/edits", body, deadline)
    while health(server)["cancelled"] == middle["cancelled"]:
        assert time.monotonic() < deadline, "the abandoned non-streamed edit was never stopped"
        time.sleep(0.1)
    after = wait_idle(server)
    assert after["served"] == middle["served"] + 1 and after["status"] == "ok"

    start, end = BUFFER.index("teh cat"), BUFFER.index("\n\nKeep this one")
    out = post(server, "/v1/lookahead/edits", {"text": BUFFER, "instruction": "Fix the typos", "region": [start, end],
                                               "temperature": 0}).json()
    want = edit.rewrite(local, BUFFER, "Fix the typos", region=(start, end), temperature=0, stream=False)
    assert out["text"] == want.text and out["document"] == want.document
