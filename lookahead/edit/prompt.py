"""The rewrite's prompt: the chat turns a rewrite sends, how its answer starts, which files are code."""
from __future__ import annotations

from .clean import is_fence

# The fence's language name per code suffix (Markdown's names); these suffixes make a file code.
FENCE_LANGUAGES = {".py": "python", ".js": "javascript", ".ts": "typescript", ".c": "c", ".h": "c", ".cpp": "cpp",
                   ".rs": "rust", ".go": "go", ".java": "java", ".sh": "bash", ".rb": "ruby", ".php": "php",
                   ".cs": "csharp", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
                   ".ini": "ini", ".cfg": "ini", ".sql": "sql", ".html": "html", ".css": "css"}
CODE_SUFFIXES = frozenset(FENCE_LANGUAGES)


def _code_suffix(filename: str | None) -> str | None:
    """The code suffix `filename` ends with (lower case), or None for prose or no name."""
    name = (filename or "").lower()
    return next((suffix for suffix in CODE_SUFFIXES if name.endswith(suffix)), None)


def is_code(filename: str | None) -> bool:
    """Whether `filename` names a code or config file (by suffix), as opposed to prose."""
    return _code_suffix(filename) is not None


def build_rewrite_messages(text: str, instruction: str, filename: str | None = None) -> list[dict]:
    """The chat request for a rewrite: a fixed system turn, the document, then the instruction.

        system: You rewrite documents. You always reply with the complete revised document.
        user:   <the text>
        user:   <instruction> in the document above.

    The document comes before the instruction, so two edits of the same text with different
    instructions share the system turn and the document as a prompt prefix, and the second
    request reuses its KV cache. It is also the form small instruct models follow: given it,
    SmolLM2-135M-Instruct copies the document (and still mangles parts of it) and
    Qwen2.5-Coder-0.5B-Instruct gives a clean rewrite; with the instruction first SmolLM2
    loops, with document and instruction in one user turn it wanders off into unrelated
    text, and with an assistant turn between them it only says it made the changes.
    ("files" and "file" instead of "documents" for code.)
    """
    if not instruction or not instruction.strip():
        raise ValueError(f"the instruction is empty: {instruction!r}")
    kind = "file" if is_code(filename) else "document"
    ask = instruction.strip().rstrip(".")
    return [{"role": "system", "content": f"You rewrite {kind}s. You always reply with the complete revised {kind}."},
            {"role": "user", "content": text},
            {"role": "user", "content": f"{ask} in the {kind} above."}]


def instruction_lines(messages: list[dict], document: str) -> list[str]:
    """The lines of the request that are not the document (the instruction's wording)."""
    out = []
    for message in messages:
        content = message.get("content") or ""
        at = content.find(document) if document else -1
        rest = content[:at] + "\n" + content[at + len(document):] if at >= 0 else content
        out.extend(l for l in rest.split("\n") if l.strip())
    return out


def answer_prefix(text: str, filename: str | None = None) -> str:
    """What the answer to a rewrite of `text` starts with, put in the prompt after the chat
    template (the model continues it): for a code file, the opening code fence ("```python\n").

    Given the fence, instruct models answer with the file itself: without it the default model
    began two of the three code rewrites of the rewrite bench with a sentence about the
    change ("To fix the bug in the `chunked` function, we need to ...", then only the fixed
    function), tokens that no draft can copy. Prose gets no prefix: a Markdown fence made the
    same model rewrite a how-to's first lines instead of copying them. Nor does a file whose
    own first line is a fence.
    """
    suffix = _code_suffix(filename)
    if suffix is None or is_fence(next((line for line in text.split("\n") if line.strip()), "")):
        return ""
    return "```" + FENCE_LANGUAGES[suffix] + "\n"
