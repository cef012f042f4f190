"""Running every method on one model file: load, warm up, interleave, summarise."""
from __future__ import annotations

import datetime
import os
import platform
import urllib.error
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import click
from lookahead.adapters import health

from ..options import dist_version
from .llama_server import ColdServer, LlamaServer
from .local import LocalMethods
from .measures import prompt_text, repeat_share, rotated, workload_seed
from .methods import (PREFIX_CACHE_POLICY, SERVER_METHODS, SERVER_PLAIN_BASIS, SERVER_SPEC_MODES, SERVER_SPEC_POLICY,
                      WARMUP_TOKENS)
from .summary import Run, summarise

SPEEDUP_BASIS = ("median wall time at temperature 0 (for a text that differs from plain's: its time to the first "
                 "token plus its decode seconds per token over the rest of plain's length); above 0, median decode "
                 "seconds per output token after the first, prefill excluded (sampled outputs differ in length "
                 "between methods)")


@dataclass
class ModelResult:
    """Everything one model's run gives: its settings and measurements, rows, summaries, runs."""

    path: Path
    config: dict[str, Any]
    rows: list[dict]
    summaries: list[dict]
    runs: list[Run]


def bench_model(path: Path, llama: dict[str, Any], methods: Sequence[str], workloads: list[dict],
                temperatures: Sequence[float], reps: int, pld_tokens: int, llama_server: Path | None,
                log: Callable[[str], None]) -> ModelResult:
    """Run `methods` (and llama-server's, with a binary) on every workload, interleaved."""
    with ExitStack() as stack:
        log(f"loading {path.name} (n_ctx {llama['n_ctx']}, threads {llama.get('n_threads') or 'llama-cpp-python default'}) "
            f"for: {', '.join(methods)}")
        try:
            local = LocalMethods(path, llama, methods, pld_tokens)
        except ValueError as e:  # llama-cpp-python: "Failed to load model from file: ..."
            raise click.ClickException(f"cannot load model {str(path)!r}: {e}") from None
        runners: dict[str, Callable[..., Run]] = {m: local.run for m in methods}
        flash_attn = bool(llama.get("flash_attn", False))
        mmap = bool(llama.get("use_mmap", True))  # llama_cpp.Llama's default
        if llama_server is not None:
            threads = llama.get("n_threads") or os.cpu_count() or 1
            for spec_args, method in zip(((), *SERVER_SPEC_MODES.values()), SERVER_METHODS):
                start = partial(LlamaServer, llama_server, path, llama["n_ctx"], threads, llama["n_gpu_layers"],
                                spec_args, flash_attn=flash_attn, mmap=mmap)
                server = ColdServer(start) if spec_args else start()  # a cold server starts at each call
                stack.callback(server.close)
                if isinstance(server, LlamaServer):
                    server.wait_ready()
                runners[method] = server.run
        order = list(runners)
        _warm_up(runners, workloads[0])
        runs = _run_all(runners, order, workloads, temperatures, reps, log)
        curve = local.verify_cost_ms()
        llama_threads = {"n_threads": local.llm.n_threads, "n_threads_batch": local.llm.n_threads_batch,
                         "lookahead_decode_threads": local.decode_threads()}
    rows, summaries = summarise(runs, curve)
    reused = [r.reused_prompt_tokens for r in runs if r.reused_prompt_tokens]
    if reused:
        log(f"warning: {len(reused)} lookahead calls reused a cached prompt prefix despite the reset")
    looping = [row for row in rows if row.get("loops")]
    if looping:
        log(f"note: {len(looping)} of {len(rows)} workload runs have a plain output that loops (a quarter or more of "
            f"it repeats itself, e.g. {looping[0]['id']} at t={looping[0]['temperature']:g}); a loop is cheap to "
            "draft, so read the loop-free speedups (and the texts, with --json)")
    contended = sum(1 for r in runs if r.contended)
    if contended:
        log(f"warning: in {contended} lookahead calls another process took the cores (decoded with fewer "
            "threads): their timings are not this machine's quiet speed")
    config = {
        "model": str(path), "n_ctx": llama["n_ctx"], "threads": llama_threads, "gpu_layers": llama["n_gpu_layers"],
        "flash_attn": flash_attn, "use_mmap": mmap,
        "reps": reps, "temperatures": list(temperatures), "methods": order, "pld_tokens": pld_tokens,
        "llama_server": str(llama_server) if llama_server else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "prefix_cache": PREFIX_CACHE_POLICY, "speedup_basis": SPEEDUP_BASIS,
        "warm_up": f"one untimed {WARMUP_TOKENS}-token call per method",
        "server_plain_basis": SERVER_PLAIN_BASIS if llama_server else None,
        "server_speculation": SERVER_SPEC_POLICY if llama_server else None,
        "streamed": True, "order": "interleaved per workload, temperature and repetition; rotated every repetition",
        "verify_cost_ms": ({str(n): round(curve[n], 3) for n in (1, 2, 4, 8, 16, 32, 64) if n < len(curve)}
                           if curve is not None else None),
        "llama_cpp_python": dist_version("llama-cpp-python"), "lookahead": dist_version("lookahead"),
        # the build's lookahead patches, and whether batched decodes were exact (--exact)
        "llama_cpp_patches": health.build_patches(), "exact_batches": health.exact_batches_requested(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
    }
    return ModelResult(path, config, rows, summaries, runs)



def _warm_up(runners: dict[str, Callable[..., Run]], workload: dict) -> None:
    """One short untimed call per method: first-call costs (allocations, page faults) fall on no one."""
    short = {**workload, "max_tokens": WARMUP_TOKENS}
    for method, run in runners.items():
        _checked(run, method, short, 0.0, 0)


def _checked(run: Callable[..., Run], method: str, workload: dict, temperature: float, seed: int) -> Run:
    try:
        return run(method, workload, temperature, seed)
    except ValueError as e:  # e.g. a prompt longer than the context window
        raise click.ClickException(f"workload {workload['id']!r}, {method}: {e}") from None
    except (urllib.error.URLError, OSError) as e:
        raise click.ClickException(f"workload {workload['id']!r}, {method}: llama-server request failed: {e}") from None


def _run_all(runners, order, workloads, temperatures, reps, log) -> list[Run]:
    runs = []
    for w_index, workload in enumerate(workloads):
        for temperature in temperatures:
            for rep in range(reps):
                seed = workload_seed(workload["id"], rep)
                for method in rotated(order, w_index + rep):
                    run = _checked(runners[method], method, workload, temperature, seed)
                    run.rep = rep
                    run.repeat_share = repeat_share(run.text, prompt_text(workload))
                    runs.append(run)
                    rep_note = f" rep {rep + 1}/{reps}" if reps > 1 else ""
                    log(f"[{w_index + 1}/{len(workloads)}] {workload['id']} t={temperature:g}{rep_note} "
                        f"{method} {run.seconds:.2f} s")
    return runs
