"""The README's first command, on the default model: a rewrite a user keeps.

It runs the command as the README writes it (less the set-up), on the default model
(qwen2.5-coder-1.5b), and checks the whole output: the four lines the instruction changes,
written out here, and every other line of the file byte for byte.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.model

# Line number (1-based) -> the line as the instruction makes it.
EXPECTED_CHANGES = {
    4: '//   const { fetchJsonWithRetry } = require("./retry");',
    5: '//   const data = await fetchJsonWithRetry("https://example.com/api/items", { retries: 4 });',
    40: "async function fetchJsonWithRetry(url, userOptions = {}) {",
    71: "module.exports = { fetchJsonWithRetry, backoffDelay, isRetryable };",
}


def readme_demo() -> list[str]:
    """The arguments of the README's first command after `lookahead`."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    first = block.splitlines()[0]
    words = shlex.split(first.split("&&", 1)[1])
    assert words[0] == ".venv/bin/lookahead", first
    return words[1:]


def expected_text(source: str) -> str:
    lines = source.split("\n")
    for number, line in EXPECTED_CHANGES.items():
        lines[number - 1] = line
    return "\n".join(lines)


def run_lookahead(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LOOKAHEAD_MODEL"}  # the default model
    return subprocess.run([sys.executable, "-m", "lookahead.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def demo(default_model_path):
    args = readme_demo()
    source = (REPO / args[1]).read_text(encoding="utf-8")
    assert args[0] == "rewrite" and "--stats" in args
    return args, source


def test_the_readme_demo_makes_every_change_and_keeps_every_other_line(demo):
    args, source = demo
    result = run_lookahead(args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == expected_text(source).rstrip("\n")
    assert "qwen2.5-coder-1.5b" in result.stderr  # the default model did it
    assert "tokens/pass" in result.stderr  # --stats


def test_plain_decoding_gives_the_same_rewrite(demo):
    args, source = demo
    result = run_lookahead([a for a in args if a != "--stats"] + ["--no-speculate", "--json"])
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["text"].rstrip("\n") == expected_text(source).rstrip("\n")
    assert out["speculation"]["drafted"] == 0
