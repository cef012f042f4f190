"""Replay recorded traces with the drafter of another git revision, for before/after figures.

    .venv/bin/python samples/examples/replay_revision.py REV [TRACES.json] [--curve 1:8.8,2:22.9,...]

Loads the drafter (lookahead/drafter.py, or the lookahead/drafter/ package) and the modules it
imports as they were at REV (e.g. `main`, a commit) into a temporary package and prints the same report as `python -m lookahead.simulate`, with
this checkout's simulator, so the two tables differ only by the drafter. The oracle column
uses that drafter's own candidate (its index's longest match, followed by majority).
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from lookahead import simulate
from lookahead.drafter import Candidate

ROOT = Path(__file__).resolve().parents[2]


# What the drafter of any revision imports from lookahead/: the index, and since the drafter
# became a package, its modules and the sequence helpers.
REVISION_FILES = ("lookahead/drafter.py", "lookahead/drafter", "lookahead/index.py", "lookahead/sequences.py")


def load_revision(rev: str):
    """The `lookahead.drafter` and `lookahead.index` modules of `rev`, as a package `lookahead_at_rev`."""
    folder = Path(tempfile.mkdtemp()) / "lookahead_at_rev"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", *REVISION_FILES], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout.split()
    for path in (p for p in listed if p.endswith(".py")):
        source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
        target = folder / Path(path).relative_to("lookahead")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source)
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module("lookahead_at_rev.drafter"), importlib.import_module("lookahead_at_rev.index")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev")
    parser.add_argument("traces", nargs="?", default=str(ROOT / "samples" / "examples" / "traces.json"))
    parser.add_argument("--curve", type=simulate._parse_curve, default=simulate.DEFAULT_CURVE)
    args = parser.parse_args()
    drafter_module, index_module = load_revision(args.rev)

    class Then(drafter_module.Drafter):
        """That revision's drafter, with the two calls the oracle needs added if it lacks them."""

        def candidate(self, index, limit):
            if hasattr(super(), "candidate"):
                return super().candidate(index, limit)
            limit = min(limit, self.max_draft, self.cost.max_batch - 1)
            match = index.query() if limit > 0 else None
            if match is None:
                return None
            tokens, agreement = drafter_module._follow_majority(index, match, limit)[:2]
            return Candidate(tokens, agreement, match.length, 0) if tokens else None

        def note_drafted(self, drafted):
            if hasattr(super(), "note_drafted"):
                super().note_drafted(drafted)

    simulate.SuffixIndex = index_module.SuffixIndex  # that revision's index, too
    cost = drafter_module.CostModel(max_batch=512)
    for n_tokens, ms in args.curve:
        cost.observe(n_tokens, ms)
    cost.learning = False
    traces = json.load(open(args.traces))
    for temperature in sorted({float(t.get("temperature", 0.0)) for t in traces}):
        chosen = [t for t in traces if float(t.get("temperature", 0.0)) == temperature]
        print(f"{args.rev}: temperature {temperature}: {len(chosen)} traces, curve {dict(args.curve)}")
        print(simulate.format_report(simulate.report(chosen, cost, lambda sampled: Then(cost, sampled=sampled))))


if __name__ == "__main__":
    main()
