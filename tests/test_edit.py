"""lookahead.edit: the text logic (pure) and rewrites with the embedded model."""
from __future__ import annotations

import os
import re

import pytest

from conftest import SAMPLES
from lookahead import edit
from lookahead.edit import (AnswerCleaner, answer_prefix, build_rewrite_messages, count_consecutive, find_loop, is_chatter,
                            output_bound, piece_budget, resume_offset, split_text)

TALLYBOOK = (SAMPLES / "docs" / "tallybook_readme.md").read_text()


def words(text: str) -> int:
    """A stand-in tokenizer for the pure tests: one token per whitespace-separated word."""
    return len(text.split())


def stream_clean(answer: str, source: str, step: int = 5) -> tuple[str, AnswerCleaner]:
    """Feed `answer` to a cleaner `step` characters at a time, as a model stream would."""
    cleaner = AnswerCleaner(source)
    out = "".join(cleaner.feed(answer[i : i + step]) for i in range(0, len(answer), step))
    return out + cleaner.finish(), cleaner


# ---- the prompt ----------------------------------------------------------------------------
def test_prompt_puts_the_document_first_so_edits_share_a_prefix():
    a = build_rewrite_messages(TALLYBOOK, "Fix the typos", "README.md")
    b = build_rewrite_messages(TALLYBOOK, "Use British spelling.", "README.md")
    assert a[:2] == b[:2] and [m["role"] for m in a] == ["system", "user", "user"]
    assert a[1]["content"] == TALLYBOOK
    assert a[2]["content"] == "Fix the typos in the document above."
    assert b[2]["content"] == "Use British spelling in the document above."
    code = build_rewrite_messages("x = 1\n", "Add type hints", "main.py")
    assert "revised file" in code[0]["content"] and code[2]["content"] == "Add type hints in the file above."
    with pytest.raises(ValueError, match="instruction is empty"):
        build_rewrite_messages(TALLYBOOK, "  ")


def test_a_code_file_s_answer_starts_with_its_fence():
    assert answer_prefix("x = 1\n", "main.py") == "```python\n"
    assert answer_prefix("x = 1\n", "src/App.JS") == "```javascript\n"
    assert answer_prefix("a: 1\n", "conf.yml") == "```yaml\n"
    assert answer_prefix(TALLYBOOK, "README.md") == answer_prefix("x = 1\n", None) == ""
    assert answer_prefix("\n```python\nx = 1\n```\n", "snippet.py") == ""  # the file opens with a fence itself
    text = "def a():\n    return 1\n\n\ndef b():\n    return 2\n"
    # the model goes on after the fence: the file, then the fence that closes it and a remark
    model = ScriptedModel(lambda s: "```python\n" + s.replace("2", "3") + "\n```\nI changed b.")
    result = edit.rewrite(model, text, "Return 3 from b", filename="m.py", stream=False)
    assert [r["answer_prefix"] for r in model.requests] == ["```python\n"]
    assert result.text == text.replace("2", "3") and result.warnings == [] and result.finish_reason == "stop"
    prose = ScriptedModel(lambda s: s.upper())
    edit.rewrite(prose, TALLYBOOK, "Shout", filename="README.md", stream=False)
    assert [r["answer_prefix"] for r in prose.requests] == [None]
    with pytest.raises(ValueError, match="answer_prefix"):
        edit.rewrite(model, text, "Return 3 from b", filename="m.py", answer_prefix="```\n")


@pytest.mark.parametrize("after_prefix", ["```python\n", "Here is the fixed file:\n```python\n",
                                          "Here is the fixed file:\n\n```py\n"])
def test_a_fence_or_chatter_repeated_after_the_prompt_s_fence_is_dropped(after_prefix):
    text = "def a():\n    return 1\n\n\ndef b():\n    return 2\n"
    model = ScriptedModel(lambda s: "```python\n" + after_prefix + s.replace("2", "3") + "\n```\nI changed b.")
    result = edit.rewrite(model, text, "Return 3 from b", filename="m.py", stream=False)
    assert result.text == text.replace("2", "3") and result.warnings == []


def test_an_answer_that_closes_the_prompt_s_fence_at_once_keeps_the_original():
    text = "def a():\n    return 1\n"
    model = ScriptedModel(lambda s: "```python\n```\nThe file is already correct.")
    result = edit.rewrite(model, text, "Fix a", filename="m.py", stream=False)
    assert result.text == text and result.pieces[0].finish_reason == "empty"
    assert result.warnings == ["the rewrite: the model returned no text; kept the original"]


