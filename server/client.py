"""One timed request through a running server's HTTP API (standard library only), for benches.

    from lookahead.server.client import timed_request
    run = timed_request("http://127.0.0.1:8000", {"messages": [...], "max_tokens": 256,
                                                  "prediction": {"type": "content", "content": text}})
    run.text, run.ttft_s, run.total_s, run.usage, run.speculation
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import NamedTuple


class ServerRun(NamedTuple):
    text: str
    ttft_s: float | None  # seconds from sending the request to the first non-empty text; None if none came
    total_s: float  # seconds from sending the request to `data: [DONE]`
    usage: dict  # OpenAI's usage block (with completion_tokens_details' prediction counts)
    speculation: dict | None  # the server's `speculation` field: lookahead's stats for the request


def timed_request(base_url: str, body: dict, api_key: str | None = None, timeout_s: float = 3600.0) -> ServerRun:
    """Send `body` to /v1/chat/completions (if it has `messages`) or /v1/completions, streamed.

    `stream` and `stream_options.include_usage` are set here, so the time to the first token
    is measured and the usage comes back. An error answer raises RuntimeError with the
    server's message.
    """
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(base_url.rstrip("/") + route, data=json.dumps(payload).encode(), headers=headers)
    parts: list[str] = []
    usage: dict = {}
    speculation = None
    ttft_s = None
    t0 = time.perf_counter()
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        try:
            detail = json.loads(detail)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        raise RuntimeError(f"{route} answered {e.code}: {detail}") from None
    with response:
        for raw in response:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data:"):
                continue  # blank separators, `: ping` comments
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"{route} failed while streaming: {chunk['error'].get('message')}")
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
                if text:
                    if ttft_s is None:
                        ttft_s = time.perf_counter() - t0
                    parts.append(text)
            usage = chunk.get("usage") or usage
            speculation = chunk.get("speculation") or speculation
    return ServerRun("".join(parts), ttft_s, time.perf_counter() - t0, usage, speculation)
