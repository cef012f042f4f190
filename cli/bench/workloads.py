"""Workloads: JSONL lines of id, category, messages (or prompt), max_tokens, checked on load."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import click


def json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, value) for each non-blank line of a JSONL file, `where` being "path:line".

    Raises click.BadParameter when the file cannot be read or a line is not JSON.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {str(path)!r}: {e}", param_hint="WORKLOADS") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"{where}: not JSON ({e.msg})", param_hint="WORKLOADS") from None


def load_workloads(path: Path, categories: Sequence[str] = (), limit: int | None = None,
                   max_tokens_cap: int | None = None) -> list[dict]:
    """Read a JSONL file of workloads: id, category, messages (or prompt), max_tokens.

    Keeps the given categories (all when none), the first `limit` of each, and caps max_tokens.
    Raises click.BadParameter naming the line and the field that is wrong.
    """
    workloads, seen = [], set()
    for where, w in json_lines(path):
        problem = _workload_problem(w)
        if problem:
            raise click.BadParameter(f"{where}: {problem}", param_hint="WORKLOADS")
        if w["id"] in seen:
            raise click.BadParameter(f"{where}: id {w['id']!r} appears twice", param_hint="WORKLOADS")
        seen.add(w["id"])
        workloads.append(w)
    chosen = select(workloads, categories, limit, "workload")
    if max_tokens_cap is not None:
        chosen = [{**w, "max_tokens": min(w["max_tokens"], max_tokens_cap)} for w in chosen]
    if not chosen:
        raise click.BadParameter(f"{str(path)!r} holds no workloads", param_hint="WORKLOADS")
    return chosen


def select(items: list[dict], categories: Sequence[str], limit: int | None, noun: str) -> list[dict]:
    """The items of the given categories (all when none), the first `limit` of each.

    Raises click.BadParameter naming a category no item has, and the ones present.
    """
    present = list(dict.fromkeys(i["category"] for i in items))
    unknown = [c for c in categories if c not in present]
    if unknown:
        raise click.BadParameter(f"no {noun} has category {unknown[0]!r}; the file has: {', '.join(present)}",
                                 param_hint="--category")
    chosen, per_category = [], {}
    for item in items:
        if categories and item["category"] not in categories:
            continue
        per_category[item["category"]] = per_category.get(item["category"], 0) + 1
        if limit is None or per_category[item["category"]] <= limit:
            chosen.append(item)
    return chosen


def _workload_problem(w: Any) -> str | None:
    if not isinstance(w, dict):
        return f"expected a JSON object, got {type(w).__name__}"
    for key in ("id", "category"):
        if not isinstance(w.get(key), str) or not w[key]:
            return f"{key!r} must be a non-empty string, got {w.get(key)!r}"
    if not isinstance(w.get("max_tokens"), int) or isinstance(w["max_tokens"], bool) or w["max_tokens"] < 1:
        return f"'max_tokens' must be an integer >= 1, got {w.get('max_tokens')!r}"
    has_messages, has_prompt = "messages" in w, "prompt" in w
    if has_messages == has_prompt:
        return "give exactly one of 'messages' (a chat) or 'prompt' (a string)"
    if has_prompt and not isinstance(w["prompt"], str):
        return f"'prompt' must be a string, got {type(w['prompt']).__name__}"
    if has_messages:
        msgs = w["messages"]
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs):
            return "'messages' must be a non-empty list of {'role': str, 'content': str}"
    return None
