"""On the default model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M: Q4_K and Q6_K weights), with flash
attention off and on, in the exact mode lookahead turns on by default: greedy output with
speculation is plain llama-cpp-python's on the same Llama, token for token, with no near-tie
allowance, in a chat, a completion with a stop string, and a stream."""
from __future__ import annotations

import pytest

import lookahead
from conftest import SAMPLES
from lookahead.adapters import health

pytestmark = pytest.mark.model

RETRY_JS = (SAMPLES / "code" / "retry.js").read_text()
TEXTUTILS = (SAMPLES / "code" / "textutils.py").read_text()
RENAME = [{"role": "user", "content": "Rename the function fetchJson to fetchJsonWithRetry. Reply with the "
                                      "whole file in a code block.\n\n" + RETRY_JS}]
QUESTION = [{"role": "user", "content": "From this file, which functions return a dict? Quote their "
                                        "signatures.\n\n" + TEXTUTILS}]


@pytest.fixture(scope="module", params=[False, True], ids=["flash-attn-off", "flash-attn-on"])
def qwen(request, default_model_path):
    """llama-cpp-python's default (flash attention off), and lookahead's (on, as lookahead.load
    and the commands load models)."""
    import llama_cpp

    if not health.exact_batches_available():
        pytest.skip("this build lacks lookahead's llama.cpp patches (scripts/setup.sh applies them)")
    if request.param and health.FLASH_ATTN_EXACT not in health.build_patches():
        pytest.skip("this build lacks lookahead's flash attention patch (scripts/setup.sh applies it)")
    llm = llama_cpp.Llama(model_path=str(default_model_path), n_ctx=2048, flash_attn=request.param, verbose=False)
    return llm, lookahead.wrap(llm)


def test_the_default_model_is_exact_here(qwen):
    llm, fast = qwen
    assert fast.target.batch_exact, fast.target.batch_exact_reason


def test_a_chat_edit_is_plain_decoding_s_token_for_token(qwen):
    llm, fast = qwen
    plain = llm.create_chat_completion(RENAME, temperature=0, max_tokens=160)
    spec = fast.create_chat_completion(RENAME, temperature=0, max_tokens=160)
    assert spec["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert spec["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    stats = spec["speculation"]
    assert stats["exact"] is True and stats["accepted"] > 40, stats


def test_a_completion_with_a_stop_string_is_plain_decoding_s(qwen):
    llm, fast = qwen
    prompt = TEXTUTILS + "\n\ndef count_lines(text: str) -> int:\n"
    plain = llm.create_completion(prompt, temperature=0, max_tokens=96, stop=["\n\n\n", "def "])
    spec = fast.create_completion(prompt, temperature=0, max_tokens=96, stop=["\n\n\n", "def "])
    assert spec["choices"][0]["text"] == plain["choices"][0]["text"] != ""
    assert spec["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]


def test_a_streamed_answer_is_plain_decoding_s(qwen):
    llm, fast = qwen
    plain = llm.create_chat_completion(QUESTION, temperature=0, max_tokens=96)
    chunks = list(fast.create_chat_completion(QUESTION, temperature=0, max_tokens=96, stream=True))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"] != ""


def test_a_bug_fix_keeps_every_line_it_does_not_fix(qwen):
    """"Fix the bug in chunked" on a whole file: the model's own answer stops right after
    chunked; the rewrite goes on with the file's remaining lines. Only the buggy line changes
    (to one line or a loop, as the build's rounding has the model write it), and the new
    chunked keeps the last, partial chunk."""
    from lookahead import edit

    llm, fast = qwen
    result = edit.rewrite(fast, TEXTUTILS, "Fix the bug in chunked: it drops the last, partial chunk",
                          filename="textutils.py", stream=False)
    buggy = "    return [items[i:i + size] for i in range(0, len(items) - size, size)]\n"
    head, tail = TEXTUTILS.split(buggy)
    assert result.text.startswith(head) and result.text.endswith(tail)
    assert result.text[len(head) : len(result.text) - len(tail)] != buggy
    namespace: dict = {}
    exec(compile(result.text, "textutils.py", "exec"), namespace)
    assert namespace["chunked"](list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert result.finish_reason == "stop" and not result.diverged
    assert any("ended before the end of the text" in w for w in result.warnings), result.warnings
