"""`lookahead bench` on rewrite items: quality checks and summaries by hand, then end to end."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from lookahead.cli.bench.rewrite import (
    format_rewrites,
    is_rewrite_file,
    load_rewrites,
    quality,
    summarise_rewrites,
)

from lookahead.edit import lines_kept

BIN = Path(sys.executable).parent / "lookahead"
SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _write(tmp_path: Path, rows: list, name: str = "items.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_lines_kept_counts_source_lines_found_in_order():
    source = "a\n\nb\nc\nd\n"
    assert lines_kept(source, source) == 1.0
    assert lines_kept(source, "a\nb\nX\nd\n") == 0.75  # c replaced
    assert lines_kept(source, "d\nc\nb\na\n") == 0.25  # in order only
    assert lines_kept(source, "") == 0.0
    assert lines_kept("a  \n", "a\n") == 1.0  # trailing spaces do not count
    assert lines_kept("\n\n", "anything") == 1.0  # nothing to keep


def test_quality_flags_loops_and_bounds():
    q = quality("a\nb\n", "a\nbc\n", "stop", [])
    assert q == {"length_ratio": 1.25, "lines_kept": 0.5, "loop_stopped": False, "bound_reached": False,
                 "finish_reason": "stop", "warnings": []}
    q = quality("a\nb\n", "a\nb\n", "stop", [])
    assert q == {"length_ratio": 1.0, "lines_kept": 1.0, "loop_stopped": False, "bound_reached": False,
                 "finish_reason": "stop", "warnings": []}
    q = quality("a\nb\n", "a\n", "loop", ["the rewrite: stopped a loop of repeated lines ('x')"])
    assert q["loop_stopped"] and not q["bound_reached"] and q["lines_kept"] == 0.5
    assert quality("a", "a", "length", [])["bound_reached"]


def test_load_rewrites_reads_files_relative_to_the_jsonl(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\ntext\n", encoding="utf-8")
    path = _write(tmp_path, [
        {"id": "a", "category": "doc", "file": "docs/a.md", "instruction": "Fix it", "second": "Shorten it"},
        {"id": "b", "category": "code", "text": "x = 1\n", "filename": "b.py", "instruction": "Rename x"},
        {"id": "c", "category": "doc", "text": "more", "instruction": "Fix it"},
    ])
    assert is_rewrite_file(path)
    items = load_rewrites(path)
    assert [i["id"] for i in items] == ["a", "b", "c"]
    assert items[0]["text"] == "# A\n\ntext\n" and items[0]["filename"] == "a.md"
    assert items[1]["filename"] == "b.py" and "second" not in items[1]
    assert [i["id"] for i in load_rewrites(path, limit=1)] == ["a", "b"]
    assert [i["id"] for i in load_rewrites(path, categories=["code"])] == ["b"]


@pytest.mark.parametrize("row, message", [
    ({"id": "a", "category": "doc", "text": "t"}, "'instruction' must be a non-empty string"),
    ({"id": "a", "category": "doc", "instruction": "x"}, "exactly one of 'file'"),
    ({"id": "a", "category": "doc", "instruction": "x", "text": "t", "file": "f"}, "exactly one of 'file'"),
    ({"id": "a", "category": "doc", "instruction": "x", "file": "missing.md"}, "cannot read"),
    ({"id": "a", "category": "doc", "instruction": "x", "text": "t", "second": ""}, "'second' must be"),
])
def test_load_rewrites_names_the_bad_line(tmp_path, row, message):
    path = _write(tmp_path, [row])
    with pytest.raises(click.BadParameter, match=message) as info:
        load_rewrites(path)
    assert f"{path}:1" in str(info.value)


def test_workload_files_are_not_rewrite_files(tmp_path):
    assert not is_rewrite_file(SAMPLES / "workloads.jsonl")
    assert is_rewrite_file(SAMPLES / "rewrites.jsonl")
    assert {i["category"] for i in load_rewrites(SAMPLES / "rewrites.jsonl")} == {"doc", "code"}
    assert not is_rewrite_file(_write(tmp_path, ["not an object"]))


def _row(id_, category, plain_s, lookahead_s, loop=False, second_ratio=None):
    row = {"id": id_, "category": category, "source_tokens": 100, "output_tokens": 90, "plain_s": plain_s,
           "lookahead_s": lookahead_s, "speedup": plain_s / lookahead_s, "decode_speedup": None,
           "drafted": 10, "accepted": 5, "identical_to_plain": not loop,
           "quality": quality("a\nb\n", "a\n" if loop else "a\nb\n", "loop" if loop else "stop",
                              ["stopped a loop"] if loop else [])}
    if second_ratio is not None:
        row["second"] = {"reused_prompt_tokens": 80, "ttft_ratio": second_ratio}
    return row


def test_summaries_take_geometric_means_and_name_the_worst_item():
    rows = [_row("d1", "doc", 4.0, 2.0, second_ratio=0.25), _row("d2", "doc", 2.0, 2.0, loop=True, second_ratio=1.0),
            _row("c1", "code", 3.0, 1.0)]
    doc, code, overall = summarise_rewrites(rows)
    assert [g["category"] for g in (doc, code, overall)] == ["doc", "code", "all"]
    assert doc["speedup"] == pytest.approx(2 ** 0.5) and doc["worst"] == {"id": "d2", "speedup": 1.0}
    assert doc["loops_stopped"] == 1 and doc["identical_to_plain"] == 1 and doc["acceptance"] == 0.5
    assert doc["second_ttft_ratio"] == pytest.approx(0.5) and code["second_ttft_ratio"] is None
    assert overall["n"] == 3 and overall["speedup"] == pytest.approx((2 * 1 * 3) ** (1 / 3))
    table = format_rewrites({"rows": rows, "summary": [doc, code, overall]})
    assert "| d2 |" in table and "| all | 3 |" in table


def test_rewrite_mode_end_to_end(tmp_path):
    doc = ("# Notes\n\nThe meeting is on Monday. We will talk about the budget and the new office.\n\n"
           "## Actions\n\n- Anna books the room.\n- Ben sends the agenda.\n- Chris writes the minutes.\n")
    path = _write(tmp_path, [{"id": "notes", "category": "doc", "text": doc, "filename": "notes.md",
                              "instruction": "Fix the spelling mistakes", "second": "Replace Anna with Anne"}])
    out = subprocess.run([str(BIN), "bench", str(path), "--reps", "1", "--max-tokens", "24", "--n-ctx", "1024",
                          "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["config"]["mode"] == "rewrite" and len(result["results"]) == 1
    (row,) = result["results"][0]["rows"]
    assert row["speedup"] == pytest.approx(row["plain_s"] / row["lookahead_s"])
    assert 0 < row["output_tokens"] <= 24 and row["text"] and row["plain_text"]
    assert row["identical_to_plain"] is (row["text"] == row["plain_text"])
    assert 0.0 <= row["quality"]["lines_kept"] <= 1.0
    # the second edit sent the same document right after the first: its prefix was reused
    second = row["second"]
    assert second["reused_prompt_tokens"] >= row["source_tokens"] and second["text"]
    assert "second edit" in out.stderr and "[1/1] notes rep 1/1 lookahead" in out.stderr


def test_rewrite_mode_refuses_options_it_does_not_have():
    out = subprocess.run([str(BIN), "bench", str(SAMPLES / "rewrites.jsonl"), "--plot", "x.png"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--plot is not available for rewrite items" in out.stderr
