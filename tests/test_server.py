"""`lookahead serve` end to end: a real server process on a free 127.0.0.1 port, the `openai`
client (and raw httpx for what a client library would not send), the embedded model.

Greedy answers are checked against `lookahead.load()` in this process: the same model and
request give the same text through the server. Nothing here asserts on time.
"""
from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import SAMPLES
from lookahead.cli.bench.llama_server import free_port

BIN = Path(sys.executable).parent / "lookahead"
KEY = "test-key-7f3a"
N_CTX = 1024
MODEL = "SmolLM2-135M-Instruct.Q4_1"
HELLO = [{"role": "user", "content": "Name three colours."}]
pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The base URL of a `lookahead serve` process (one request may wait while one decodes)."""
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
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log_path.read_text(), log_path.read_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def local(model_path):
    """The same model in this process: what the server's answers must equal."""
    import llama_cpp

    import lookahead

    # One thread and no timing calibration: the answers do not depend on either, and on a
    # shared 2-core machine they keep this fixture fast.
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=N_CTX, n_threads=1, n_threads_batch=1, verbose=False)
    return lookahead.wrap(llm, calibrate=False, threads="keep")


def health(server) -> dict:
    return httpx.get(server + "/health", timeout=10).json()


def post(server, route, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server + route, json=body, headers=headers, timeout=120, **kw)


