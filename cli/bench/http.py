"""`lookahead bench --server URL` / `--serve`: the workloads through `lookahead serve`'s HTTP API.

Three methods, interleaved as in the local bench (their order rotates every workload and
repetition), every request streamed and sent with `cache_prompt: false`, so each pays its
whole prompt prefill:

* http-plain       `"speculate": false`: plain decoding through the same server (the baseline);
* http-lookahead   speculation, no `prediction`: drafts come from the prompt and the output;
* http-prediction  speculation with OpenAI's `prediction`: the text the output is expected to
                   copy (a chat's last user message, a raw prompt itself).

Besides the speedups, each request measures the server layer: the client's time for the
request minus the library's own time for it (`speculation["request_ms"]`: the chat template,
tokenizing, the engine, the chunks, not the time the server spends writing them out), per
output token, as a share of the decode time per token (the client's time after the first
token, per later token). That is everything HTTP adds: parsing and validating the request,
the queue to the decoding thread, server-sent events, and the client reading them.

The pure parts (request bodies, the summaries, the table) are at the top; tests/test_bench.py
checks them by hand.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import click

from ..options import dist_version, flash_attn_setting, mmap_setting
from .measures import _round, geometric_mean, rotated, workload_seed
from .llama_server import ServerProcess, free_port
from .methods import WARMUP_TOKENS
from .table import align

HTTP_PLAIN = "http-plain"
HTTP_LOOKAHEAD = "http-lookahead"
HTTP_PREDICTION = "http-prediction"
HTTP_METHODS = (HTTP_PLAIN, HTTP_LOOKAHEAD, HTTP_PREDICTION)

OVERHEAD_BASIS = ("server overhead = (client's time for the request - the library's own time for it, "
                  "speculation.request_ms) per output token; share = that over the decode time per token (the "
                  "client's time after the first token / the output tokens after the first)")
SPEEDUP_BASIS = ("median client time of http-plain / of the method at temperature 0; above 0, median client decode "
                 "seconds per output token after the first (sampled outputs differ in length)")


# ---- pure: requests, runs, summaries, the table ------------------------------------------------
def base_url(url: str) -> str:
    """The server's base URL from what a user may type (also the `.../v1` OpenAI clients take);
    click.BadParameter naming it when it is not an http(s) URL."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise click.BadParameter(f"{url!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8000)",
                                 param_hint="--server")
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))


def prediction_text(workload: dict) -> str:
    """What a workload's output is expected to copy: a chat's last user message, or the prompt."""
    if "messages" in workload:
        return next((m["content"] for m in reversed(workload["messages"]) if m["role"] == "user"), "")
    return workload["prompt"]


def request_body(method: str, workload: dict, temperature: float, seed: int) -> dict:
    """The JSON body of one method's request for a workload (no cached prompt prefix)."""
    body: dict[str, Any] = {"max_tokens": workload["max_tokens"], "temperature": temperature, "seed": seed,
                            "cache_prompt": False}
    if "messages" in workload:
        body["messages"] = workload["messages"]
    else:
        body["prompt"] = workload["prompt"]
    if method == HTTP_PLAIN:
        body["speculate"] = False
    elif method == HTTP_PREDICTION:
        body["prediction"] = {"type": "content", "content": prediction_text(workload)}
    elif method != HTTP_LOOKAHEAD:
        raise ValueError(f"not an HTTP method: {method}")
    return body


