"""llama.cpp's own server as a bench method: plain and with its n-gram speculation."""
from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

import click

from .summary import Run


def wait_for_health(process: subprocess.Popen, url: str, command: str, log_tail: Callable[[], str],
                    timeout_s: float, poll_s: float = 0.3) -> None:
    """Until GET {url}/health answers 200. A server process that exits first, or is not ready
    after `timeout_s`, is a ClickException naming `command`, with the end of its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise click.ClickException(f"`{command}` exited with {process.returncode}:\n{log_tail()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(poll_s)
    raise click.ClickException(f"`{command}` not ready after {timeout_s:.0f} s:\n{log_tail()}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server process the bench starts on 127.0.0.1: its URL, readiness, log and stop.

    A subclass sets `port`, `args` (the command, for messages), `log` (a temporary file the
    process writes to: a pipe read only at exit fills up and stalls a chatty server) and
    `process`; the class attributes are its defaults.
    """

    READY_TIMEOUT_S = 180.0
    LOG_TAIL_CHARS = 800
    STOP_TIMEOUT_S = 10.0
    port: int
    args: list[str]
    log: "tempfile._TemporaryFileWrapper[str]"
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float | None = None) -> None:
        wait_for_health(self.process, self.url, " ".join(self.args), self.log_tail,
                        self.READY_TIMEOUT_S if timeout_s is None else timeout_s)

    def log_tail(self, chars: int | None = None) -> str:
        self.log.seek(0)
        return self.log.read()[-(self.LOG_TAIL_CHARS if chars is None else chars):]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class LlamaServer(ServerProcess):
    """One llama-server process on 127.0.0.1, plain or with speculation arguments.

    Uses llama.cpp's server API (/health, /completion, /v1/chat/completions, `cache_prompt`);
    `spec_args` are its speculation options (methods.SERVER_SPEC_MODES). Run by hand against the
    llama-server scripts/llama-server.sh builds (CI has none, so no test starts one). Prompt
    caching is switched off per request (`cache_prompt: false`), so every call pays its
    prefill, as the local methods do. Requests do not stream: no latencies for the plot.
    """

    def __init__(self, binary: Path, model_path: Path, n_ctx: int, threads: int, gpu_layers: int,
                 spec_args: Sequence[str] = (), flash_attn: bool = True, mmap: bool = True):
        self.port = free_port()
        self.spec_args = tuple(spec_args)
        args = [str(binary), "-m", str(model_path), "--host", "127.0.0.1", "--port", str(self.port),
                "-c", str(n_ctx), "-t", str(threads), "-tb", str(threads), "-ngl", str(gpu_layers),
                "-fa", "on" if flash_attn else "off", *([] if mmap else ["--load-mode", "none"]), *self.spec_args]
        self.args = args
        self.log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)

    def post(self, route: str, body: dict) -> dict:
        request = urllib.request.Request(self.url + route, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=3600) as r:
            return json.loads(r.read())

    def run(self, method: str, workload: dict, temperature: float, seed: int) -> Run:
        common = {"temperature": temperature, "seed": seed, "cache_prompt": False}
        t0 = time.perf_counter()
        if "messages" in workload:
            out = self.post("/v1/chat/completions",
                            {"messages": workload["messages"], "max_tokens": workload["max_tokens"], **common})
            message = out["choices"][0]["message"]
            text = message.get("content") or ""
            # a reasoning model's thoughts come apart from the answer, and were decoded too
            decoded = (message.get("reasoning_content") or "") + text
        else:
            out = self.post("/completion", {"prompt": workload["prompt"], "n_predict": workload["max_tokens"], **common})
            text = decoded = out.get("content", "")
        seconds = time.perf_counter() - t0
        timings = out.get("timings") or {}
        run = Run(workload["id"], workload["category"], temperature, -1, method, seconds, text)
        run.generated_tokens = timings.get("predicted_n")
        run.output_tokens = self.count_tokens(decoded)
        decode_ms = timings.get("predicted_ms")
        if decode_ms is not None:
            # No stream, so the first token's time is the call's less the server's decode time,
            # which runs from the first token to the last sampled one (an end-of-generation token
            # included): the decodes that a local method's stream shows after its first piece.
            run.ttft_s = seconds - decode_ms / 1000
        return run

    def count_tokens(self, text: str) -> int:
        """The tokens of `text` as the local methods count theirs: re-tokenized, no special tokens."""
        if not text:
            return 0
        return len(self.post("/tokenize", {"content": text, "add_special": False, "parse_special": False})["tokens"])


class ColdServer:
    """A llama-server method whose every call runs in a fresh process, started (and sent one
    short untimed request) before the call, so no call drafts from an earlier one's output.

    llama.cpp's n-gram speculation keeps what it learned across requests: ngram-mod's pool of
    n-grams (4M entries) is shared by all of them and reset only when a quarter full, so a
    repeated workload drafts from its previous run's output, which no local method can (each
    pays its whole prefill and starts with no memory). The start is outside the timed call.
    """

    WARM_UP = {"id": "warm-up", "category": "", "prompt": "Hello", "max_tokens": 4}

    def __init__(self, start: Callable[[], LlamaServer]):
        self._start = start
        self.server: LlamaServer | None = None

    def run(self, method: str, workload: dict, temperature: float, seed: int) -> Run:
        self.close()
        self.server = self._start()
        self.server.wait_ready()
        self.server.run(method, self.WARM_UP, 0.0, 0)  # first-call costs fall on no one
        return self.server.run(method, workload, temperature, seed)

    def close(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.close()