def assert_openai_error(response, status, param=None, code=None, says=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    if says is not None:
        assert says in error["message"], error


def stream_chat(client, **kw):
    """(text, chunks) of a streamed chat completion."""
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


# ---- the command ------------------------------------------------------------------------------
def test_serve_help_explains_the_options():
    out = subprocess.run([str(BIN), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in ("--host", "--port", "--api-key", "--model", "--n-ctx", "--threads", "--temperature", "--top-p",
                 "--max-tokens", "--max-queue", "--max-body-mib", "prediction", "127.0.0.1"):
        assert flag in out.stdout
    assert "serve" in subprocess.run([str(BIN), "--help"], capture_output=True, text=True, timeout=60).stdout


def test_serve_refuses_a_missing_model(tmp_path):
    out = subprocess.run([str(BIN), "serve", "--model", str(tmp_path / "nope.gguf")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "model file not found" in out.stderr and "nope.gguf" in out.stderr and "Traceback" not in out.stderr


# ---- the endpoints ---------------------------------------------------------------------------
def test_health_and_models(server, client):
    assert health(server)["status"] == "ok"
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_equals_the_library(client, local):
    for speculate in (False, True):
        out = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=0,
                                             extra_body={"speculate": speculate})
        want = local.create_chat_completion(HELLO, max_tokens=24, temperature=0, speculate=speculate)
        assert out.choices[0].message.content == want["choices"][0]["message"]["content"]
        assert out.choices[0].finish_reason == want["choices"][0]["finish_reason"]
        assert out.usage.prompt_tokens == want["usage"]["prompt_tokens"]
        assert out.usage.completion_tokens == want["usage"]["completion_tokens"]
        assert out.model_extra["speculation"]["speculative"] is speculate


def test_completion_equals_the_library(client, local):
    prompt = "The days of the week are Monday, Tuesday,"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                    stop=["Sunday"], extra_body={"speculate": False})
    want = local.create_completion(prompt, max_tokens=16, temperature=0, stop=["Sunday"], speculate=False)
    assert out.choices[0].text == want["choices"][0]["text"]
    assert out.usage.completion_tokens == want["usage"]["completion_tokens"]
    assert "Sunday" not in out.choices[0].text


def test_streaming_chat_with_usage(client):
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=20, temperature=0)
    text, chunks = stream_chat(client, messages=HELLO, max_tokens=20, temperature=0,
                               stream_options={"include_usage": True})
    assert text == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == plain.usage.prompt_tokens
    assert last.usage.completion_tokens == plain.usage.completion_tokens
    assert last.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_streaming_completion_ends_with_done(server):
    with httpx.stream("POST", server + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                      json={"prompt": "One, two, three,", "max_tokens": 8, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "speculation" in chunks[-1]
    assert "usage" not in chunks[0]  # only with stream_options.include_usage


def test_prediction_is_used_and_counted(client, local):
    code = "".join((SAMPLES / "code" / "textutils.py").read_text().splitlines(keepends=True)[:20])  # short prefill
    messages = [{"role": "user", "content": "Rename the function `slugify` to `make_slug` in the following file. "
                                            f"Output the whole revised file and nothing else.\n\n{code}"}]
    text, chunks = stream_chat(client, messages=messages, max_tokens=48, temperature=0,
                               prediction={"type": "content", "content": [{"type": "text", "text": code}]},
                               stream_options={"include_usage": True})
    usage = chunks[-1].usage
    speculation = next(c.model_extra["speculation"] for c in chunks if c.model_extra.get("speculation"))
    assert usage.completion_tokens > 0 and speculation["generated_tokens"] >= usage.completion_tokens
    details = usage.completion_tokens_details
    drafted = speculation.get("prediction_drafted", 0)
    assert details.accepted_prediction_tokens == speculation.get("prediction_accepted", 0)
    assert details.rejected_prediction_tokens == drafted - details.accepted_prediction_tokens
    assert details.accepted_prediction_tokens <= speculation["accepted"]
    # The prediction reached the library as this request's reference: same text as in-process.
    want = local.create_chat_completion(messages, max_tokens=48, temperature=0, references=[code])
    assert text == want["choices"][0]["message"]["content"]
    # And it was for that request only: a plain request right after drafts nothing from it.
    again = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0,
                                           extra_body={"references": ["Red, green and blue."]})
    assert again.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_prediction_text_is_drafted_from(client):
    # The answer's tokens are not in the prompt, only in the prediction: what is drafted and
    # accepted comes from it.
    prompt = "Count from 1 to 40: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
    prediction = " " + ", ".join(str(i) for i in range(11, 41)) + "."
    runs = {}
    for name, extra in (("without", {}), ("with", {"prediction": {"type": "content", "content": prediction}})):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, extra_body=extra)
        runs[name] = (out.choices[0].text, out.model_extra["speculation"], out.usage.completion_tokens_details)
    assert runs["with"][0] == runs["without"][0]  # speed only: the same greedy text
    with_spec, details = runs["with"][1], runs["with"][2]
    assert details.accepted_prediction_tokens == with_spec.get("prediction_accepted", 0)
    assert details.rejected_prediction_tokens == (with_spec.get("prediction_drafted", 0)
                                                  - details.accepted_prediction_tokens)
    # Whether a draft pays is the cost model's call (where verifying a batch costs more than
    # its tokens one by one, nothing is drafted); what this request drafted came from the
    # prediction, as the prompt holds none of the answer's numbers.
    if with_spec["drafted"]:
        assert with_spec["accepted"] > runs["without"][1]["accepted"]
        assert details.accepted_prediction_tokens > 0  # the library counts what came from the prediction


def test_sampling_with_seed_is_reproducible(client):
    kw = dict(model=MODEL, messages=HELLO, max_tokens=16, temperature=0.9, top_p=0.9, seed=7,
              frequency_penalty=0.5, presence_penalty=0.2)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b and a


def test_zed_edit_prediction_request(server):
    # The body Zed's `open_ai_compatible_api` edit prediction posts (temperature null, 14 stops).
    stops = ["<|endoftext|>", "<|file_separator|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_middle|>",
             "<|fim_suffix|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<PRE>", "<SUF>", "<MID>",
             "[PREFIX]", "[SUFFIX]"]
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "<fim_prefix>def add(a, b):\n    return "
                                         "<fim_suffix>\n<fim_middle>", "max_tokens": 8, "temperature": None,
                                         "stop": stops, "environment": None})
    assert r.status_code == 200, r.text
    assert isinstance(r.json()["choices"][0]["text"], str) and r.json()["id"]


# ---- bad input: OpenAI's error body, the right status, the server stays up -----------------
def test_client_library_errors(client):
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
        openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0).models.list()