@dataclass
class HttpRun:
    """One timed request of one method on one workload, as the client saw it and the server reported it."""

    workload: str
    category: str
    temperature: float
    rep: int
    method: str
    seconds: float  # the client's time: sending the request to `data: [DONE]`
    text: str = ""
    ttft_s: float | None = None
    completion_tokens: int = 0
    request_ms: float | None = None  # the library's own time for the request
    prefill_ms: float | None = None  # the library's prefill (all of the prompt but its last chunk)
    reused_prompt_tokens: int | None = None  # should be 0 (cache_prompt: false)
    drafted: int = 0
    accepted: int = 0
    prediction_accepted: int = 0  # usage.completion_tokens_details.accepted_prediction_tokens
    prediction_rejected: int = 0

    @property
    def overhead_ms_per_token(self) -> float | None:
        """What the HTTP layer added, per output token: client time - library time."""
        if self.request_ms is None or not self.completion_tokens:
            return None
        return (1000 * self.seconds - self.request_ms) / self.completion_tokens

    @property
    def decode_ms_per_token(self) -> float | None:
        """Decode time per token: the client's time after the first token, per later token
        (no prefill in it, not even the prompt's last chunk, decoded with the first token)."""
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return 1000 * (self.seconds - self.ttft_s) / (self.completion_tokens - 1)

    @property
    def overhead_share(self) -> float | None:
        overhead, decode = self.overhead_ms_per_token, self.decode_ms_per_token
        return overhead / decode if overhead is not None and decode else None

    @property
    def cost(self) -> float:
        """What speedups compare: seconds; above temperature 0 seconds per output token after
        the first, prefill excluded (sampled outputs of different methods differ in length)."""
        if self.temperature > 0 and self.ttft_s is not None and self.completion_tokens > 1:
            return (self.seconds - self.ttft_s) / (self.completion_tokens - 1)
        return self.seconds

    def to_dict(self) -> dict:
        return {"workload": self.workload, "category": self.category, "temperature": self.temperature,
                "rep": self.rep, "method": self.method, "seconds": _round(self.seconds), "text": self.text,
                "ttft_s": _round(self.ttft_s), "completion_tokens": self.completion_tokens,
                "request_ms": _round(self.request_ms, 3), "prefill_ms": _round(self.prefill_ms, 3),
                "reused_prompt_tokens": self.reused_prompt_tokens, "drafted": self.drafted,
                "accepted": self.accepted, "prediction_accepted": self.prediction_accepted,
                "prediction_rejected": self.prediction_rejected,
                "overhead_ms_per_token": _round(self.overhead_ms_per_token),
                "overhead_share": _round(self.overhead_share)}


def run_from_response(workload: dict, method: str, temperature: float, rep: int, response: Any) -> HttpRun:
    """An HttpRun from `lookahead.server.client.timed_request`'s answer."""
    usage = response.usage or {}
    details = usage.get("completion_tokens_details") or {}
    spec = response.speculation or {}
    return HttpRun(workload["id"], workload["category"], temperature, rep, method, response.total_s, response.text,
                   response.ttft_s, int(usage.get("completion_tokens") or 0),
                   spec.get("request_ms"), spec.get("prefill_ms"), spec.get("reused_prompt_tokens"),
                   int(spec.get("drafted") or 0), int(spec.get("accepted") or 0),
                   int(details.get("accepted_prediction_tokens") or 0),
                   int(details.get("rejected_prediction_tokens") or 0))