# ---- cleaning: fences and chatter ----------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_fenced_answer_with_chatter_is_unwrapped_and_the_tail_dropped(step):
    source = "# Title\n\nSome text.\n\n```bash\npip install .\n```\n"
    answer = ("Here is the revised document:\n\n```markdown\n# Title\n\nSome better text.\n\n"
              "```bash\npip install .\n```\n```\n\nI fixed the wording of the first paragraph.")
    out, cleaner = stream_clean(answer, source, step)
    assert out == "# Title\n\nSome better text.\n\n```bash\npip install .\n```"
    assert cleaner.stopped == "fence"
    assert cleaner.dropped[:2] == ["Here is the revised document:", "```markdown"]


def test_a_source_that_starts_with_a_fence_keeps_it():
    source = "```\nverbatim\n```\n"
    out, _ = stream_clean("```\nverbatim!\n```\n", source)
    assert out == "```\nverbatim!\n```"


def test_stray_closing_fence_at_the_end_is_dropped():
    out, _ = stream_clean("line one\nline two\n```\n", "line one\nline 2\n")
    assert out == "line one\nline two"


@pytest.mark.parametrize("line, chatter", [
    ("Here is the revised document:", True),
    ("Sure! Here's the corrected text.", True),
    ("**Revised document:**", True),
    ("The revised README", True),
    ("Here we describe the install steps in detail and why they matter", False),
    ("# tallybook", False),
    ("Certainly the fastest way to install it is pip", False),
])
def test_chatter_lines(line, chatter):
    assert is_chatter(line) is chatter


def test_a_first_line_that_is_in_the_source_is_never_dropped_as_chatter():
    source = "Here is the revised plan:\n\n- one\n"
    out, _ = stream_clean("Here is the revised plan:\n\n- one\n- two\n", source)
    assert out.startswith("Here is the revised plan:")


# ---- loops ---------------------------------------------------------------------------------------
def test_the_demo_loop_is_stopped_and_cut_to_one_copy():
    # The loop a small model (SmolLM2-135M, instruction-first prompt) falls into on the
    # tallybook README: a line whose version number counts up, forever.
    head = "# tallybook\n\nTrack your time.\n\n## Installation\n\n"
    answer = head + "".join(f"To install tallybook, you need to have Python 3.{n} or newer.\n\n" for n in range(9, 40))
    out, cleaner = stream_clean(answer, TALLYBOOK)
    assert cleaner.stopped == "loop"
    assert out == head + "To install tallybook, you need to have Python 3.9 or newer."
    assert out.count("To install") == 1


def test_a_block_of_lines_repeated_back_to_back_is_a_loop():
    block = "To install it:\n\n```bash\npip install -r requirements.txt\n```\n\n"
    out, cleaner = stream_clean("# Doc\n\n" + block * 4, "# Doc\n\nTo install it, run pip.\n")
    assert cleaner.stopped == "loop"
    assert out.count("pip install") == 1


def test_a_ten_line_block_with_blank_lines_is_a_loop():
    # A loop of a plain greedy rewrite of the tallybook README: five paragraphs, ten lines
    # with the blank ones, repeated until the output bound.
    block = ("To see what you worked on this week, run:\n\ntallybook report --week\n\n"
             "The report lists each project, the number of entries and total time.\n\n"
             "When you are done, stop the timer:\n\ntallybook stop\n\n")
    out, cleaner = stream_clean("# tallybook\n\n" + block * 6, TALLYBOOK)
    assert cleaner.stopped == "loop"
    assert out.count("tallybook stop") == 1
    assert out.startswith("# tallybook\n\nTo see what")


def test_repeats_that_the_source_has_are_not_a_loop():
    source = "rows:\n" + "| x | 0 |\n" * 4 + "end\n"
    out, cleaner = stream_clean(source.replace("rows", "Rows"), source)
    assert cleaner.stopped is None
    assert out == source.replace("rows", "Rows").rstrip("\n")


def test_short_lines_may_repeat_twice_but_not_three_times():
    assert find_loop(["a", "}", "}"]) is None
    assert find_loop(["a", "}", "}", "}"]) == (1, 2)
    assert find_loop(["", "", "", "", ""]) is None  # blank lines are never a loop
    long_line = "This sentence is long enough to count as content."
    assert find_loop(["x", long_line, long_line]) == (1, 1)


def test_count_consecutive_copies_in_the_source():
    assert count_consecutive(["a", "b", "a", "b", "a", "b", "c"], ["a", "b"]) == 3
    assert count_consecutive(["a", "b", "c"], ["b", "a"]) == 0