def test_http_errors(server):
    assert_openai_error(post(server, "/v1/chat/completions", {"messages": HELLO}, key=None), 401,
                        code="invalid_api_key", says="Authorization")
    r = httpx.post(server + "/v1/chat/completions", content=b'{"messages": [', timeout=30,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert_openai_error(r, 400, code="invalid_json")
    assert_openai_error(post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": "12"}), 400,
                        param="max_tokens", code="invalid_type", says="'12'")
    assert_openai_error(post(server, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
                        400, param="messages[0].role")
    assert_openai_error(post(server, "/v1/chat/completions", {"messages": HELLO, "temperature": 9}), 400,
                        param="temperature", says="9")
    assert_openai_error(post(server, "/v1/chat/completions", {"messages": HELLO, "prediction": {"type": "x"}}),
                        400, param="prediction.type")
    assert_openai_error(post(server, "/v1/completions", {"max_tokens": 3}), 400, param="prompt",
                        code="missing_required_parameter")
    big = {"prompt": "x" * (1024 * 1024 + 10), "max_tokens": 1}
    assert_openai_error(post(server, "/v1/completions", big), 413, code="request_too_large")
    assert_openai_error(post(server, "/v1/embeddings", {"input": "x"}), 404, says="/v1/embeddings")
    assert_openai_error(httpx.get(server + "/v1/chat/completions", timeout=10), 405)
    assert health(server)["status"] == "ok"


def test_fuzzed_requests_then_a_correct_answer(server, client, local):
    rng = random.Random(1234)
    junk = [None, True, -1, 0, 2**70, 1.5, "", "x" * 50, [], [1, "a"], {}, {"type": "content"}, float("1e308")]
    fields = ["messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
              "seed", "stream", "stream_options", "prediction", "references", "speculate", "frequency_penalty",
              "presence_penalty", "logit_bias", "top_k", "min_p", "repeat_penalty", "tools", "response_format"]
    statuses = []
    for i in range(40):
        route = rng.choice(["/v1/chat/completions", "/v1/completions"])
        body = {"messages": HELLO, "prompt": "Hi", "max_tokens": 1}
        for _ in range(rng.randint(1, 3)):
            body[rng.choice(fields)] = rng.choice(junk)
        if i % 5 == 0:
            raw = json.dumps(body).encode()
            raw = raw[: rng.randrange(len(raw))] + bytes([rng.randrange(256)])  # cut or garbled JSON
        else:
            raw = json.dumps(body).encode()
        r = httpx.post(server + route, content=raw, timeout=60,
                       headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        statuses.append(r.status_code)
        if r.status_code == 200:  # some mutations are valid requests
            if r.headers["content-type"].startswith("text/event-stream"):
                assert r.text.rstrip().endswith("data: [DONE]")
            else:
                assert r.json()["choices"]
        else:
            assert_openai_error(r, r.status_code)
            assert r.status_code in (400, 404), r.text
    assert statuses.count(400) >= 20  # the fuzz mostly hit the validation it is meant to hit
    out = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, temperature=0,
                                         extra_body={"speculate": False})
    want = local.create_chat_completion(HELLO, max_tokens=16, temperature=0, speculate=False)
    assert out.choices[0].message.content == want["choices"][0]["message"]["content"]


# ---- concurrency: two clients, a queue of one, a client that leaves ---------------------------
def test_two_concurrent_clients(client, local):
    prompts = ["Name three colours.", "Name three animals."]
    results: dict[int, str] = {}

    def ask(i):
        text, _ = stream_chat(client, messages=[{"role": "user", "content": prompts[i]}], max_tokens=20,
                              temperature=0, extra_body={"speculate": False})
        results[i] = text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i, prompt in enumerate(prompts):
        want = local.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=20, temperature=0,
                                            speculate=False)
        assert results[i] == want["choices"][0]["message"]["content"]


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
    prompt = "The days of the week are Monday, Tuesday,"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    want = local.create_completion(prompt, max_tokens=12, temperature=0)
    assert out.choices[0].text == want["choices"][0]["text"]


def test_non_streamed_answers_have_the_librarys_shape(server, local):
    """Non-streamed requests are decoded as streams (to be stoppable) and assembled: the same
    fields and text as the library's own whole response, echo included."""
    chat = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 10, "temperature": 0}).json()
    want = local.create_chat_completion(HELLO, max_tokens=10, temperature=0)
    assert set(chat) == set(want) and set(chat["choices"][0]) == set(want["choices"][0])
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"] == want["choices"][0]["message"]
    prompt = "One, two, three,"
    for sent in (prompt, local.llm.tokenize(prompt.encode(), add_bos=False)):
        out = post(server, "/v1/completions", {"prompt": sent, "max_tokens": 6, "temperature": 0, "echo": True}).json()
        want = local.create_completion(sent, max_tokens=6, temperature=0, echo=True)
        assert set(out) == set(want) and out["object"] == "text_completion"
        assert out["choices"][0]["text"] == want["choices"][0]["text"]
        assert out["choices"][0]["text"].startswith(prompt)


