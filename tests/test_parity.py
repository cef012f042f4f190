"""The speculative path against plain llama-cpp-python, on the real model, request by request.

Every request here runs with speculation on and drafting at every chance (a flat cost curve),
with the plain output registered as a reference, so nearly every token comes out of an
accepted draft. The prompts are ones whose greedy output has no near-tie (see test_model.py
on near-ties), so the texts must be identical, byte for byte, with llama-cpp-python's own.
"""
from __future__ import annotations

import re

import pytest

import lookahead
from conftest import flat_cost_model
from lookahead.adapters.llama_cpp import clear_kv_cache

pytestmark = pytest.mark.model

COUNT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
         "Write the numbers from 1 to 30 in words, separated by commas.<|im_end|>\n<|im_start|>assistant\n")
# A retelling: prose of the model's own (no number pattern that drafts would predict by
# themselves), whose words the stop test picks its stop string from.
STORY = ("<|im_start|>system\nRepeat the user's text exactly.<|im_end|>\n<|im_start|>user\n"
         "The old lighthouse keeper counted seven ships, two gulls and one lost kite before the evening storm "
         "rolled in from the west, and then he wrote all of it down in his blue notebook.<|im_end|>\n"
         "<|im_start|>assistant\n")
MULTIBYTE = ("<|im_start|>system\nRepeat the user's text exactly.<|im_end|>\n<|im_start|>user\n"
             "Renée et Tomás — “crème brûlée” à Zürich, 東京 😀<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture()
def pair(fresh):
    """(the plain Llama, a speculating wrapper of it) with an empty cache before each call."""
    fast = lookahead.wrap(fresh, calibrate=False)
    fast.cost = flat_cost_model(fast.target.max_batch)

    def plain(*args, **kwargs):
        clear_kv_cache(fresh)
        return fresh.create_completion(*args, **kwargs)

    def ours(*args, **kwargs):
        clear_kv_cache(fresh)
        return fast.create_completion(*args, **kwargs)

    return plain, ours, fast


def reference_for(plain, prompt, max_tokens=120):
    return plain(prompt, max_tokens=max_tokens, temperature=0)["choices"][0]["text"]


def same(a: dict, b: dict) -> None:
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"]
    assert a["usage"] == b["usage"]


@pytest.mark.parametrize("stop", [["twenty"], [",", "five"], ["ten,"], ["zzz-never"], []])
def test_stop_strings(pair, stop):
    plain, ours, _ = pair
    ref = reference_for(plain, COUNT)
    expected = plain(COUNT, max_tokens=120, temperature=0, stop=stop)
    got = ours(COUNT, max_tokens=120, temperature=0, stop=stop, references=[ref])
    same(got, expected)
    assert got["speculation"]["accepted"] > 0 or len(got["choices"][0]["text"]) < 8


def late_word(text: str) -> str:
    """A word of five or more letters in the second half of `text` that does not occur earlier:
    a stop string that plain decoding reaches late, whatever words this model chose."""
    for m in re.finditer(r"[A-Za-z]{5,}", text):
        if m.start() >= len(text) // 2 and text.find(m.group()) == m.start():
            return m.group()
    raise AssertionError(f"no late word to stop at in {text!r}")


def test_stop_strings_streamed(pair):
    """A stop string met inside an accepted draft, streamed: plain's text, finish reason 'stop'.

    (The stop string comes from plain's own output: a fixed one, such as "twenty" in the
    counting prompt, is never met where this model writes digits instead of words.)
    """
    plain, ours, _ = pair
    ref = reference_for(plain, STORY)
    stop = late_word(ref)
    expected = plain(STORY, max_tokens=120, temperature=0, stop=[stop])
    assert expected["choices"][0]["finish_reason"] == "stop"
    chunks = list(ours(STORY, max_tokens=120, temperature=0, stop=[stop], references=[ref], stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    spec = chunks[-1]["speculation"]
    print(f"\nstop {stop!r}: accepted {spec['accepted']} of {spec['generated_tokens']}")
    assert spec["accepted"] >= 0.6 * spec["generated_tokens"]


def test_echo(pair):
    plain, ours, _ = pair
    ref = reference_for(plain, COUNT, 40)
    same(ours(COUNT, max_tokens=40, temperature=0, echo=True, references=[ref]),
         plain(COUNT, max_tokens=40, temperature=0, echo=True))


def test_token_list_prompt(pair, fresh):
    plain, ours, _ = pair
    tokens = fresh.tokenize(COUNT.encode(), add_bos=False, special=True)
    ref = reference_for(plain, tokens, 60)
    got = ours(tokens, max_tokens=60, temperature=0, references=[ref])
    same(got, plain(tokens, max_tokens=60, temperature=0))
    assert got["speculation"]["accepted"] > 20


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_small_max_tokens(pair, max_tokens):
    plain, ours, _ = pair
    ref = reference_for(plain, COUNT)
    same(ours(COUNT, max_tokens=max_tokens, temperature=0, references=[ref]),
         plain(COUNT, max_tokens=max_tokens, temperature=0))


def test_max_tokens_none_runs_to_the_end(pair):
    plain, ours, _ = pair
    ref = reference_for(plain, COUNT, 400)
    same(ours(COUNT, max_tokens=None, temperature=0, references=[ref]), plain(COUNT, max_tokens=None, temperature=0))


def test_chat(pair, fresh):
    _, _, fast = pair
    messages = [{"role": "user", "content": "Write the numbers from 1 to 30 in words, separated by commas."}]
    clear_kv_cache(fresh)
    expected = fresh.create_chat_completion(messages, max_tokens=100, temperature=0)
    text = expected["choices"][0]["message"]["content"]
    clear_kv_cache(fresh)
    got = fast.create_chat_completion(messages, max_tokens=100, temperature=0, references=[text])
    assert got["choices"][0]["message"] == expected["choices"][0]["message"]
    assert got["usage"] == expected["usage"]
    assert got["speculation"]["accepted"] > 20
    stop = text[20:24]  # a stop string the answer is known to contain
    assert len(stop) == 4, text
    clear_kv_cache(fresh)
    chunks = list(fast.create_chat_completion(messages, max_tokens=100, temperature=0, references=[text],
                                              stream=True, stop=[stop]))
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert streamed == text[: text.index(stop)]
    assert chunks[-1]["speculation"]["accepted"] > 0


def test_an_answer_prefix_is_plain_decoding_of_the_prompt_it_ends(pair, fresh, monkeypatch):
    """`answer_prefix` goes after the chat template's prompt: the answer is plain decoding's
    continuation of the templated prompt followed by the prefix, without the prefix itself."""
    plain, _, fast = pair
    messages = [{"role": "user", "content": "Write the numbers from 1 to 30 in words, separated by commas."}]
    prompts = []
    complete = fast.create_completion
    monkeypatch.setattr(fast, "create_completion", lambda prompt, **kw: prompts.append(prompt) or complete(prompt, **kw))
    prefix = "Here they are: one, two,"
    clear_kv_cache(fresh)
    fast.create_chat_completion(messages, max_tokens=1, temperature=0)
    clear_kv_cache(fresh)
    fast.create_chat_completion(messages, max_tokens=1, temperature=0, answer_prefix=prefix)
    templated, prefixed = prompts
    assert prefixed == [*templated, *fresh.tokenize(prefix.encode(), add_bos=False, special=False)]
    expected = reference_for(plain, prefixed, 60)
    clear_kv_cache(fresh)
    got = fast.create_chat_completion(messages, max_tokens=60, temperature=0, answer_prefix=prefix,
                                      references=[expected])
    assert got["choices"][0]["message"]["content"] == expected != ""
    assert got["speculation"]["accepted"] > 10
    assert got["usage"]["prompt_tokens"] == len(prefixed)
    clear_kv_cache(fresh)
    chunks = list(fast.create_chat_completion(messages, max_tokens=60, temperature=0, answer_prefix=prefix,
                                              references=[expected], stream=True))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == expected
    with pytest.raises(ValueError, match="answer_prefix"):
        fast.create_chat_completion(messages, answer_prefix=3)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(ValueError, match="answer_prefix cannot be combined with tools"):
        fast.create_chat_completion(messages, answer_prefix=prefix, tools=[tool])


def test_two_interleaved_streams_keep_their_own_stats(pair, fresh):
    """Stats travel with each request: interleaving two chat streams does not mix them."""
    _, _, fast = pair
    a = fast.create_chat_completion([{"role": "user", "content": "Say one word."}], max_tokens=3,
                                    temperature=0, stream=True)
    b = fast.create_chat_completion([{"role": "user", "content": "Count to five."}], max_tokens=9,
                                    temperature=0, stream=True, speculate=False)
    last_b = list(b)[-1]
    last_a = list(a)[-1]
    assert last_a["speculation"]["generated_tokens"] >= 3 and last_a["speculation"]["speculative"] is True
    assert last_b["speculation"]["generated_tokens"] >= 9 and last_b["speculation"]["speculative"] is False


@pytest.mark.parametrize("after", [1, 4])
def test_a_stream_closed_early_then_another_request(pair, fresh, after):
    plain, ours, fast = pair
    ref = reference_for(plain, COUNT)
    expected = plain(MULTIBYTE, max_tokens=30, temperature=0)
    stream = ours(COUNT, max_tokens=120, temperature=0, references=[ref], stream=True)
    for _ in range(after):
        next(stream)
    stream.close()
    got = fast.create_completion(MULTIBYTE, max_tokens=30, temperature=0)  # cache as the closed stream left it
    same(got, expected)


def test_multibyte_text(pair):
    plain, ours, _ = pair
    expected = plain(MULTIBYTE, max_tokens=40, temperature=0)
    text = expected["choices"][0]["text"]
    assert any(ord(ch) > 127 for ch in text), text
    got = ours(MULTIBYTE, max_tokens=40, temperature=0, references=[text])
    same(got, expected)
    chunks = [c["choices"][0]["text"] for c in ours(MULTIBYTE, max_tokens=40, temperature=0, references=[text],
                                                     stream=True)]
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
