"""Write replay traces of whole-file edits as an instruction-following model would answer them.

    .venv/bin/python samples/examples/copy_edit_traces.py [--out FILE]

The embedded 135M model rarely copies a file it is asked to edit (see the README's rewrite
bench), so the recorded traces (`record_traces.py`) say little about the case lookahead is
built for: an answer that is the file again with a few changes. These traces are that case,
made without a model: the prompt is the chat prompt `lookahead rewrite` would send (tokenized
with the embedded model's own template), and the output is the source with the requested
change applied, tokenized by the same tokenizer, then EOS. The changes are the usual kinds:
renames (many small edit points), a path change in prose, a deleted function (the answer
skips a block and rejoins the source after it), an inserted block, and a line reordering.

They are synthetic: a real model may tokenize its answer differently or change more. Replay
them with the simulator like the recorded ones:

    .venv/bin/python -m lookahead.simulate samples/examples/copy_edit_traces.json --curve 1:7.6,2:14,4:19,8:29,16:50,32:91,64:175 -v
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # record_traces, beside this file
SAMPLES = HERE.parent


def _delete_function(source: str, name: str) -> str:
    """Drop `def name(...)` and its body, up to the next top-level definition."""
    return re.sub(rf"\ndef {name}\(.*?(?=\n\n\ndef |\Z)", "", source, count=1, flags=re.S)


def _insert_after_imports(source: str, block: str) -> str:
    lines = source.split("\n")
    last_import = max(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
    return "\n".join(lines[: last_import + 1] + ["", block] + lines[last_import + 1 :])


def _swap_lines(source: str, first: str, second: str) -> str:
    lines = source.split("\n")
    i = next(n for n, line in enumerate(lines) if line.startswith(first))
    j = next(n for n, line in enumerate(lines) if line.startswith(second))
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


# (id, file, instruction, the edited text as a function of the source, fenced answer?)
EDITS = [
    ("copy-rename-counts", "code/textutils.py", "Rename the local variable `counts` to `tally` everywhere.",
     lambda s: s.replace("counts", "tally"), True),
    ("copy-rename-convert", "code/config_parser.py", "Rename the method `convert` to `coerce`.",
     lambda s: s.replace("convert", "coerce"), True),
    ("copy-rename-backoff", "code/retry.js", "Rename `backoffDelay` to `computeBackoff`.",
     lambda s: s.replace("backoffDelay", "computeBackoff"), True),
    ("copy-delete-truncate", "code/textutils.py", "Remove the function `truncate`; nothing else changes.",
     lambda s: _delete_function(s, "truncate"), True),
    ("copy-insert-all", "code/textutils.py",
     "Add a module-level `__all__` list naming the public functions, right after the imports.",
     lambda s: _insert_after_imports(
         s, '__all__ = ["slugify", "chunked", "truncate", "word_count", "top_words", "dedupe"]\n'), True),
    ("copy-swap-imports", "code/textutils.py", "Put the imports in reverse alphabetical order.",
     lambda s: _swap_lines(s, "import re", "import unicodedata"), True),
    ("copy-backup-path", "docs/howto_backups.md", "The backup disk is now mounted at /srv/backup: update the guide.",
     lambda s: s.replace("/mnt/backup", "/srv/backup"), False),
    ("copy-readme-name", "docs/tallybook_readme.md", "Spell the project name as TallyBook everywhere.",
     lambda s: re.sub(r"\b[Tt]allybook\b", "TallyBook", s), False),
    ("copy-notes-iso-date", "docs/meeting_notes.md", "Write the meeting date in the header as 2025-03-03.",
     lambda s: s.replace("**Date:** 3 March 2025", "**Date:** 2025-03-03"), False),
]


def build(llm) -> list[dict]:
    """The traces; `llm` (a llama_cpp.Llama) formats and tokenizes the prompts, as a plain call would."""
    from lookahead.edit import build_rewrite_messages
    from record_traces import eog_tokens, record_one, token_pieces

    traces = []
    for trace_id, name, instruction, edit, fenced in EDITS:
        source = (SAMPLES / name).read_text(encoding="utf-8")
        edited = edit(source)
        assert edited != source, f"{trace_id}: the edit changed nothing"
        messages = build_rewrite_messages(source, instruction, filename=Path(name).name)
        # One plain greedy token, to capture the prompt tokens exactly as create_chat_completion makes them.
        prompt = record_one(llm, {"id": trace_id, "category": "copy-edit", "messages": messages, "max_tokens": 1},
                            0.0)["prompt"]
        answer = f"```{_fence_language(name)}\n{edited}```" if fenced else edited
        output = llm.tokenize(answer.encode("utf-8"), add_bos=False, special=False) + [llm.token_eos()]
        traces.append({"id": trace_id, "category": "copy-edit", "temperature": 0.0, "max_tokens": len(output) + 64,
                       "prompt": prompt, "output": output, "references": [], "synthetic": True,
                       "eog": eog_tokens(llm), "pieces": token_pieces(llm, prompt + output)})
    return traces


def _fence_language(name: str) -> str:
    return {".py": "python", ".js": "javascript"}.get(Path(name).suffix, "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "copy_edit_traces.json")
    args = parser.parse_args()
    from llama_cpp import Llama

    from lookahead.models import default_model_path

    llm = Llama(str(default_model_path()), n_ctx=4096, verbose=False)
    traces = build(llm)
    args.out.write_text(json.dumps(traces))
    for t in traces:
        print(f"{t['id']:24s} prompt {len(t['prompt']):4d} output {len(t['output']):4d}")
    print(f"wrote {len(traces)} traces to {args.out}")


if __name__ == "__main__":
    main()
