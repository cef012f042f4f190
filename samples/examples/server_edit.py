"""Rewrite a selection of a file through `lookahead serve`, with the selection as `prediction`.

    .venv/bin/lookahead serve &                 # in another terminal; wait for "Uvicorn running"
    .venv/bin/python samples/examples/server_edit.py samples/code/textutils.py \\
        --lines 1:20 --instruction "Rename the function slugify to make_slug"
    .venv/bin/python samples/examples/server_edit.py samples/code/textutils.py \\
        --lines 1:20 --instruction "Rename the function slugify to make_slug" --endpoint edits

What an editor plugin does. With `--endpoint chat` (the default), any OpenAI-compatible
server: send the selected lines with an instruction to /v1/chat/completions through the
`openai` client, pass the same lines as OpenAI's Predicted Outputs `prediction`, stream the
new text, and report how many predicted tokens the model kept
(usage.completion_tokens_details.accepted_prediction_tokens). With `--endpoint edits`,
lookahead's own /v1/lookahead/edits: send the whole file, the selection as a region and the
instruction; the server builds the prompt, cleans the answer (fences, chatter), bounds its
length, stops loops and rewrites a long selection in pieces (`lookahead.edit`), and streams
the new selection. The new selection is printed; with --in-place the file is rewritten with
it (atomically, once complete).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai


def line_range(spec: str) -> tuple[int, int]:
    """'START:END' (1-based, inclusive) -> (START, END); 'START:' runs to the end of the file."""
    start, sep, end = spec.partition(":")
    try:
        first = int(start)
        last = int(end) if end else sys.maxsize
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END line numbers, e.g. 10:42, got {spec!r}") from None
    if not sep or first < 1 or last < first:
        raise argparse.ArgumentTypeError(f"expected START:END with 1 <= START <= END, got {spec!r}")
    return first, last


def strip_fences(text: str) -> str:
    """Drop a Markdown code fence the model put around its whole answer."""
    lines = text.strip("\n").split("\n")
    if len(lines) >= 2 and lines[0].startswith("```") and lines[-1].strip() == "```":
        return "\n".join(lines[1:-1])
    return text


def edit_through_the_endpoint(args: argparse.Namespace, model: str, text: str, region: tuple[int, int]
                               ) -> tuple[str, dict]:
    """POST /v1/lookahead/edits, streamed: (the new selection, the final event with the result)."""
    body = {"model": model, "text": text, "instruction": args.instruction, "region": list(region),
            "filename": args.file.name, "temperature": 0, "stream": True}
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    if args.no_prediction:
        body["speculate"] = False  # the buffer is always the reference here: compare with plain decoding
    parts, final = [], {}
    with httpx.stream("POST", args.base_url.rstrip("/") + "/lookahead/edits", json=body, timeout=None,
                      headers={"Authorization": f"Bearer {args.api_key}"}) as response:
        if response.status_code != 200:
            response.read()
            sys.exit(f"error {response.status_code}: {response.json()['error']['message']}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                sys.exit(f"error: {event['error']['message']}")
            if event["object"] == "lookahead.edit.chunk":
                parts.append(event["text"])
                if not args.in_place:
                    print(event["text"], end="", flush=True)
            else:
                final = event
    return "".join(parts), final


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--instruction", "-i", required=True, help='What to change, e.g. "Add type hints".')
    parser.add_argument("--lines", type=line_range, default=None, help="Selection START:END (1-based). Default: all.")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="The server's /v1 URL.")
    parser.add_argument("--api-key", default=os.environ.get("LOOKAHEAD_API_KEY", "none"),
                        help="The server's --api-key, if it has one (default: $LOOKAHEAD_API_KEY).")
    parser.add_argument("--model", default=None, help="Model id. Default: the first one GET /v1/models lists.")
    parser.add_argument("--endpoint", choices=["chat", "edits"], default="chat",
                        help="chat: /v1/chat/completions with a prediction (any OpenAI-compatible server); "
                             "edits: lookahead's /v1/lookahead/edits (the whole file, the selection as the region).")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="Default: twice the selection's length + 64 (chat); bounded by the selection (edits).")
    parser.add_argument("--no-prediction", action="store_true",
                        help="Send no prediction (chat), or plain decoding with speculate: false (edits): to compare.")
    parser.add_argument("--in-place", action="store_true", help="Replace the selection in FILE with the result.")
    args = parser.parse_args()

    text = args.file.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    first, last = args.lines or (1, len(lines))
    if first > len(lines):
        parser.error(f"--lines starts at line {first}, but {args.file} has {len(lines)} lines")
    last = min(last, len(lines))
    selection = "".join(lines[first - 1:last])

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    if args.endpoint == "edits":
        start = len("".join(lines[:first - 1]))
        t0 = time.perf_counter()
        result, final = edit_through_the_endpoint(args, model, text, (start, start + len(selection)))
        seconds = time.perf_counter() - t0
        finish(args, lines, first, last, result, printed=result)
        for warning in final.get("warnings", []):
            print(f"warning: {warning}", file=sys.stderr)
        usage = final.get("usage")
        if usage:
            details = usage["completion_tokens_details"]
            print(f"{usage['completion_tokens']} tokens in {seconds:.1f} s ({final['finish_reason']}); tokens "
                  f"drafted from the file accepted {details['accepted_prediction_tokens']}, rejected "
                  f"{details['rejected_prediction_tokens']}", file=sys.stderr)
        return 0
    messages = [{"role": "user", "content": f"{args.instruction.strip().rstrip('.')} in the following code. "
                                            f"Output the whole revised code and nothing else.\n\n{selection}"}]
    extra = {} if args.no_prediction else {"prediction": {"type": "content", "content": selection}}
    max_tokens = args.max_tokens or 2 * len(selection) // 3 + 64  # ~3 characters a token, twice over
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, **extra)
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
            if not args.in_place:
                print(chunk.choices[0].delta.content, end="", flush=True)
        usage = chunk.usage or usage
    seconds = time.perf_counter() - t0
    result = strip_fences("".join(parts))
    if selection.endswith("\n") and not result.endswith("\n"):
        result += "\n"
    finish(args, lines, first, last, result, printed="".join(parts))
    if usage is not None:
        details = usage.completion_tokens_details
        print(f"{usage.completion_tokens} tokens in {seconds:.1f} s; prediction tokens accepted "
              f"{details.accepted_prediction_tokens}, rejected {details.rejected_prediction_tokens}",
              file=sys.stderr)
    return 0


def finish(args: argparse.Namespace, lines: list[str], first: int, last: int, result: str, printed: str) -> None:
    """Write the new selection into the file (--in-place, atomically), or end the `printed` one."""
    if args.in_place:
        new_text = "".join(lines[:first - 1]) + result + "".join(lines[last:])
        fd, tmp = tempfile.mkstemp(dir=args.file.parent or ".", prefix=f".{args.file.name}.")
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(new_text)
        os.chmod(tmp, args.file.stat().st_mode & 0o7777)
        os.replace(tmp, args.file)
        print(f"rewrote lines {first}-{last} of {args.file}", file=sys.stderr)
    elif not printed.endswith("\n"):
        print()


if __name__ == "__main__":
    sys.exit(main())