def test_held_lines_are_released_once_the_repeat_breaks():
    # "- item" twice is not (yet) a loop: held while it might become one, then released.
    cleaner = AnswerCleaner("list\n")
    shown = cleaner.feed("list:\n- item\n- item\n")
    assert "- item\n- item" not in shown
    shown += cleaner.feed("- other\n") + cleaner.finish()
    assert shown == "list:\n- item\n- item\n- other"
    assert cleaner.stopped is None


def test_streamed_text_equals_the_cleaned_text():
    answer = "Sure, here is the revised document:\n```\nA\n\nB  \nB2\n\n\nC\n```\n"
    for step in (1, 2, 7, 100):
        out, cleaner = stream_clean(answer, "A\n\nB\n\nC\n", step)
        assert out == cleaner.text == "A\n\nB  \nB2\n\n\nC"


# ---- bounds and splitting -------------------------------------------------------------------------
def test_output_bound_and_piece_budget():
    assert output_bound(507) == 660 + 32  # ceil(1.3 * 507) + slack
    assert output_bound(0) == 32
    budget = piece_budget(512, 100)
    assert budget + output_bound(budget) + 100 <= 512


def long_markdown(sections: int = 12) -> str:
    """A deterministic long Markdown text built from the sample documents."""
    docs = [(SAMPLES / "docs" / name).read_text() for name in ("tallybook_readme.md", "howto_backups.md",
                                                              "meeting_notes.md")]
    return "\n".join(f"{docs[i % 3]}\n## Part {i}\n\nEnd of part {i}.\n" for i in range(sections))


@pytest.mark.parametrize("budget", [8, 40, 150, 600])
def test_split_covers_the_text_exactly_in_order_within_budget(budget):
    text = long_markdown(4)
    spans = split_text(text, budget, words)
    assert "".join(text[s:e] for s, e in spans) == text
    assert all(s < e for s, e in spans) and spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(words(text[s:e]) <= budget for s, e in spans)


def test_split_prefers_headings_then_paragraphs():
    text = long_markdown(4)
    spans = split_text(text, 150, words)
    starts = [text[s:].split("\n", 1)[0] for s, _ in spans[1:]]
    # every cut falls at the start of a line after a blank line (a paragraph or a heading)
    assert all(text[s - 2 : s] == "\n\n" for s, _ in spans[1:])
    assert sum(line.startswith("#") for line in starts) >= len(starts) // 2


def test_split_code_at_top_level_definitions():
    code = (SAMPLES / "code" / "textutils.py").read_text()
    spans = split_text(code, 60, words, code=True)
    assert "".join(code[s:e] for s, e in spans) == code
    for s, _ in spans[1:]:
        first = code[s:].split("\n", 1)[0]
        assert first and not first[0].isspace(), f"cut inside a block: {first!r}"