def _median(values: Sequence[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise_http_workload(runs: Sequence[HttpRun]) -> dict:
    """One workload at one temperature: per method the medians over repetitions and the speedup
    over http-plain; `prediction_gain`: http-lookahead's cost / http-prediction's."""
    first = runs[0]
    by_method: dict[str, list[HttpRun]] = {}
    for r in sorted(runs, key=lambda r: r.rep):
        by_method.setdefault(r.method, []).append(r)
    costs = {m: statistics.median(r.cost for r in rs) for m, rs in by_method.items()}
    plain_text = {r.rep: r.text for r in by_method.get(HTTP_PLAIN, [])}
    methods = {}
    for m, rs in by_method.items():
        identical = None
        if first.temperature == 0 and plain_text and m != HTTP_PLAIN:
            identical = all(plain_text.get(r.rep) == r.text for r in rs)
        methods[m] = {
            "seconds": [_round(r.seconds) for r in rs],
            "median_s": _round(statistics.median(r.seconds for r in rs)),
            "ttft_s": _round(_median([r.ttft_s for r in rs])),
            "completion_tokens": _round(statistics.median(r.completion_tokens for r in rs), 1),
            "speedup": _round(costs[HTTP_PLAIN] / costs[m]) if HTTP_PLAIN in costs and costs[m] > 0 else None,
            "identical": identical,
            "overhead_ms_per_token": _round(_median([r.overhead_ms_per_token for r in rs])),
            "decode_ms_per_token": _round(_median([r.decode_ms_per_token for r in rs])),
            "overhead_share": _round(_median([r.overhead_share for r in rs])),
            "acceptance_rate": _round(sum(r.accepted for r in rs) / sum(r.drafted for r in rs))
            if sum(r.drafted for r in rs) else None,
            "prediction_accepted": _round(statistics.median(r.prediction_accepted for r in rs), 1),
            "prediction_rejected": _round(statistics.median(r.prediction_rejected for r in rs), 1),
        }
    gain = None
    if HTTP_LOOKAHEAD in costs and HTTP_PREDICTION in costs and costs[HTTP_PREDICTION] > 0:
        gain = _round(costs[HTTP_LOOKAHEAD] / costs[HTTP_PREDICTION])
    return {"id": first.workload, "category": first.category, "temperature": first.temperature,
            "methods": methods, "prediction_gain": gain}


def summarise_http_group(rows: Sequence[dict], runs: Sequence[HttpRun], category: str) -> dict:
    """A category (or "all") at one temperature: geometric-mean speedups, prediction counts (sum
    of the workloads' medians), the overhead's median over every request of each method."""
    methods = [m for m in HTTP_METHODS if any(m in row["methods"] for row in rows)]
    speedup = {m: _round(geometric_mean(row["methods"][m]["speedup"] for row in rows if m in row["methods"]))
               for m in methods if m != HTTP_PLAIN}
    identical = {}
    for m in methods:
        flags = [row["methods"][m]["identical"] for row in rows
                 if m in row["methods"] and row["methods"][m]["identical"] is not None]
        if flags:
            identical[m] = {"identical": sum(flags), "of": len(flags)}
    overhead = {}
    for m in methods:
        rs = [r for r in runs if r.method == m]
        overhead[m] = {"ms_per_token": _round(_median([r.overhead_ms_per_token for r in rs])),
                       "decode_ms_per_token": _round(_median([r.decode_ms_per_token for r in rs])),
                       "share": _round(_median([r.overhead_share for r in rs])),
                       "share_max": _round(max((s for s in (r.overhead_share for r in rs) if s is not None),
                                               default=None))}
    prediction = None
    if HTTP_PREDICTION in methods:
        cells = [row["methods"][HTTP_PREDICTION] for row in rows if HTTP_PREDICTION in row["methods"]]
        prediction = {"accepted": _round(sum(c["prediction_accepted"] for c in cells), 1),
                      "rejected": _round(sum(c["prediction_rejected"] for c in cells), 1)}
    all_runs = [r for r in runs if r.overhead_share is not None]
    return {"category": category, "temperature": rows[0]["temperature"] if rows else None, "n": len(rows),
            "speedup": speedup,
            "prediction_gain": _round(geometric_mean(row["prediction_gain"] for row in rows)),
            "identical": identical, "prediction_tokens": prediction, "overhead": overhead,
            "overhead_share": _round(_median([r.overhead_share for r in all_runs]))}


def summarise_http(runs: Sequence[HttpRun]) -> tuple[list[dict], list[dict]]:
    """(per-workload rows, per-category summaries): for each temperature, the categories in
    order of first appearance, then "all"."""
    keys: dict[tuple[str, float], list[HttpRun]] = {}
    for r in runs:
        keys.setdefault((r.workload, r.temperature), []).append(r)
    rows = [summarise_http_workload(rs) for rs in keys.values()]
    summaries = []
    for t in dict.fromkeys(row["temperature"] for row in rows):
        t_rows = [row for row in rows if row["temperature"] == t]
        t_runs = [r for r in runs if r.temperature == t]
        for category in dict.fromkeys(row["category"] for row in t_rows):
            summaries.append(summarise_http_group([row for row in t_rows if row["category"] == category],
                                                  [r for r in t_runs if r.category == category], category))
        summaries.append(summarise_http_group(t_rows, t_runs, "all"))
    return rows, summaries


def format_http_table(summaries: Sequence[dict]) -> str:
    """One line per category and temperature: speedups over http-plain, prediction's gain over
    no prediction, the prediction tokens the verifier accepted / rejected, the server overhead."""
    head = ["category", "t", "n", "lookahead ×", "prediction ×", "prediction ÷ none", "pred. accepted",
            "pred. rejected", "overhead ms/token", "overhead plain", "overhead lookahead", "overhead prediction",
            "identical (lookahead, prediction)"]

    def num(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    lines = []
    for s in summaries:
        over = s["overhead"]
        pred = s["prediction_tokens"] or {}
        same = [s["identical"][m] for m in (HTTP_LOOKAHEAD, HTTP_PREDICTION) if m in s["identical"]]
        lines.append([s["category"], f"{s['temperature']:g}", str(s["n"]),
                      num(s["speedup"].get(HTTP_LOOKAHEAD)), num(s["speedup"].get(HTTP_PREDICTION)),
                      num(s["prediction_gain"]), num(pred.get("accepted"), "{:.0f}"), num(pred.get("rejected"), "{:.0f}"),
                      num((over.get(HTTP_PLAIN) or {}).get("ms_per_token"), "{:.3f}"),
                      *[num((over.get(m) or {}).get("share"), "{:.1%}") for m in HTTP_METHODS],
                      ", ".join(f"{c['identical']}/{c['of']}" for c in same) or "-"])
    return align(head, summaries, lines)


# ---- the server: one given by URL, or `lookahead serve` started here ------------------------------
def _get_json(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as r:
        return json.loads(r.read())


def check_server(url: str, api_key: str | None) -> dict:
    """The server's /health and model id; ClickException naming the URL if it is not a
    lookahead server that answers."""
    try:
        health = _get_json(url + "/health")
    except urllib.error.HTTPError as e:
        raise click.ClickException(f"{url}/health answered {e.code}: is {url} a `lookahead serve`?") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise click.ClickException(f"cannot reach a lookahead server at {url}: {reason}") from None
    if not isinstance(health, dict) or "cancelled" not in health:
        raise click.ClickException(f"{url}/health did not answer as `lookahead serve` does: {str(health)[:200]}")
    try:
        models = _get_json(url + "/v1/models", api_key)
    except urllib.error.HTTPError as e:
        hint = " (give its key with --api-key)" if e.code == 401 else ""
        raise click.ClickException(f"{url}/v1/models answered {e.code}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise click.ClickException(f"cannot reach a lookahead server at {url}: {getattr(e, 'reason', e)}") from None
    return {"model": models["data"][0]["id"], "n_ctx": health.get("n_ctx")}


class ServeProcess(ServerProcess):
    """`lookahead serve` on a free 127.0.0.1 port, with the bench's model options; its log goes
    to a temporary file, shown if it fails to start. `close()` stops it."""

    READY_TIMEOUT_S = 600.0
    LOG_TAIL_CHARS = 1500
    STOP_TIMEOUT_S = 20.0

    def __init__(self, model_path: Path, n_ctx: int, threads: int | None, gpu_layers: int):
        self.port = free_port()
        args = ["serve", "--host", "127.0.0.1", "--port", str(self.port), "--model", str(model_path),
                "--n-ctx", str(n_ctx), "--gpu-layers", str(gpu_layers), "--log-level", "warning"]
        if threads is not None:
            args += ["--threads", str(threads)]
        if not flash_attn_setting():
            args.append("--no-flash-attn")
        if mmap_setting():
            args.append("--mmap")
        self.args = ["lookahead", *args]
        self.log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        code = "from lookahead.cli.main import main; main(prog_name='lookahead')"
        env = {k: v for k, v in os.environ.items() if k != "LOOKAHEAD_API_KEY"}  # no key: a private server
        self.process = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.DEVNULL,
                                        stdout=self.log, stderr=subprocess.STDOUT, env=env)


# ---- the run ---------------------------------------------------------------------------------------
@dataclass
class HttpResult:
    config: dict[str, Any]
    rows: list[dict]
    summaries: list[dict]
    runs: list[HttpRun]


def bench_http(url: str, api_key: str | None, workloads: list[dict], temperatures: Sequence[float], reps: int,
               log: Callable[[str], None], started: dict | None = None) -> HttpResult:
    """Every workload through the server at `url`, each method in turn (rotating), `reps` times.

    `started`: the settings `lookahead serve` was started with (--serve), for the config.
    """
    from lookahead.server.client import timed_request

    server = check_server(url, api_key)
    log(f"server {url}: model {server['model']!r}, n_ctx {server['n_ctx']}; methods {', '.join(HTTP_METHODS)}")

    def request(method: str, workload: dict, temperature: float, rep: int, seed: int) -> HttpRun:
        body = request_body(method, workload, temperature, seed)
        try:
            response = timed_request(url, body, api_key=api_key)
        except RuntimeError as e:  # the server answered an error
            raise click.ClickException(f"workload {workload['id']!r}, {method}: {url}: {e}") from None
        except (urllib.error.URLError, OSError) as e:
            raise click.ClickException(f"workload {workload['id']!r}, {method}: request to {url} failed: "
                                       f"{getattr(e, 'reason', e)}") from None
        if response.speculation is None or "request_ms" not in response.speculation:
            raise click.ClickException(f"{url} answered without lookahead's speculation.request_ms: a "
                                       "`lookahead serve` of this version is needed")
        return run_from_response(workload, method, temperature, rep, response)

    short = {**workloads[0], "max_tokens": WARMUP_TOKENS}
    for method in HTTP_METHODS:  # untimed: first-call costs fall on no one
        request(method, short, 0.0, -1, 0)
    runs: list[HttpRun] = []
    for w_index, workload in enumerate(workloads):
        for temperature in temperatures:
            for rep in range(reps):
                seed = workload_seed(workload["id"], rep)
                for method in rotated(HTTP_METHODS, w_index + rep):
                    run = request(method, workload, temperature, rep, seed)
                    runs.append(run)
                    rep_note = f" rep {rep + 1}/{reps}" if reps > 1 else ""
                    share = run.overhead_share
                    log(f"[{w_index + 1}/{len(workloads)}] {workload['id']} t={temperature:g}{rep_note} {method} "
                        f"{run.seconds:.2f} s, {run.completion_tokens} tokens"
                        + (f", server overhead {share:.1%}" if share is not None else ""))
    reused = [r for r in runs if r.reused_prompt_tokens]
    if reused:
        log(f"warning: {len(reused)} requests reused a cached prompt prefix despite cache_prompt: false")
    rows, summaries = summarise_http(runs)
    config = {
        "server": url, "started_here": started, "model": server["model"], "n_ctx": server["n_ctx"], "reps": reps,
        "temperatures": list(temperatures), "methods": list(HTTP_METHODS),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "prefix_cache": "every request sends cache_prompt: false and pays its whole prompt prefill",
        "streamed": True, "order": "interleaved per workload, temperature and repetition; rotated every repetition",
        "warm_up": f"one untimed {WARMUP_TOKENS}-token request per method",
        "speedup_basis": SPEEDUP_BASIS, "overhead_basis": OVERHEAD_BASIS,
        "lookahead": dist_version("lookahead"),
        "client_machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
    }
    return HttpResult(config, rows, summaries, runs)


def print_http(result: HttpResult, n_workloads: int) -> None:
    config = result.config
    started = config["started_here"]
    click.echo(f"{config['server']}" + (f" (started here: {' '.join(started['args'])})" if started else "")
               + f", model {config['model']}, n_ctx {config['n_ctx']}, {config['reps']} reps, {n_workloads} "
               "workloads; streamed, cache_prompt: false")
    click.echo("speedup × = geometric mean over workloads of http-plain (speculate: false) median / method median; "
               "prediction ÷ none: http-prediction over http-lookahead; pred. accepted/rejected: prediction tokens "
               "the verifier kept/refused (sum of the workloads' medians)")
    click.echo("overhead: (client time - the library's request_ms) per output token, its median in ms for "
               "http-plain, and per method as a share of the decode time per token (client time after the first "
               "token per later token; median over requests)")
    click.echo(format_http_table(result.summaries))
