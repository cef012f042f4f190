"""The request pipeline on bytes and token lists: EOS, stop strings, UTF-8, streaming, criteria."""
from __future__ import annotations

import random

import numpy as np
import pytest

from lookahead.pipeline import CompletionText, stop_prefix_hold, utf8_complete_length

EOS = 0


def make(pieces: dict[int, bytes], max_tokens=100, stops=(), stream=False, criteria=None, prompt=(1, 2, 3)):
    return CompletionText(pieces.__getitem__, lambda t: t == EOS, max_tokens, stops, stream, prompt, criteria)


def run(text: CompletionText, tokens, rows=None) -> bytes:
    """Push tokens until finished; return everything streamed (close() included)."""
    out = b""
    for i, t in enumerate(tokens):
        out += text.push(t, None if rows is None else rows[i])
        if text.finished:
            break
    return out + text.close()


@pytest.mark.parametrize("data, expected", [
    (b"", 0), (b"abc", 3), ("é".encode(), 2), ("é".encode()[:1], 0), (b"a" + "€".encode()[:2], 1),
    ("😀".encode()[:3], 0), ("😀".encode(), 4), (b"ab\x80", 3),  # a stray continuation byte is not held
])
def test_utf8_complete_length(data, expected):
    assert utf8_complete_length(data) == expected


@pytest.mark.parametrize("text, stops, hold", [
    (b"hello wor", [b"world"], 3), (b"hello", [b"xyz"], 0), (b"ab", [b"b", b"abc"], 2), (b"", [b"a"], 0),
])
def test_stop_prefix_hold(text, stops, hold):
    assert stop_prefix_hold(text, stops) == hold


PIECES = {1: b"Hello", 2: b" wor", 3: b"ld", 4: b"!", 5: "é".encode()[:1], 6: "é".encode()[1:], 7: b"\n",
          8: "€".encode()[:2], 9: "€".encode()[2:] + b"x", 10: b" the", 11: b" end"}


def test_eos_ends_with_stop_and_is_not_part_of_the_text():
    text = make(PIECES)
    run(text, [1, 2, 3, EOS, 4])
    assert (text.text, text.tokens, text.finish_reason) == (b"Hello world", [1, 2, 3], "stop")


def test_max_tokens_ends_with_length():
    text = make(PIECES, max_tokens=2)
    run(text, [1, 2, 3, 4])
    assert (text.text, text.finish_reason) == (b"Hello wor", "length")


def test_a_character_split_across_tokens_runs_past_max_tokens_to_finish_it():
    text = make(PIECES, max_tokens=2)
    run(text, [1, 5, 6, 4])  # "Hello" + é in two tokens: the second is taken although max is 2
    assert text.text == "Helloé".encode() and text.tokens == [1, 5, 6] and text.finish_reason == "length"


def test_the_first_stop_string_in_list_order_cuts_the_text():
    text = make(PIECES, stops=["ld", "wor"])
    run(text, [1, 2, 3, 4])
    assert (text.text, text.finish_reason) == (b"Hello ", "stop")  # "wor" is found as soon as token 2 arrives
    text = make(PIECES, stops=["!", "d"])
    run(text, [1, 2, 3, 4])
    assert text.text == b"Hello worl"  # "d" arrives first; "!" never came


def test_a_stop_string_that_spans_tokens_and_a_multibyte_character():
    stop = "é\n"
    text = make(PIECES, stops=[stop], stream=True)
    streamed = run(text, [1, 5, 6, 7, 4])
    assert text.text == b"Hello" and text.finish_reason == "stop"
    assert streamed == b"Hello"  # the é (a possible stop start) was held back, then dropped


def test_stream_never_shows_half_a_character_or_a_stop_prefix():
    text = make(PIECES, stops=["words"], stream=True)
    shown = [text.push(t) for t in (1, 8, 9, 2)]
    assert shown[1] == b""  # "€" incomplete: nothing
    assert shown[2] == "€x".encode()
    assert shown[3] == b" "  # "wor" could be the start of "words": held back
    assert text.close() == b"wor"  # the generation ended without it: shown at the end


@pytest.mark.parametrize("seed", range(20))
def test_streamed_text_equals_the_whole_text(seed):
    rng = random.Random(seed)
    tokens = [rng.choice(list(PIECES)) for _ in range(rng.randrange(1, 30))] + [EOS]
    stops = rng.choice([[], ["ld!"], ["é\n", "the end"], ["\n"]])
    max_tokens = rng.randrange(1, 40)
    whole = make(PIECES, max_tokens=max_tokens, stops=stops)
    run(whole, tokens)
    streaming = make(PIECES, max_tokens=max_tokens, stops=stops, stream=True)
    streamed = run(streaming, tokens)
    assert streamed == streaming.text == whole.text
    assert streaming.finish_reason == whole.finish_reason
    for s in stops:
        assert s.encode() not in whole.text


def test_stopping_criteria_see_the_evaluated_ids_and_the_tokens_row():
    seen = []

    def criteria(ids, row):
        seen.append((ids.tolist(), None if row is None else float(row[0])))
        return len(ids) >= 5

    rows = [np.array([10.0 + i]) for i in range(4)]
    text = make(PIECES, criteria=criteria, prompt=(101, 102, 103))
    run(text, [1, 2, 3, 4], rows)
    # before taking token i: the prompt and the tokens taken so far, and token i's own row
    assert seen[0] == ([101, 102, 103], 10.0)
    assert seen[1] == ([101, 102, 103, 1], 11.0)
    assert seen[2] == ([101, 102, 103, 1, 2], 12.0)  # criteria true: token 3 is not taken
    assert text.tokens == [1, 2] and text.finish_reason == "stop"
    assert seen[3] == ([101, 102, 103, 1, 2], 12.0)  # and once more at the end, as llama-cpp-python


def test_criteria_at_the_end_turn_a_length_finish_into_stop():
    text = make(PIECES, max_tokens=2, criteria=lambda ids, row: len(ids) >= 5)
    run(text, [1, 2, 3], [np.zeros(1)] * 3)
    assert text.tokens == [1, 2] and text.finish_reason == "stop"


def test_bad_max_tokens_and_push_after_finish():
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        make(PIECES, max_tokens=0)
    text = make(PIECES, max_tokens=1)
    text.push(1)
    with pytest.raises(RuntimeError, match="after the completion finished"):
        text.push(2)
