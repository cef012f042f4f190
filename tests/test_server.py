"""The server's endpoints in process: `create_app` over the embedded model as `lookahead serve`
loads it, through Starlette's TestClient (the `openai` client over it, and raw requests for
what a client library would not send). What needs a real process (start-up, uvicorn, clients
that leave, Ctrl-C) is in test_server_process.py; the checks that need no model in
test_server_checks.py.

Greedy answers are checked against another wrapper of the same model in this process: the
same request gives the same text through the server. Nothing here asserts on time.
"""
from __future__ import annotations

import json
import random
import threading

import openai
import pytest

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")

from starlette.testclient import TestClient  # noqa: E402

from conftest import SAMPLES  # noqa: E402
from server_helpers import (BUFFER, HELLO, KEY, LONG_BUFFER, MODEL, N_CTX, assert_openai_error,  # noqa: E402
                            sse_data, stream_chat)

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def http(model_path):
    """A TestClient over the app `lookahead serve --n-ctx 1024 --api-key KEY --max-queue 1
    --max-body-mib 1 --max-tokens 64 --threads 1` serves (one thread: the cores are shared)."""
    from lookahead.cli.options import load_wrapped
    from lookahead.server.app import ServerConfig, create_app

    fast = load_wrapped(model_path, N_CTX, 1, 0, max_draft=64)
    config = ServerConfig(model_id=MODEL, aliases=(model_path.name, str(model_path)), api_key=KEY, max_queue=1,
                          max_body_bytes=1024 * 1024, max_tokens=64)
    with TestClient(create_app(fast, config)) as client:
        yield client


@pytest.fixture(scope="module")
def client(http):
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key=KEY, http_client=http, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def local(model_path):
    """The same model in this process, apart from the server's: what its answers must equal."""
    import llama_cpp

    import lookahead

    # One thread and no timing calibration: the answers do not depend on either. Flash attention
    # on, as `lookahead serve` loads its model: it changes the logits.
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=N_CTX, n_threads=1, n_threads_batch=1, flash_attn=True,
                          verbose=False)
    return lookahead.wrap(llm, calibrate=False, threads="keep")


def health(http) -> dict:
    return http.get("/health").json()


def post(http, route, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return http.post(route, json=body, headers=headers, **kw)


# ---- the endpoints ---------------------------------------------------------------------------
def test_health_and_models(http, client):
    assert health(http)["status"] == "ok" and health(http)["n_ctx"] == N_CTX
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


def test_zed_edit_prediction_request(http, local):
    # The body Zed's `open_ai_compatible_api` edit prediction posts: temperature null (the
    # server's default, greedy), 14 stop strings, a field of its own (`environment`).
    stops = ["<|endoftext|>", "<|file_separator|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_middle|>",
             "<|fim_suffix|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<PRE>", "<SUF>", "<MID>",
             "[PREFIX]", "[SUFFIX]"]
    prompt = "<fim_prefix>def add(a, b):\n    return <fim_suffix>\n<fim_middle>"
    r = post(http, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": None,
                                       "stop": stops, "environment": None})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] and out["object"] == "text_completion" and out["model"] == MODEL
    want = local.create_completion(prompt, max_tokens=8, temperature=0, stop=stops)
    assert out["choices"][0]["text"] == want["choices"][0]["text"]  # greedy, cut at the same stops
    assert out["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    assert out["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
    assert not any(stop in out["choices"][0]["text"] for stop in stops)


def test_fuzzed_requests_then_a_correct_answer(http, client, local):
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
        r = http.post(route, content=raw, headers={"Authorization": f"Bearer {KEY}",
                                                   "Content-Type": "application/json"})
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
    assert health(http)["status"] == "ok"


def test_two_concurrent_clients(http, client, local):
    prompts = ["Name three colours.", "Name three animals."]
    results: dict[int, str] = {}
    served = health(http)["served"]

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
    assert health(http)["served"] == served + 2


def test_non_streamed_answers_have_the_librarys_shape(http, local):
    """Non-streamed requests are decoded as streams (to be stoppable) and assembled: the same
    fields and text as the library's own whole response, echo included."""
    chat = post(http, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 10, "temperature": 0}).json()
    want = local.create_chat_completion(HELLO, max_tokens=10, temperature=0)
    assert set(chat) == set(want) and set(chat["choices"][0]) == set(want["choices"][0])
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"] == want["choices"][0]["message"]
    prompt = "One, two, three,"
    for sent in (prompt, local.tokenize(prompt)):
        out = post(http, "/v1/completions", {"prompt": sent, "max_tokens": 6, "temperature": 0, "echo": True}).json()
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


# ---- /v1/lookahead/edits: the editing API (lookahead.edit) over HTTP --------------------------------
def edit_events(http, body) -> list[dict]:
    """The events of a streamed edit, which must end with `data: [DONE]`."""
    with http.stream("POST", "/v1/lookahead/edits", json={**body, "stream": True},
                     headers={"Authorization": f"Bearer {KEY}"}) as r:
        return [json.loads(d) for d in sse_data(r)]


def test_edit_a_region_streamed_and_whole(http, local):
    from lookahead import edit

    start, end = BUFFER.index("teh cat"), BUFFER.index("\n\nKeep this one")
    body = {"model": MODEL, "text": BUFFER, "instruction": "Fix the typos", "region": [start, end],
            "filename": "notes.md", "temperature": 0}
    *chunks, final = edit_events(http, body)
    assert chunks and all(c["object"] == "lookahead.edit.chunk" and c["piece"] == 0 for c in chunks)
    assert final["object"] == "lookahead.edit" and "document" not in final
    assert len({c["id"] for c in [*chunks, final]}) == 1
    whole = post(http, "/v1/lookahead/edits", body).json()
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


def test_edit_of_a_buffer_longer_than_the_context_streams_its_pieces_in_order(http):
    # max_tokens=1 over the whole rewrite: the first piece uses it up, and every later piece is
    # kept as it was (and said so), so the pieces can be checked without a long decode.
    *chunks, final = edit_events(http, {"text": LONG_BUFFER, "instruction": "Fix the typos", "filename": "plan.md",
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


def test_edit_errors_name_the_field(http):
    def edit_post(key=KEY, **fields):
        return post(http, "/v1/lookahead/edits", {"text": BUFFER, "instruction": "Fix the typos", **fields}, key=key)

    assert_openai_error(edit_post(instruction="  "), 400, param="instruction", code="invalid_value")
    assert_openai_error(edit_post(instruction="", stream=True), 400, param="instruction")
    assert_openai_error(post(http, "/v1/lookahead/edits", {"text": BUFFER}), 400, param="instruction",
                        code="missing_required_parameter")
    assert_openai_error(post(http, "/v1/lookahead/edits", {"instruction": "Fix"}), 400, param="text",
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
    assert_openai_error(http.get("/v1/lookahead/edits"), 405)
    assert health(http)["status"] == "ok"
