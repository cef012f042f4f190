"""/v1/lookahead/edits without a model: the app over a scripted stand-in for `lookahead.Lookahead`.

The endpoint's shapes, the document it assembles and its cancellation, checked in a second;
tests/test_server.py runs the same endpoint in a real server process with the embedded model.
"""
from __future__ import annotations

import contextlib
import json
import re
import threading

import pytest

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")

from starlette.testclient import TestClient  # noqa: E402

from lookahead import edit  # noqa: E402
from lookahead.server.app import ServerConfig, create_app  # noqa: E402
from lookahead.server.routes.edits import Cancelled, StopWhenCancelled  # noqa: E402

BUFFER = "Keep this line.\n\nteh cat sat on teh mat.\n\nKeep this one too.\n"


class Scripted:
    """Looks like a Lookahead to the app and to `edit.rewrite`: word tokens, answers made by
    `answer(prediction)`, one word per model step."""

    def __init__(self, answer, n_ctx=4096, on_step=None):
        self.answer = answer
        self.on_step = on_step
        self.steps = 0
        self.closed = 0
        self.requests: list[dict] = []

        class Target:  # what lookahead.edit reads of a wrapper's target
            pass

        self.target = Target()
        self.target.n_ctx = n_ctx
        self.n_ctx = n_ctx  # what the server reads of a wrapper
        self.n_vocab = 100

    def tokenize(self, text):
        return text.split()

    def count_tokens(self, text):
        return len(text.split())

    def prompt_cache_off(self):
        return contextlib.nullcontext()

    def create_chat_completion(self, messages, prediction=None, stream=False, max_tokens=None, **kw):
        self.requests.append(dict(prediction=prediction, max_tokens=max_tokens, **kw))
        words = re.findall(r"\s*\S+|\s+$", self.answer(prediction))[:max_tokens]

        def chunks():
            try:
                for word in words:
                    self.steps += 1
                    if self.on_step is not None:
                        self.on_step(self.steps)
                    yield {"choices": [{"delta": {"content": word}, "finish_reason": None}]}
                yield {"choices": [{"delta": {}, "finish_reason": "stop"}],
                       "speculation": {"prompt_tokens": 9, "generated_tokens": len(words), "drafted": 4,
                                       "accepted": 3, "prediction_drafted": 4, "prediction_accepted": 3}}
            finally:
                self.closed += 1

        return chunks()


def typo_fixer(source):
    return "Here is the revised document:\n\n" + source.replace("teh", "the")


def test_whole_and_streamed_edit_of_a_region():
    model = Scripted(typo_fixer)
    start, end = BUFFER.index("teh cat"), BUFFER.index("\n\nKeep this one")
    body = {"text": BUFFER, "instruction": "Fix the typos", "region": [start, end], "temperature": 0, "seed": 3}
    with TestClient(create_app(model, ServerConfig(model_id="m"))) as client:
        whole = client.post("/v1/lookahead/edits", json=body).json()
        with client.stream("POST", "/v1/lookahead/edits", json={**body, "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert model.requests[0]["prediction"] == "teh cat sat on teh mat."  # only the region is sent
    assert model.requests[0]["seed"] == 3 and model.requests[0]["temperature"] == 0
    assert whole["object"] == "lookahead.edit" and whole["text"] == "the cat sat on the mat."
    assert whole["document"] == "Keep this line.\n\nthe cat sat on the mat.\n\nKeep this one too.\n"
    assert whole["region"] == [start, end] and whole["finish_reason"] == "stop" and whole["warnings"] == []
    assert whole["usage"]["prompt_tokens"] == 9 and whole["usage"]["completion_tokens"] > 0
    assert whole["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 3
    assert whole["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] == 1
    assert data[-1] == "[DONE]"
    *chunks, final = [json.loads(d) for d in data[:-1]]
    assert [c["object"] for c in chunks] == ["lookahead.edit.chunk"] * len(chunks) and chunks
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert final["object"] == "lookahead.edit" and "document" not in final
    assert {k: final[k] for k in ("finish_reason", "region", "pieces", "usage")} == \
        {k: whole[k] for k in ("finish_reason", "region", "pieces", "usage")}


def test_errors_name_the_field():
    model = Scripted(typo_fixer)
    with TestClient(create_app(model, ServerConfig(model_id="m", api_key="k"))) as client:
        def error(status, **body):
            r = client.post("/v1/lookahead/edits", json={"text": BUFFER, "instruction": "Fix", **body},
                            headers={"Authorization": "Bearer k"})
            assert r.status_code == status, r.text
            return r.json()["error"]

        assert error(400, instruction=" ")["param"] == "instruction"
        assert error(400, region=[0, len(BUFFER) + 1])["param"] == "region"
        assert error(400, region=[4, 2])["param"] == "region"
        assert error(400, region=[4])["param"] == "region"
        assert error(400, text=7)["param"] == "text"
        assert error(400, min_p=2)["param"] == "min_p"
        assert error(400, repeat_penalty=0)["param"] == "repeat_penalty"
        assert error(404, model="other")["code"] == "model_not_found"
        assert client.post("/v1/lookahead/edits", json={"text": "", "instruction": "x"}).status_code == 401
    assert model.requests == []  # none of them reached the model


def test_an_instruction_too_long_for_the_context_names_the_instruction():
    model = Scripted(typo_fixer, n_ctx=128)
    with TestClient(create_app(model, ServerConfig(model_id="m"))) as client:
        r = client.post("/v1/lookahead/edits", json={"text": BUFFER, "instruction": "Fix the typos " * 40})
    assert r.status_code == 400 and r.json()["error"]["param"] == "instruction"
    assert r.json()["error"]["code"] == "context_length_exceeded" and "128" in r.json()["error"]["message"]


def test_a_cancelled_edit_stops_at_the_next_model_step_even_while_no_text_comes():
    # The answer is chatter the rewrite drops, so it yields no text for as long as the model
    # goes on (the server's decoder, which looks for a cancellation after each piece of text,
    # would wait to the output bound). The model's stream ends at the step after the
    # cancellation, and is closed.
    cancelled = threading.Event()
    source = "\n".join(f"line {i}" for i in range(40)) + "\n"
    model = Scripted(lambda s: "Sure, here are the changes:\n" * 40, on_step=lambda n: n == 12 and cancelled.set())
    rw = edit.rewrite(StopWhenCancelled(model, cancelled), source, "Copy")
    with pytest.raises(Cancelled):
        next(rw)
    assert model.steps == 12 and model.closed == 1
    # without the cancellation the same rewrite runs to its bound before any text
    model.on_step = None
    uncancelled = edit.rewrite(StopWhenCancelled(model, threading.Event()), source, "Copy")
    next(uncancelled)
    assert model.steps - 12 == model.requests[-1]["max_tokens"] > 100
    # and a rewrite cancelled before it starts sends no request
    with pytest.raises(Cancelled):
        list(edit.rewrite(StopWhenCancelled(model, cancelled), source, "Copy"))
    assert len(model.requests) == 2  # the two above
