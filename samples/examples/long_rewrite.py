"""A text about twice the context long, rewritten whole and in order: 39,461 characters (8,757
tokens of the default model) of passages from the Python reference, with 30 misspellings
put in at fixed places, then `lookahead rewrite`'s own code on it ("Fix the spelling
mistakes"). The passages come from the running Python's `pydoc_data` (in every CPython), so
the text is built here and nothing is shipped.

Prints one JSON object: parts, seconds, misspellings fixed and left, lines that still differ
from the clean text, length ratio, lines kept, finish reason, warnings, tokens per pass.

    .venv/bin/python samples/examples/long_rewrite.py                      # default model, n_ctx 4096
    .venv/bin/python samples/examples/long_rewrite.py --piece-tokens 700 --save out.txt
    .venv/bin/python samples/examples/long_rewrite.py --no-speculate       # plain decoding
"""
from __future__ import annotations

import argparse
import difflib
import json
import random
import re
import time

TOPICS = ("execmodel", "import", "try", "function", "naming")
MISSPELLINGS = 30


def build(seed: int = 7) -> tuple[str, str, list[tuple[int, str, str]]]:
    """(text with misspellings, clean text, [(line, word, misspelt)]): two letters of one long
    word swapped on each of MISSPELLINGS prose lines chosen at random (seeded)."""
    from pydoc_data import topics

    clean = "\n\n\n".join(topics.topics[name].strip("\n") for name in TOPICS) + "\n"
    rng = random.Random(seed)
    lines = clean.split("\n")
    prose = [i for i, l in enumerate(lines)
             if len(l) > 40 and not l.startswith(" ") and not set(l) <= set("=*-")]
    typos = []
    for i in sorted(rng.sample(prose, MISSPELLINGS)):
        words = list(re.finditer(r"[a-z]{7,}", lines[i]))
        if not words:
            continue
        m = rng.choice(words)
        word = m.group(0)
        k = rng.randrange(1, len(word) - 2)
        bad = word[:k] + word[k + 1] + word[k] + word[k + 2:]
        if bad != word:
            lines[i] = lines[i][: m.start()] + bad + lines[i][m.end():]
            typos.append((i + 1, word, bad))
    return "\n".join(lines), clean, typos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model name or GGUF path (default: the default model)")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--piece-tokens", type=int, default=None, help="largest part in source tokens")
    ap.add_argument("--no-speculate", action="store_true", help="plain decoding, to compare")
    ap.add_argument("--save", default=None, help="write the rewritten text here")
    args = ap.parse_args()

    import lookahead
    from lookahead import edit

    fast = lookahead.load(args.model, n_ctx=args.n_ctx)
    text, clean, typos = build()
    t0 = time.perf_counter()
    result = edit.rewrite(fast, text, "Fix the spelling mistakes", filename="passages.txt",
                          piece_tokens=args.piece_tokens, speculate=not args.no_speculate, stream=False)
    seconds = time.perf_counter() - t0
    out = result.text
    ops = difflib.SequenceMatcher(None, clean.splitlines(), out.splitlines(), autojunk=False).get_opcodes()
    print(json.dumps({
        "source_chars": len(text), "source_tokens": fast.count_tokens(text), "parts": len(result.pieces),
        "seconds": round(seconds, 1), "fixed": sum(bad not in out and word in out for _, word, bad in typos),
        "left": sum(bad in out for _, _, bad in typos), "misspellings": len(typos),
        "lines_differing_from_clean": sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal"),
        "length_ratio": round(result.length_ratio, 3), "lines_kept": round(result.lines_kept, 3),
        "finish_reason": result.finish_reason, "diverged": result.diverged, "warnings": result.warnings,
        "tokens_per_pass": result.speculation.get("tokens_per_pass"),
    }, indent=1))
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            f.write(out)


if __name__ == "__main__":
    main()
