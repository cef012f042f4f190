"""The `lookahead bench` command: load, run every method interleaved, summarise, print."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from ..options import EXIT_INTERRUPTED, llama_settings, model_options, resolve_model
from .methods import DEFAULT_METHODS, LOCAL_METHODS, SERVER_SPEC_MODES, method_order
from .plot import plot, require_matplotlib
from .quant import QUANT_FORMATS, compare_formats, format_formats, quantized_model
from .rewrite import bench_rewrites, format_rewrites, is_rewrite_file, load_rewrites
from .run import ModelResult, bench_model
from .table import format_table
from .workloads import load_workloads


@click.command()
@click.argument("workloads_file", metavar="WORKLOADS.jsonl", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--temperature", "-t", "temperatures", type=click.FloatRange(min=0.0), multiple=True, default=(0.0,),
              show_default=True, help="Sampling temperature; repeat for several (each is a separate run).")
@click.option("--reps", type=click.IntRange(min=1), default=3, show_default=True,
              help="Repetitions per workload, method and temperature (the median is kept).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N workloads of each category.")
@click.option("--category", "categories", multiple=True, help="Only this category (repeatable).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Cap every workload's max_tokens at this (for quick runs).")
@click.option("--methods", type=click.Choice(LOCAL_METHODS), multiple=True, default=DEFAULT_METHODS,
              show_default=True, help="Methods to run (repeatable).")
@click.option("--pld-tokens", type=click.IntRange(min=1), default=10, show_default=True,
              help="Draft length of llama-cpp-python's LlamaPromptLookupDecoding (num_pred_tokens).")
@click.option("--llama-server", "llama_server", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="llama.cpp's llama-server binary (scripts/llama-server.sh builds one): also "
                                 f"time it plain and in each speculation mode: {', '.join(SERVER_SPEC_MODES)} "
                                 "(each of their calls in a fresh server: no memory of earlier requests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with everything instead of the table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG: speedups, acceptance, inter-token latency histograms (needs matplotlib).")
@model_options(tree_width=False)
@click.option("--quant", "quants", type=click.Choice(QUANT_FORMATS), multiple=True,
              help="Also run everything on this quantization of the model (repeatable), made once with "
                   "llama.cpp's quantizer and kept in lookahead's cache; prints each format's verify-cost "
                   "curve, perplexity on the sample texts and speedups side by side.")
@click.option("--serve", "serve", is_flag=True,
              help="Instead of the local methods: start `lookahead serve` on a free 127.0.0.1 port with "
                   "--model/--n-ctx/--threads/--gpu-layers, run the workloads through its HTTP API "
                   "(plain, speculation, speculation with `prediction`), report speedups and the server "
                   "layer's overhead per token, and stop it.")
@click.option("--server", "server_url", metavar="URL", default=None,
              help="As --serve, against a `lookahead serve` already running at URL (e.g. http://127.0.0.1:8000).")
@click.option("--api-key", envvar="LOOKAHEAD_API_KEY", default=None,
              help="With --server: the server's key (also from $LOOKAHEAD_API_KEY).")
@click.pass_context
def bench(ctx, workloads_file, temperatures, reps, limit, categories, max_tokens, methods, pld_tokens, llama_server,
          as_json, plot_path, model_path, n_ctx, threads, gpu_layers, quants, serve, server_url, api_key):
    """Time lookahead against plain decoding and prompt lookup on the workloads in WORKLOADS.jsonl.

    Each line: {"id", "category", "messages": [...] or "prompt": "...", "max_tokens"}.
    A file of rewrite items instead ({"id", "category", "file" or "text", "instruction",
    "second"}, see samples/rewrites.jsonl) runs the rewrite mode: each file rewritten through
    lookahead.edit with and without speculation, a quality check per item (output length
    against the source, lines kept verbatim, loops stopped) and a second edit of the same
    file timed against the first.
    Methods run interleaved in one process on one model, their order rotating every
    repetition; the KV cache is cleared before every call, so each pays its prefill.
    Prints a table per category and temperature (speedups are geometric means of plain
    median / method median; alpha, k and "predicted" come from the i.i.d. acceptance model
    and the measured verify-cost curve), or everything with --json. Progress goes to stderr.
    Outputs are scored for loops: "loops" counts the workloads whose plain output repeats
    its own text (a quarter of it or more), "loop-free" is the speedup over the others.

    With --serve or --server, the same workloads go through `lookahead serve`'s HTTP API
    instead, streamed, each request with `cache_prompt: false` (its whole prefill): plain
    (`speculate: false`), speculation, and speculation with `prediction` (a chat's last user
    message, a raw prompt itself). The table gives the speedups over plain, the prediction
    tokens accepted and rejected, and the server's overhead: the client's time minus the
    library's own time for the request (`speculation.request_ms`), per output token, as a
    share of the decode time per token.

    \b
    Examples:
      lookahead bench samples/workloads.jsonl --plot bench-t0.png
      lookahead bench samples/workloads.jsonl -t 0 -t 0.7 --json > bench.json
      lookahead bench samples/workloads.jsonl --limit 1 --reps 1 --max-tokens 32
      lookahead bench samples/workloads.jsonl --serve --reps 3
      lookahead bench samples/workloads.jsonl --server http://127.0.0.1:8000 --category edit
      lookahead bench samples/rewrites.jsonl --reps 1
    """
    if is_rewrite_file(workloads_file):
        _bench_rewrites(workloads_file, temperatures, reps, limit, categories, max_tokens, as_json, model_path,
                        n_ctx, threads, gpu_layers, unsupported={"--llama-server": llama_server, "--plot": plot_path,
                                                                 "--quant": quants, "--serve": serve,
                                                                 "--server": server_url})
        return
    if plot_path is not None:
        require_matplotlib()
    temperatures = list(dict.fromkeys(temperatures))
    methods = sorted(dict.fromkeys(methods), key=method_order)
    workloads = load_workloads(workloads_file, categories, limit, max_tokens)
    log = lambda message: click.echo(message, err=True)
    if serve or server_url is not None:
        _bench_server(ctx, serve, server_url, api_key, workloads, temperatures, reps, as_json, model_path, n_ctx,
                      threads, gpu_layers, log)
        return
    path = resolve_model(model_path)
    if llama_server is None:
        log("llama-server modes skipped (give --llama-server PATH to time llama.cpp's own n-gram speculation)")
    llama = llama_settings(n_ctx, threads, gpu_layers)
    models = [path] + [quantized_model(path, fmt, log) for fmt in dict.fromkeys(quants)]
    results = []
    try:
        for model in models:
            results.append(bench_model(model, llama, methods, workloads, temperatures, reps, pld_tokens,
                                       llama_server, log))
    except KeyboardInterrupt:
        log("\ninterrupted")
        sys.exit(EXIT_INTERRUPTED)
    filters = {"workloads_file": str(workloads_file), "categories": list(categories), "limit": limit,
               "max_tokens_cap": max_tokens}
    formats = compare_formats(results, llama, workloads, log) if quants else None
    first = results[0]
    if plot_path is not None:
        plot(plot_path, first.summaries, first.runs)
        log(f"wrote {plot_path}")
    if as_json:
        out = {"config": {**filters, **first.config}, "workloads": first.rows, "summary": first.summaries,
               "runs": [run.to_dict() for run in first.runs]}
        if formats is not None:
            out["formats"] = formats
            out["models"] = [{"config": r.config, "workloads": r.rows, "summary": r.summaries} for r in results[1:]]
        click.echo(json.dumps(out, ensure_ascii=False))
        return
    for result in results:
        _print_model(result, len(workloads), llama_server is not None)
    if formats is not None:
        click.echo("")
        click.echo(format_formats(formats))


def _print_model(result: ModelResult, n_workloads: int, with_server: bool) -> None:
    config = result.config
    threads = config["threads"]
    click.echo(f"{result.path.name}, n_ctx {config['n_ctx']}, threads {threads['n_threads']}/"
               f"{threads['n_threads_batch']} (one-token/batch; lookahead's one-token: "
               f"{threads['lookahead_decode_threads']}), {config['reps']} reps, {n_workloads} workloads; "
               f"prefix cache {config['prefix_cache']}")
    click.echo("speedup × = geometric mean over workloads of plain median / method median"
               + (" (server-plain: over plain, per output token; the server's n-gram modes: over server-plain)"
                  if with_server else "")
               + "; acceptance, tokens/pass, alpha, k, predicted: lookahead")
    click.echo(format_table(result.summaries))


def _bench_rewrites(path, temperatures, reps, limit, categories, max_tokens, as_json, model_path, n_ctx, threads,
                    gpu_layers, unsupported) -> None:
    """The rewrite mode (see cli/bench/rewrite.py)."""
    for option, value in unsupported.items():
        if value:
            raise click.UsageError(f"{option} is not available for rewrite items ({path} holds rewrite items)")
    items = load_rewrites(path, categories, limit)
    model = resolve_model(model_path)
    llama = llama_settings(n_ctx, threads, gpu_layers)
    log = lambda message: click.echo(message, err=True)
    log(f"rewrite mode: {len(items)} items, plain (speculate=False) and lookahead through lookahead.edit, "
        f"{reps} reps, {model.name}")
    results = []
    try:
        for temperature in dict.fromkeys(temperatures):
            result = bench_rewrites(model, llama, items, temperature, reps, log, max_tokens)
            results.append({"temperature": temperature, **result})
    except KeyboardInterrupt:
        log("\ninterrupted")
        sys.exit(EXIT_INTERRUPTED)
    if as_json:
        click.echo(json.dumps({"config": {"workloads_file": str(path), "model": str(model), "n_ctx": llama["n_ctx"],
                                          "reps": reps, "mode": "rewrite"}, "results": results}, ensure_ascii=False))
        return
    for result in results:
        click.echo(f"{model.name}, rewrite items from {path}, t={result['temperature']:g}, {reps} reps "
                   "(speedup: plain median / lookahead median, end to end; decode ×: per output token after "
                   "the first text; quality columns: lookahead's first output)")
        click.echo(format_rewrites(result))
        click.echo("")


def _bench_server(ctx, serve, server_url, api_key, workloads, temperatures, reps, as_json, model_path, n_ctx, threads,
                  gpu_layers, log) -> None:
    """--serve / --server: the workloads through the HTTP API (see cli/bench/http.py)."""
    from .http import ServeProcess, base_url, bench_http, print_http

    given = lambda name: ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
    mode = "--serve" if serve else "--server"
    if serve and server_url is not None:
        raise click.UsageError("give --serve (start a server here) or --server URL (use a running one), not both")
    local_only = ["methods", "pld_tokens", "llama_server", "plot_path", "quants"]
    if not serve:
        local_only += ["model_path", "n_ctx", "threads", "gpu_layers"]  # the server has its own
    for name in local_only:
        if given(name):
            option = next(p for p in ctx.command.params if p.name == name).opts[0]
            raise click.UsageError(f"{option} does not apply to {mode}"
                                   + (" (the server at URL has its own model and settings; --serve starts one "
                                      "with them)" if name in ("model_path", "n_ctx", "threads", "gpu_layers")
                                      else ""))
    if serve and given("api_key"):
        raise click.UsageError("--api-key applies to --server: the server --serve starts takes no key")
    process = None
    try:
        if serve:
            path = resolve_model(model_path)
            process = ServeProcess(path, n_ctx, threads, gpu_layers)
            log(f"starting {' '.join(process.args)}")
            process.wait_ready()
            url, started = process.url, {"args": process.args}
        else:
            url, started = base_url(server_url), None
        result = bench_http(url, api_key if not serve else None, workloads, temperatures, reps, log, started)
    except click.ClickException as e:
        if process is not None and process.process.poll() is not None:  # the server died: say why
            e.message += f"\n`{' '.join(process.args)}` exited with {process.process.returncode}:\n{process.log_tail()}"
        raise
    except KeyboardInterrupt:
        log("\ninterrupted")
        sys.exit(EXIT_INTERRUPTED)
    finally:
        if process is not None:
            process.close()
    if as_json:
        click.echo(json.dumps({"config": result.config, "workloads": result.rows, "summary": result.summaries,
                               "runs": [run.to_dict() for run in result.runs]}, ensure_ascii=False))
        return
    print_http(result, len(workloads))