def test_cache_prompt_false_pays_the_whole_prefill(client):
    doc = (SAMPLES / "code" / "textutils.py").read_text()
    messages = [{"role": "user", "content": f"Summarise this file in one line.\n\n{doc}"}]
    ask = lambda **extra: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0,
                                                         extra_body=extra)
    ask()
    again = ask()
    assert again.usage.prompt_tokens_details.cached_tokens > 100  # the default: the prefix is reused
    fresh = ask(cache_prompt=False)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert fresh.model_extra["speculation"]["reused_prompt_tokens"] == 0
    assert fresh.usage.prompt_tokens == again.usage.prompt_tokens
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0,
                                                   stream=True, stream_options={"include_usage": True},
                                                   extra_body={"cache_prompt": False}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == 0


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
    deadline = time.monotonic() + 120
    while (h := health(server))["decoding"] or h["waiting"]:  # idle, so the request decodes at once
        assert time.monotonic() < deadline, h
        time.sleep(0.1)
    before = h
    abandon_mid_decode(server, "/v1/completions", {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,",
                                                    "max_tokens": N_CTX - 64, "temperature": 0}, deadline)
    while health(server)["cancelled"] == before["cancelled"]:
        assert time.monotonic() < deadline, "the abandoned non-streamed request was never stopped"
        time.sleep(0.1)
    after = health(server)
    assert after["served"] == before["served"] + 1 and after["status"] == "ok"
    prompt = "The days of the week are Monday, Tuesday,"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    want = local.create_completion(prompt, max_tokens=12, temperature=0)
    assert out.choices[0].text == want["choices"][0]["text"]


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


# ---- /v1/lookahead/edits: the editing API (lookahead.edit) over HTTP --------------------------------
BUFFER = "Keep this line.\n\nteh cat sat on teh mat.\n\nKeep this one too.\n"
# About 1,400 tokens: longer than the server's context, so it is rewritten in pieces.
LONG_BUFFER = "\n".join(f"## Step {i}\n\nStep {i} of the backup plan: copy the folder named alpha{i} to the disk "
                        f"labelled B{i} and check teh copy.\n" for i in range(1, 41))


