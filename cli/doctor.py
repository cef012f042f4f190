"""`lookahead doctor`: what llama.cpp build this is, what the CPU can do, and whether it works here."""
from __future__ import annotations

import json
import os
from pathlib import Path

import click

from .options import (dist_version, flash_attn_option, flash_attn_setting, model_option, resolve_model,
                      rpc_endpoints, rpc_option)

# The instruction sets that matter to llama.cpp on x86, as /proc/cpuinfo names them.
CPU_FLAGS_SHOWN = ("avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
                   "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


@click.command()
@model_option("Model to test with: a name (`lookahead models` lists them) or a GGUF file. Default: "
              "$LOOKAHEAD_MODEL, else qwen2.5-coder-1.5b.")
@click.option("--context", "context_tokens", type=click.IntRange(16, 4096), default=256, show_default=True,
              help="Tokens in the KV cache when the decode times are taken.")
@rpc_option("Run the check with every layer on these llama.cpp RPC servers: lists their devices and "
            "times t(1)/t(8)/t(64) through them (network round trips included).")
@flash_attn_option("Run the check with llama.cpp's flash attention on (as the commands load models by default) "
                   "or off.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
def doctor(model_path, context_tokens, as_json):
    """Check that llama.cpp runs batched decodes on this machine, and time them.

    Prints the llama-cpp-python build (its compiled CPU features, GPU offload, and which of
    lookahead's llama.cpp patches it holds), what the CPU reports, the thread defaults, and
    t(1)/t(8)/t(64): one decode of 1, 8 and 64 tokens after a --context-token prompt, single
    tokens with the faster of the two thread counts (as lookahead decodes them).
    Speculation verifies a draft of k tokens in one decode of k + 1, so this curve says how
    much it can gain here. It also compares the rows of a batched
    decode with the same tokens decoded one at a time (bit-identical, or how far apart): where
    they differ, greedy output with speculation can part from plain decoding's at a near-tie,
    and on the set-up's build it runs the check in the other mode too (exact batches on, the
    default, or off), so both curves and both answers are side by side.
    The decodes run in a child process: a build
    that crashes on this CPU (e.g. AMX compiled in on a VM that faults on it) is reported with
    its cause and fix instead of killing lookahead. Exit code 1 when batched decodes fail.
    With --rpc, the model's layers are on the RPC servers, so the curve is the one speculation
    gets there.
    """
    from lookahead.adapters import health

    path = resolve_model(model_path)
    info = health.system_info()
    flags = health.cpu_flags()
    endpoints = rpc_endpoints()
    flash_attn = flash_attn_setting()
    result = health.probe(path, context_tokens=context_tokens, rpc=endpoints, flash_attn=flash_attn)
    patches = health.build_patches()
    exact_on = health.exact_batches_requested()
    other = None
    if result.ok and health.exact_batches_available() and not endpoints:  # (the servers keep their own mode)
        # The other mode, for comparison: what exactness costs or what it gives.
        other = health.probe(path, context_tokens=context_tokens, flash_attn=flash_attn,
                             extra_env={health.EXACT_BATCHES_ENV: "0" if exact_on else "1"})
    report = {
        "lookahead": dist_version("lookahead"),
        "llama_cpp_python": dist_version("llama-cpp-python"),
        "library": str(health.library_path()),
        "compiled_features": {k: v for k, v in info.items()},
        "gpu_offload": health.gpu_offload(),
        "patches": patches,
        "transparent_huge_pages": health.transparent_huge_pages(),
        "exact_batches": {"requested": exact_on, "other_mode": other.to_dict() if other is not None else None},
        "cpu": {"model": health.cpu_model(), "count": os.cpu_count(),
                "reports": sorted(f for f in CPU_FLAGS_SHOWN if f in flags)},
        "amx": {"compiled": health.amx_compiled(info), "reported_by_cpu": "amx_int8" in flags},
        "rpc": {"endpoints": endpoints, "devices": result.rpc_devices} if endpoints else None,
        "flash_attn": flash_attn,
        "check": result.to_dict(),
    }
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        _print(report, result, other)
    if not result.ok:
        raise SystemExit(1)


def _timings(t: dict) -> str:
    return ", ".join(f"t({n}) {t[n]:.1f} ms" for n in ("1", "8", "64") if n in t)


def _print(report: dict, result, other=None) -> None:
    from lookahead.adapters import health

    echo = click.echo
    echo(f"lookahead {report['lookahead']}, llama-cpp-python {report['llama_cpp_python']}")
    echo(f"  library:   {report['library']}")
    compiled = [k for k, v in report["compiled_features"].items() if v == "1"]
    echo(f"  compiled:  {' '.join(compiled) or '(none reported)'}")
    echo(f"  backend:   {'GPU offload available' if report['gpu_offload'] else 'CPU only (no GPU offload in this build)'}")
    echo(f"  patches:   {', '.join(report['patches']) if report['patches'] else 'none (stock llama.cpp)'}"
         + ("" if report["patches"] else "; scripts/setup.sh adds a batch kernel for Q4_1 weights"))
    thp = report["transparent_huge_pages"]
    if thp is not None:
        echo(f"  huge pages: the kernel's transparent huge pages are \"{thp}\""
             + ("" if thp != "never" else ": the weights stay on 4 KiB pages, and decodes are a little slower"))
    cpu = report["cpu"]
    echo(f"cpu: {cpu['model']}, {cpu['count']} logical CPUs")
    echo(f"  reports:   {' '.join(cpu['reports']) or '(no x86 flags read)'}")
    amx = report["amx"]
    echo(f"  AMX:       {'compiled in' if amx['compiled'] else 'not compiled in'}, "
         f"{'reported' if amx['reported_by_cpu'] else 'not reported'} by the CPU")
    threads = result.threads
    if threads:
        one = ", ".join(f"{n} thread{'s' if n != '1' else ''}: {ms:.1f} ms"
                        for n, ms in threads.get("one_token_ms", {}).items())
        echo(f"threads: llama-cpp-python defaults n_threads={threads['n_threads']} (one-token decodes), "
             f"n_threads_batch={threads['n_threads_batch']}; one-token decode at {one}")
    if report["rpc"]:
        devices = result.rpc_devices
        echo(f"rpc: {len(report['rpc']['endpoints'])} server(s), every layer on them; devices: "
             + ("; ".join(f"{d['name']} at {d['endpoint']} ({d['total_mib']} MiB, {d['free_mib']} MiB free)"
                          for d in devices) or "(none listed: the check did not get that far)"))
        echo("  the servers' own build and exact mode cannot be seen from here: start them with "
             "LOOKAHEAD_EXACT_BATCHES=1 (the row check below runs through them)")
    echo(f"model: {result.model}" + (f" ({result.model_desc})" if result.model_desc else ""))
    if result.ok:
        t = result.timings_ms
        curve = _timings(t)
        ratio = f"; t(64)/t(1) = {t['64'] / t['1']:.1f}" if "1" in t and "64" in t and t["1"] > 0 else ""
        echo(f"batched decodes: OK. {curve}{ratio}")
        exact_on = report["exact_batches"]["requested"]
        mode = "exact mode" if exact_on else "exact mode off (--no-exact)"
        parity = result.parity
        if parity:
            if parity["identical"] == parity["rows"]:
                echo(f"  batched rows = one-token rows: yes, {parity['rows']} of {parity['rows']} bit for bit ({mode}): "
                     "greedy output with speculation is plain decoding's, token for token")
            else:
                echo(f"  batched rows = one-token rows: {parity['identical']} of {parity['rows']} ({mode}; largest "
                     f"logit difference {parity['max_logit_diff']:.3g}): greedy output can part from plain "
                     "decoding's at a near-tie")
                if exact_on and report["flash_attn"] and health.FLASH_ATTN_EXACT not in report["patches"]:
                    echo("  exact mode is on, yet they differ: this build lacks lookahead's flash attention patch "
                         "(scripts/setup.sh builds it; --no-flash-attn checks without flash attention)")
                elif exact_on:
                    echo("  exact mode is on, yet they differ: this CPU or build is not one the exact kernels "
                         "cover (x86 with AVX2, FMA and F16C, scripts/setup.sh's build)")
                elif health.Q4_1_KERNEL not in report["patches"]:
                    echo("  scripts/setup.sh's build makes them identical (its exact mode, on by default)")
        if other is not None and other.ok and other.parity:
            p = other.parity
            label = "with --no-exact (llama.cpp's stock kernels)" if exact_on else "in exact mode (--exact)"
            echo(f"  {label}: {p['identical']} of {p['rows']} rows bit for bit; {_timings(other.timings_ms)}")
    else:
        echo("batched decodes: FAILED")
        echo(result.cause)
        if result.error:
            echo("child's last output:\n  " + result.error.replace("\n", "\n  "))


def _gpu_offload() -> bool:
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())