def test_split_a_text_with_no_boundaries_cuts_at_characters():
    text = "x" * 1000
    spans = split_text(text, 10, lambda s: -(-len(s) // 20))  # one token per 20 characters
    assert "".join(text[s:e] for s, e in spans) == text
    assert [e - s for s, e in spans] == [200] * 5
    assert split_text("", 10, words) == []
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        split_text("a b", 0, words)


def test_bad_region_and_arguments_name_the_value():
    class Fake:  # rewrite checks its arguments before any model call
        pass

    with pytest.raises(ValueError, match=r"region \(5, 2\) is outside the text"):
        edit.rewrite(Fake(), "hello world", "Fix", region=(5, 2))
    with pytest.raises(ValueError, match="region must be"):
        edit.rewrite(Fake(), "hello world", "Fix", region="all")
    with pytest.raises(ValueError, match="instruction is empty"):
        edit.rewrite(Fake(), "hello", " ")
    with pytest.raises(ValueError, match="'prediction' is set by rewrite"):
        edit.rewrite(Fake(), "hello", "Fix", prediction="x")


def test_merge_speculation_sums_the_pieces():
    a = {"prompt_tokens": 10, "generated_tokens": 5, "target_passes": 2, "drafted": 4, "accepted": 3,
         "accept_histogram": {"3": 1}, "total_ms": 100.0, "prefill_ms": 50.0, "speculative": True,
         "by_source": {"0": [4, 3], "1": [4, 3]}, "prediction_drafted": 4, "prediction_accepted": 3}
    b = {"prompt_tokens": 20, "generated_tokens": 7, "target_passes": 7, "drafted": 2, "accepted": 1,
         "accept_histogram": {"1": 1}, "total_ms": 60.0, "prefill_ms": 20.0, "speculative": True,
         "by_source": {"1": [2, 1]}, "prediction_drafted": 2, "prediction_accepted": 1}
    m = edit.merge_speculation([a, b, {}])
    assert (m["prompt_tokens"], m["generated_tokens"], m["target_passes"]) == (30, 12, 9)
    assert m["accept_histogram"] == {"1": 1, "3": 1} and m["tokens_per_pass"] == round(12 / 9, 4)
    assert m["total_ms"] == 160.0
    # the drafts taken from the pieces' sources (each request's prediction), summed
    assert (m["prediction_drafted"], m["prediction_accepted"]) == (6, 4)
    assert m["by_source"] == {"0": [4, 3], "1": [6, 4]}
    assert set(m) == set(a) | set(edit.merge_speculation([]))  # the same keys as one request's stats


# ---- with the embedded model --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fast_small(model_path):
    """The embedded model with a 256-token context: a text of 500 tokens needs several pieces."""
    import lookahead

    return lookahead.load(model_path, n_ctx=256, n_threads=os.cpu_count() or 1)


def lines_repeated_back_to_back(text: str) -> int:
    """Most back-to-back copies of any non-blank line or two-line block in `text`."""
    lines = [l for l in text.split("\n") if l.strip()]
    return max([count_consecutive(lines, lines[i : i + p]) for p in (1, 2) for i in range(len(lines) - p + 1)] or [0])


@pytest.mark.model
def test_spelling_rewrite_is_bounded_and_does_not_loop():
    """The spelling rewrite of a README, through the CLI, on the default model: a bounded
    rewrite with no repeated-line loop and no chatter. (The tiny model's own greedy answer to
    it has a fence and a loop, and in exact mode speculation gives exactly that answer.)"""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from lookahead.models import DEFAULT_MODEL

    bin_ = Path(sys.executable).parent / "lookahead"
    out = subprocess.run([str(bin_), "rewrite", str(SAMPLES / "docs" / "tallybook_readme.md"),
                          "--instruction", "Fix the spelling mistakes", "--json", "--model", DEFAULT_MODEL],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    text = result["text"]
    # (467: the source's tokens for the default model; the stats count every token of the last
    # verify pass, up to a draft past max_tokens)
    assert result["speculation"]["generated_tokens"] <= output_bound(467) + 64
    assert 0.5 * len(TALLYBOOK) <= len(text) <= 1.3 * len(TALLYBOOK) + 200, text
    assert lines_repeated_back_to_back(text) <= 1, text
    assert "```" not in text and not text.lower().startswith("here"), text
    assert text.endswith("\n")


@pytest.mark.model
def test_a_text_twice_the_context_is_rewritten_in_order_streamed(fast_small):
    text = "\n".join(f"## Step {i}\n\nStep {i} of the backup plan: copy the folder named alpha{i} to the disk "
                     f"labelled B{i} and check the copy.\n" for i in range(1, 16))
    n_tokens = len(fast_small.target.tokenize(text, add_bos=False, special=False))
    assert n_tokens >= 2 * 256, n_tokens  # about twice the context
    # growth=0.5: each piece may emit half its source + 32 tokens (fewer tokens to wait for
    # on 2 cores; pieces cut by the bound go on with the original text)
    rw = edit.rewrite(fast_small, text, "Fix the typos", filename="plan.md", growth=0.5)
    assert len(rw.plan) >= 3
    assert "".join(text[s:e] for s, e in rw.plan) == text  # the whole text, in order
    streamed = [(rw.piece, chunk) for chunk in rw]  # (piece being rewritten, text) as it streams
    result = rw.result
    # streamed in order, piece after piece, every piece with some text of its own
    order = [i for i, _ in streamed]
    assert order == sorted(order) and set(order) == set(range(len(rw.plan)))
    assert len(streamed) > len(rw.plan)  # several chunks per piece: streamed, not handed over at the end
    for i, piece in enumerate(result.pieces):
        assert (piece.start, piece.end) == rw.plan[i]
        assert piece.text == "".join(chunk for j, chunk in streamed if j == i) and piece.text.strip()
        assert piece.speculation["generated_tokens"] <= piece.max_tokens + 64
        assert lines_repeated_back_to_back(piece.text) <= 2, piece.text  # loops were stopped
    assert result.text == "".join(chunk for _, chunk in streamed) == "".join(p.text for p in result.pieces)
    assert result.speculation["generated_tokens"] == sum(p.speculation["generated_tokens"] for p in result.pieces)
    assert result.region == (0, len(text)) and result.document == result.text


@pytest.mark.model
def test_region_rewrite_leaves_the_rest_alone(fast_small):
    text = "Keep this line.\n\nteh cat sat on teh mat.\n\nKeep this one too.\n"
    start = text.index("teh cat")
    end = text.index("\n\nKeep this one")
    result = edit.rewrite(fast_small, text, "Fix the typos", region=(start, end), stream=False)
    assert result.document.startswith("Keep this line.\n\n")
    assert result.document.endswith("\n\nKeep this one too.\n")
    assert result.document == text[:start] + result.text + text[end:]
    assert "cat" in result.text and "mat" in result.text


# ---- the orchestration, with a scripted stand-in for the model -------------------------------------
class ScriptedModel:
    """Looks like a Lookahead to `edit.rewrite`: word tokens, and answers made by `answer(source)`."""

    def __init__(self, answer, n_ctx=4096):
        self.answer = answer
        self.requests: list[dict] = []
        self.closed = 0
        self.n_ctx = n_ctx
        self.model_path = "scripted.gguf"  # what the CLI names in its progress line
        self.model_name = "scripted"
        self.last_stats = None

    def count_tokens(self, text):
        return len(text.split())

    def create_chat_completion(self, messages, prediction=None, stream=False, max_tokens=None, answer_prefix=None,
                               **kw):
        self.requests.append(dict(messages=messages, prediction=prediction, max_tokens=max_tokens,
                                  answer_prefix=answer_prefix, **kw))
        source = prediction
        answer = self.answer(source)
        if answer_prefix and answer.startswith(answer_prefix):  # the prompt holds it: the model goes on after it
            answer = answer[len(answer_prefix):]
        words_out = re.findall(r"\s*\S+|\s+$", answer)[:max_tokens]  # one token per word
        model = self

        def chunks():
            try:
                for w in words_out:
                    yield {"choices": [{"delta": {"content": w}, "finish_reason": None}]}
                finish = "length" if len(words_out) >= max_tokens else "stop"
                yield {"choices": [{"delta": {}, "finish_reason": finish}],
                       "speculation": {"generated_tokens": len(words_out), "prompt_tokens": len(source.split())}}
            finally:
                model.closed += 1

        return chunks()


def test_pieces_stream_in_order_with_the_source_blank_lines_kept():
    text = long_markdown(3)
    model = ScriptedModel(lambda source: "Here is the revised document:\n\n" + source.upper())
    rw = edit.rewrite(model, text, "Shout", piece_tokens=120, filename="doc.md")
    streamed = list(rw)
    result = rw.result
    assert len(rw.plan) > 3 and len(model.requests) == len(rw.plan)
    assert result.text == "".join(streamed) == text.upper()  # leading/trailing blank lines of each piece kept
    assert result.finish_reason == "stop" and result.warnings == []
    # each request's reference (its prediction) is its piece, less the blank lines around it
    # (indentation kept)
    assert [r["prediction"] for r in model.requests] == [re.sub(r"^(?:[ \t]*\n)*", "", text[s:e].rstrip())
                                                             for s, e in rw.plan]
    assert all(r["temperature"] == 0.0 for r in model.requests)
    assert all(r["max_tokens"] == output_bound(len(r["prediction"].split())) for r in model.requests)


def test_a_looping_piece_is_cut_warned_and_the_next_piece_still_runs():
    text = "# One\n\nfirst part here\n\n# Two\n\nsecond part here\n"

    def answer(source):
        if "first" in source:
            return source + "\n" + "and again the same long line of text\n" * 20
        return source

    model = ScriptedModel(answer)
    result = edit.rewrite(model, text, "Copy", piece_tokens=5, stream=False)
    assert len(result.pieces) == 2
    assert result.finish_reason == "loop" and result.pieces[0].finish_reason == "loop"
    assert "loop of repeated lines" in result.warnings[0] and "piece 1/2" in result.warnings[0]
    assert result.text.count("and again") == 1 and result.text.endswith("second part here\n")
    assert model.closed == 2  # the looping request was closed, not drained


def test_an_empty_answer_keeps_the_original_and_says_so():
    model = ScriptedModel(lambda source: "```\n```")
    result = edit.rewrite(model, "keep me\n", "Fix", stream=False)
    assert result.text == "keep me\n"
    assert result.pieces[0].finish_reason == "empty" and "kept the original" in result.warnings[0]


def test_region_only_sends_the_region_and_replaces_it():
    text = "before\n\nmiddle part\n\nafter\n"
    start, end = text.index("middle"), text.index("part") + 4
    model = ScriptedModel(lambda source: source.replace("middle", "MIDDLE"))
    result = edit.rewrite(model, text, "Caps", region=(start, end), stream=False)
    assert model.requests[0]["prediction"] == "middle part"
    assert result.text == "MIDDLE part" and result.document == "before\n\nMIDDLE part\n\nafter\n"


def test_max_tokens_over_the_whole_rewrite():
    text = "# One\n\none two three four\n\n# Two\n\nfive six seven eight\n"
    model = ScriptedModel(lambda source: source)
    result = edit.rewrite(model, text, "Copy", piece_tokens=6, max_tokens=6, stream=False)
    assert result.finish_reason == "length"
    assert model.requests[0]["max_tokens"] == 6 and len(model.requests) == 1
    assert any("max_tokens used up" in w for w in result.warnings)
    assert result.text.endswith("# Two\n\nfive six seven eight\n")  # the untouched part kept as it was


def test_bare_code_fences_of_the_document_inside_a_fenced_answer():
    source = "Run:\n\n```\nmake\n```\n\nDone.\n"
    answer = "```markdown\nRun this:\n\n```\nmake\n```\n\nDone.\n```\nHope this helps!"
    out, cleaner = stream_clean(answer, source)
    assert out == "Run this:\n\n```\nmake\n```\n\nDone." and cleaner.stopped == "fence"


@pytest.mark.parametrize("answer, expected", [
    ("# Doc\n\nSome text.\n\n---\n\nThis should now be free of spelling mistakes.", "# Doc\n\nSome text."),
    ("# Doc\n\nSome text.\n\nI have corrected the spelling mistakes.\n", "# Doc\n\nSome text."),
    ("# Doc\n\nSome text.\n---\n", "# Doc\n\nSome text."),
    ("```markdown\n# Doc\n\nSome text.\n\n---\nAll the spelling mistakes are fixed.\n```\n", "# Doc\n\nSome text."),
    ("---\n# Doc\n\nSome text.\n", "# Doc\n\nSome text."),  # a rule the source does not start with
    # a sign-off-like line followed by more document text is the document's
    ("# Doc\n\nI have two cats.\n\nSome text.\n", "# Doc\n\nI have two cats.\n\nSome text."),
])
def test_a_sign_off_after_the_document_is_dropped(answer, expected):
    out, cleaner = stream_clean(answer, "# Doc\n\nSome txet.\n")
    assert out == expected


def test_a_rule_and_last_line_of_the_source_itself_are_kept():
    source = "# Doc\n\nSome text.\n\n---\n\nAll the changes are in CHANGES.md.\n"
    out, _ = stream_clean(source.replace("Some text", "Some more text"), source)
    assert out == source.replace("Some text", "Some more text").rstrip("\n")


def test_an_echoed_instruction_ends_the_document():
    source = "# Doc\n\nSome text.\n"
    messages = build_rewrite_messages(source, "Fix the typos")
    echo = edit.instruction_lines(messages, source)
    assert echo[-1] == "Fix the typos in the document above."
    answer = "# Doc\n\nSome text.\n\n" + echo[0] + "\n\nMore chatter."
    cleaner = AnswerCleaner(source, echo_lines=echo)
    out = cleaner.feed(answer) + cleaner.finish()
    assert out == "# Doc\n\nSome text." and cleaner.stopped == "echo"


def test_resume_offset_matches_fixed_lines_in_order():
    source = "# Title\n\nteh first line\n\nsecond line\nthird line\n"
    assert resume_offset(source, "# Title\n\nthe first line") == source.index("\n\nsecond") + 1
    assert resume_offset(source, "# Title") == source.index("\n\nteh") + 1
    assert resume_offset(source, "nothing alike at all") == 0
    # mostly lines that are not in the source: not following it, nothing to go on from
    assert resume_offset(source, "# Title\nsomething else\nand more\nand more again") == 0
    assert resume_offset(source, "# Title\n\nthe first line\n\nsecond line\nthird line") == len(source)


def test_a_rewrite_cut_short_goes_on_with_the_original():
    text = "# Doc\n\nalpha line one\n\nbeta line two\n\ngamma line three\n"

    def answer(source):  # fixes the first line, then loops
        return "# Doc\n\nAlpha line one\n\n" + "the same long line repeated over and over\n" * 5

    model = ScriptedModel(answer)
    result = edit.rewrite(model, text, "Capitalise", stream=False)
    assert result.text == ("# Doc\n\nAlpha line one\n\nthe same long line repeated over and over\n\n"
                           "beta line two\n\ngamma line three\n")
    assert result.finish_reason == "loop" and "from line 5 on, the original text is kept" in result.warnings[0]


def test_an_answer_that_ends_early_goes_on_with_the_original():
    text = ("def a():\n    return 1\n\n\ndef b(x):\n    return x - 1\n\n\n"
            "def c():\n    return 3\n\n\ndef d():\n    return 4\n")

    def answer(source):  # fixes b, then closes the fence: the "only what changed" habit
        return "```python\n" + source[: source.index("def c")].replace("x - 1", "x + 1").rstrip() + "\n```"

    result = edit.rewrite(ScriptedModel(answer), text, "Fix b", filename="m.py", stream=False)
    assert result.text == text.replace("x - 1", "x + 1")
    assert result.finish_reason == "stop"
    assert result.warnings == ["the rewrite: the answer ended before the end of the text; "
                               "from line 9 on, the original text is kept"]


def test_an_answer_that_skips_the_first_lines_gets_them_back():
    text = '"""A module.\n\nIt does things.\n"""\n\nimport os\n\n\ndef f():\n    return os.sep\n'
    skipping = ScriptedModel(lambda s: "```python\n" + s[s.index("import os"):].replace("os.sep", "os.sep * 2") + "\n```")
    result = edit.rewrite(skipping, text, "Double it", filename="m.py", stream=False)
    assert result.text == text.replace("os.sep", "os.sep * 2")
    assert result.warnings == ["the rewrite: the answer left out the text's first lines; lines 1-5 of the "
                               "original are kept"]
    # lines the answer added before the source's first ones are not a skipped head
    adding = ScriptedModel(lambda s: "# -*- coding: utf-8 -*-\n" + s)
    assert edit.rewrite(adding, text, "Add a coding line", stream=False).text == "# -*- coding: utf-8 -*-\n" + text
    # nor the first lines rewrapped into one
    rewrapped = ScriptedModel(lambda s: '"""A module. It does thngs.\n"""\n' + s[s.index("\nimport os"):])
    result = edit.rewrite(rewrapped, text, "Fix typos", stream=False)
    assert result.text.startswith('"""A module. It does thngs.\n"""\n\nimport os') and result.warnings == []
    # nor is a first line the instruction changed
    changed = ScriptedModel(lambda s: s.replace('"""A module.', '"""The module.'))
    result = edit.rewrite(changed, text, "Rename", stream=False)
    assert result.text == text.replace("A module", "The module") and result.warnings == []


def test_an_answer_that_ends_in_a_rewritten_function_resumes_at_the_next_definition():
    head = 'def chunked(items, size):\n    """Split a list into chunks."""\n    if size <= 0:\n        raise ValueError(size)\n'
    text = (head + "    return [items[i:i + size] for i in range(0, len(items) - size, size)]\n"
            "\n\ndef truncate(text, width):\n    return text[:width]\n\n\ndef word_count(text):\n"
            "    counts = {}\n    for word in text.split():\n        counts[word] = counts.get(word, 0) + 1\n"
            "    return counts\n\n\ndef dedupe(items):\n    return list(dict.fromkeys(items))\n")
    rewritten = (head + "    chunks = []\n    for i in range(0, len(items), size):\n"
                 "        chunks.append(items[i:i + size])\n    return chunks\n")
    result = edit.rewrite(ScriptedModel(lambda s: rewritten), text, "Fix chunked", filename="m.py", stream=False)
    # "return chunks" is like "return counts", but the line before it is not: the answer's
    # own lines replaced chunked's body, and the rest starts at the next definition
    assert result.text == rewritten + text[text.index("\n\ndef truncate"):]
    assert result.warnings == ["the rewrite: the answer ended before the end of the text; "
                               "from line 8 on, the original text is kept"]


def test_an_answer_that_rewrote_the_last_line_is_not_given_the_original_one_too():
    text = "# Notes\n\nfirst line\n\nsecond line\n\nSee you on 10 March 2025 in room 4.\n"
    new_last = "Meeting: 2025-03-10."
    result = edit.rewrite(ScriptedModel(lambda s: s.replace("See you on 10 March 2025 in room 4.", new_last)),
                          text, "ISO dates", stream=False)
    assert result.text == text.replace("See you on 10 March 2025 in room 4.", new_last)
    assert result.warnings == []
    # nor one that dropped the last paragraph on purpose (one line left is not a lost tail)
    dropped = edit.rewrite(ScriptedModel(lambda s: s[: s.index("\n\nSee you")]), text, "Drop the last line",
                           stream=False)
    assert dropped.text == text[: text.index("\n\nSee you")] + "\n" and dropped.warnings == []


def test_an_explanation_instead_of_a_rewrite_is_marked_diverged():
    text = "".join(f"line number {i} of the document, which says something\n" for i in range(20))
    prose = ScriptedModel(lambda source: "To do that, change line 3 so that it says something else.")
    result = edit.rewrite(prose, text, "Change line 3", stream=False)
    assert result.finish_reason == "stop" and result.lines_kept == 0.0 and result.length_ratio < 0.1
    assert result.diverged


def test_an_answer_that_is_not_a_rewrite_is_marked_diverged():
    text = "# Notes\n\nThe meeting is on Monday.\n\n- Anna books the room.\n- Ben sends the agenda.\n"
    looping = ScriptedModel(lambda source: "**2025-03-14 10:00:00**\n" * 30)
    result = edit.rewrite(looping, text, "Write the dates in ISO form", stream=False)
    assert result.finish_reason == "loop" and result.lines_kept == 0.0 and result.diverged
    assert result.to_dict()["diverged"] is True
    faithful = edit.rewrite(ScriptedModel(lambda source: source.replace("Monday", "Tuesday")), text, "Move it",
                            stream=False)
    assert faithful.lines_kept == 0.75 and not faithful.diverged  # 3 of the 4 lines kept verbatim
    translated = edit.rewrite(ScriptedModel(lambda source: source.upper()), text, "Shout", stream=False)
    assert translated.lines_kept == 0.0 and not translated.diverged  # ended by itself: a real rewrite


def _cli_with(model, monkeypatch, *args):
    from click.testing import CliRunner

    import lookahead.cli.main as main

    model.model_path = "scripted.gguf"  # what the command reads of a wrapper
    monkeypatch.setattr(main, "load_wrapped", lambda *a, **k: model)
    return CliRunner().invoke(main.main, ["rewrite", *map(str, args)])


def test_rewrite_does_not_write_a_diverged_answer_without_force(tmp_path, monkeypatch):
    path = tmp_path / "notes.md"
    original = "# Notes\n\nThe meeting is on Monday.\n\n- Anna books the room.\n"
    path.write_text(original)
    looping = lambda source: "**2025-03-14 10:00:00**\n" * 30
    out = _cli_with(ScriptedModel(looping), monkeypatch, path, "-i", "ISO dates", "--in-place")
    assert out.exit_code == 1 and "not written: the answer diverged" in out.output and "--force" in out.output
    assert path.read_text() == original
    out = _cli_with(ScriptedModel(looping), monkeypatch, path, "-i", "ISO dates", "--in-place", "--force")
    assert out.exit_code == 0, out.output
    assert path.read_text().startswith("**2025-03-14 10:00:00**")
    path.write_text(original)
    out = _cli_with(ScriptedModel(lambda s: s.replace("Monday", "Friday")), monkeypatch, path, "-i", "Friday",
                    "--in-place")
    assert out.exit_code == 0 and path.read_text() == original.replace("Monday", "Friday")


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_an_intro_line_before_a_fenced_answer_is_chatter(step):
    # An intro that no chatter pattern knows (SmolLM2-135M's answer to a rename), a fenced
    # answer, then an explanation
    source = "def slugify(text):\n    return text.lower()\n"
    answer = ("You can rename the function slugify to make_slug like this:\n\n```python\n"
              "def make_slug(text):\n    return text.lower()\n```\n\nThis renames the function.")
    out, cleaner = stream_clean(answer, source, step)
    assert out == "def make_slug(text):\n    return text.lower()"
    assert cleaner.stopped == "fence" and cleaner.dropped[0].startswith("You can rename")


def test_a_first_line_ending_with_a_colon_is_kept_when_no_fence_follows():
    source = "Steps:\n\n- one\n- two\n"
    out, cleaner = stream_clean("Steps to follow:\n\n- one\n- two\n", source)
    assert out == "Steps to follow:\n\n- one\n- two" and cleaner.stopped is None
    out, _ = stream_clean("Steps to follow:", source)  # the whole answer: the line is kept
    assert out == "Steps to follow:"