def edit_events(server, body) -> list[dict]:
    """The events of a streamed edit, which must end with `data: [DONE]`."""
    with httpx.stream("POST", server + "/v1/lookahead/edits", json={**body, "stream": True}, timeout=600,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def wait_idle(server) -> dict:
    deadline = time.monotonic() + 120
    while (h := health(server))["decoding"] or h["waiting"]:
        assert time.monotonic() < deadline, h
        time.sleep(0.1)
    return h


def test_edit_a_region_streamed_and_whole(server, local):
    from lookahead import edit

    start, end = BUFFER.index("teh cat"), BUFFER.index("\n\nKeep this one")
    body = {"model": MODEL, "text": BUFFER, "instruction": "Fix the typos", "region": [start, end],
            "filename": "notes.md", "temperature": 0}
    *chunks, final = edit_events(server, body)
    assert chunks and all(c["object"] == "lookahead.edit.chunk" and c["piece"] == 0 for c in chunks)
    assert final["object"] == "lookahead.edit" and "document" not in final
    assert len({c["id"] for c in [*chunks, final]}) == 1
    whole = post(server, "/v1/lookahead/edits", body).json()
    assert whole["object"] == "lookahead.edit" and whole["model"] == MODEL
    # greedy: the streamed pieces make the whole answer's text
    assert "".join(c["text"] for c in chunks) == whole["text"]
    # the buffer outside the region is left as it was
    assert whole["document"] == BUFFER[:start] + whole["text"] + BUFFER[end:]
    assert whole["document"].startswith("Keep this line.\n\n") and whole["document"].endswith("\n\nKeep this one too.\n")
    for key in ("finish_reason", "warnings", "lines_kept", "diverged", "region", "pieces"):
        assert whole[key] == final[key], key
    assert whole["region"] == [start, end] and whole["pieces"] == [{"start": start, "end": end,
                                                                    "finish_reason": whole["pieces"][0]["finish_reason"]}]
    # the library's rewrite of the same region, in this process, gives the same text
    want = edit.rewrite(local, BUFFER, "Fix the typos", region=(start, end), filename="notes.md", temperature=0,
                        stream=False)
    assert whole["text"] == want.text and whole["finish_reason"] == want.finish_reason
    assert whole["warnings"] == want.warnings
    # usage: the stats' token counts; prediction tokens are the drafts taken from the region
    spec, usage = whole["speculation"], whole["usage"]
    assert usage["completion_tokens"] == spec["generated_tokens"] > 0
    assert usage["prompt_tokens"] == spec["prompt_tokens"] > 0
    details = usage["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] == spec["prediction_accepted"]
    assert details["rejected_prediction_tokens"] == spec["prediction_drafted"] - spec["prediction_accepted"]
    assert spec["prediction_drafted"] <= spec["drafted"]


def test_edit_of_a_buffer_longer_than_the_context_streams_its_pieces_in_order(server):
    # max_tokens=1 over the whole rewrite: the first piece uses it up, and every later piece is
    # kept as it was (and said so), so the pieces can be checked without a long decode.
    *chunks, final = edit_events(server, {"text": LONG_BUFFER, "instruction": "Fix the typos", "filename": "plan.md",
                                          "max_tokens": 1})
    pieces = final["pieces"]
    assert len(pieces) >= 3, pieces
    assert pieces[0]["start"] == 0 and pieces[-1]["end"] == len(LONG_BUFFER)
    assert all(a["end"] == b["start"] for a, b in zip(pieces, pieces[1:]))  # the whole buffer, in order
    order = [c["piece"] for c in chunks]
    assert order == sorted(order) and set(order) == set(range(len(pieces)))
    for i, piece in enumerate(pieces[1:], start=1):
        assert "".join(c["text"] for c in chunks if c["piece"] == i) == LONG_BUFFER[piece["start"]:piece["end"]]
        assert piece["finish_reason"] == "length"
    assert final["finish_reason"] == "length"
    assert sum("max_tokens used up" in w for w in final["warnings"]) == len(pieces) - 1


def test_edit_errors_name_the_field(server):
    def edit_post(key=KEY, **fields):
        return post(server, "/v1/lookahead/edits", {"text": BUFFER, "instruction": "Fix the typos", **fields}, key=key)

    assert_openai_error(edit_post(instruction="  "), 400, param="instruction", code="invalid_value")
    assert_openai_error(edit_post(instruction="", stream=True), 400, param="instruction")
    assert_openai_error(post(server, "/v1/lookahead/edits", {"text": BUFFER}), 400, param="instruction",
                        code="missing_required_parameter")
    assert_openai_error(post(server, "/v1/lookahead/edits", {"instruction": "Fix"}), 400, param="text",
                        code="missing_required_parameter")
    assert_openai_error(edit_post(text=["a", "b"]), 400, param="text", code="invalid_type")
    assert_openai_error(edit_post(region=[0, len(BUFFER) + 1]), 400, param="region", says=str(len(BUFFER)))
    assert_openai_error(edit_post(region=[9, 3]), 400, param="region")
    assert_openai_error(edit_post(region=[-1, 3]), 400, param="region")
    assert_openai_error(edit_post(region=[3]), 400, param="region")
    assert_openai_error(edit_post(region=[1, 2, 3]), 400, param="region")
    assert_openai_error(edit_post(region=[0.5, 3]), 400, param="region[0]", code="invalid_type")
    assert_openai_error(edit_post(region="all"), 400, param="region", code="invalid_type")
    assert_openai_error(edit_post(temperature=3), 400, param="temperature")
    assert_openai_error(edit_post(top_p=-0.1), 400, param="top_p")
    assert_openai_error(edit_post(top_k=-1), 400, param="top_k")
    assert_openai_error(edit_post(max_tokens=0), 400, param="max_tokens")
    assert_openai_error(edit_post(filename=3), 400, param="filename", code="invalid_type")
    # an instruction that leaves the text no room in the context
    assert_openai_error(edit_post(instruction="Fix the typos. " * N_CTX), 400, param="instruction",
                        code="context_length_exceeded", says=str(N_CTX))
    assert_openai_error(edit_post(model="gpt-4o"), 404, code="model_not_found")
    assert_openai_error(edit_post(key=None), 401, code="invalid_api_key")
    assert_openai_error(edit_post(text="x" * (1024 * 1024 + 10)), 413, code="request_too_large")
    assert_openai_error(httpx.get(server + "/v1/lookahead/edits", timeout=10), 405)
    assert health(server)["status"] == "ok"


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
