"""A small on-disk cache for one-off measurements (backend health checks, verify-cost curves).

Entries are JSON objects in one file per kind under `cache_dir()`; writes are atomic (a
temporary file renamed over the old one), so two processes never leave a torn file, and a
damaged or unreadable file reads as empty: the cache is an optimisation, never a source of
errors. `LOOKAHEAD_CACHE_DIR` moves it; `LOOKAHEAD_NO_CACHE=1` turns it off.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """Where lookahead keeps its cache: $LOOKAHEAD_CACHE_DIR, else ~/.cache/lookahead."""
    env = os.environ.get("LOOKAHEAD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lookahead"


def enabled() -> bool:
    return os.environ.get("LOOKAHEAD_NO_CACHE", "") in ("", "0")


def load(kind: str) -> dict[str, Any]:
    """All entries of one kind ({} when absent, damaged or the cache is off)."""
    if not enabled():
        return {}
    try:
        data = json.loads((cache_dir() / f"{kind}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def get(kind: str, key: str) -> Any:
    return load(kind).get(key)


def put(kind: str, key: str, value: Any, max_entries: int = 64) -> None:
    """Store one entry (keeping the newest `max_entries`); silently does nothing if it cannot."""
    if not enabled():
        return
    entries = load(kind)
    entries.pop(key, None)
    entries[key] = value
    while len(entries) > max_entries:
        entries.pop(next(iter(entries)))
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entries, f, indent=1, sort_keys=False)
        os.replace(tmp, folder / f"{kind}.json")
    except OSError:
        try:
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        except (OSError, NameError):
            pass
