"""Does this llama.cpp build run batched decodes on this machine? Checked in a child process.

A llama-cpp-python compiled with `-march=native` on a CPU that reports AMX uses AMX tiles for
batched matrix products; on some virtual machines those instructions fault, and the process
dies with SIGSEGV or SIGILL on its first batched decode (a one-token decode works). A crash
cannot be caught inside the process, so it is tested in a child: load the model, prefill a
context, time decodes of 1, 8 and 64 tokens. The parent turns a death by signal into a message
that names the cause and the fix. `lookahead doctor` runs it; `LlamaCppTarget` runs it once per
build (cached) when the build has AMX compiled in, the case known to crash.

Run as a module (`python -m lookahead.adapters.health MODEL`) it is the child: it prints one
line per stage and a final JSON line with the timings.
"""
from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lookahead import cache

from . import exact

PROBE_SIZES = (1, 8, 64)
RPC_ENV = "LOOKAHEAD_HEALTH_RPC"  # the child: RPC servers to register, every layer on them
FLASH_ATTN_ENV = "LOOKAHEAD_HEALTH_FLASH_ATTN"  # the child: "0" loads the model with flash attention off
CACHE_KIND = "backend-health"


class BackendCrash(RuntimeError):
    """Batched decodes kill the process on this machine; the message says why and what to do."""


# ---- what the build and the CPU say -------------------------------------------------------
def system_info() -> dict[str, str]:
    """llama.cpp's compile-time feature report, e.g. {"AVX2": "1", "AMX_INT8": "1", ...}."""
    import llama_cpp

    text = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    return {k.strip(): v.strip() for k, v in re.findall(r"([A-Za-z0-9_]+)\s*=\s*([^|]+)", text)}


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the kernel reports them (/proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def transparent_huge_pages(setting: str = "/sys/kernel/mm/transparent_hugepage/enabled") -> str | None:
    """The kernel's transparent huge pages mode ("always", "madvise" or "never"; None where it
    does not say): with "never", the set-up's build's large buffers stay on 4 KiB pages."""
    try:
        text = Path(setting).read_text()
    except OSError:
        return None
    chosen = [word[1:-1] for word in text.split() if word.startswith("[") and word.endswith("]")]
    return chosen[0] if chosen else None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def library_path() -> Path:
    import llama_cpp

    return Path(llama_cpp.__file__).resolve().parent / "lib"


# lookahead's patches to llama.cpp (adapters/patches, applied by scripts/setup.sh), each known
# by a name its code leaves in the library it patches (the CPU backend, or the RPC one).
Q4_1_KERNEL = "Q4_1 batch kernel"  # also leaves attention to the one-token kernels in exact mode
K_QUANT_EXACT = "exact K-quant batches"  # Q4_K, Q5_K, Q6_K rows independent of the batch
RPC_LOST = "RPC lost-server errors"  # a server that goes away is an error, not an abort
FLASH_ATTN_EXACT = "exact flash attention"  # its rows independent of the batch (needed with flash_attn on)
Q8_K_QUANTIZER = "AVX2 Q8_K quantizer"  # speed only: the reference's bytes, vectorised
TILED_SAME_RESULTS = "tiled K-quant speed-ups"  # speed only: ggml's AVX2 microtile, the same integers
# speed only, with AVX-512 VNNI: exact batches of Q4_K and Q6_K from a packed copy of the weights
PACKED_WEIGHTS = "packed batches"
HUGE_PAGES = "huge-page buffers"  # speed only, on Linux: ggml's large buffers ask for 2 MiB pages
# speed only, with AVX2 and without AVX-512 VNNI: batches of 12 or more columns of Q4_K and Q6_K
# with the weight rows in lanes
ROWS_IN_LANES = "rows-in-lanes batches"
PATCH_MARKERS = {Q4_1_KERNEL: b"tinyBLAS_Q4_1_AVX2", K_QUANT_EXACT: b"la_exact_rows",
                 RPC_LOST: b"ggml_backend_rpc_lost", FLASH_ATTN_EXACT: b"la_exact_flash_attn",
                 Q8_K_QUANTIZER: b"la_quantize_row_q8_K_avx2", TILED_SAME_RESULTS: b"la_tiled_same_results",
                 PACKED_WEIGHTS: b"la_packed_batches", HUGE_PAGES: b"la_huge_pages",
                 ROWS_IN_LANES: b"la_lanes_batches"}
PATCH_LIBRARIES = {RPC_LOST: "libggml-rpc*", HUGE_PAGES: "libggml-base*"}  # the others: "libggml-cpu*"
EXACT_PATCHES = (Q4_1_KERNEL, K_QUANT_EXACT)  # what exact batches need (lookahead.adapters.exact)

EXACT_BATCHES_ENV = exact.ENV


def exact_batches_requested() -> bool:
    return exact.requested()


def exact_batches_available() -> bool:
    """Whether this build can run exact batches: it holds lookahead's patches."""
    patches = build_patches()
    return all(p in patches for p in EXACT_PATCHES)


def build_patches(lib: Path | None = None) -> list[str]:
    """The names of lookahead's llama.cpp patches compiled into this build (none: stock)."""
    lib = library_path() if lib is None else lib
    found = []
    for name, marker in PATCH_MARKERS.items():
        for f in sorted(lib.glob(PATCH_LIBRARIES.get(name, "libggml-cpu*"))) if lib.is_dir() else []:
            try:
                if f.is_file() and not f.is_symlink():
                    st = f.stat()
                    if marker in _markers_in(str(f), st.st_ino, st.st_size, st.st_mtime_ns):
                        found.append(name)
                        break
            except OSError:
                continue
    return found


@functools.lru_cache(maxsize=32)
def _markers_in(path: str, inode: int, size: int, mtime_ns: int) -> frozenset[bytes]:
    """The patch markers a library file holds, read once per version of the file (inode, size
    and mtime are part of the key): a wrap asks several times, and the CPU library is megabytes."""
    data = Path(path).read_bytes()
    return frozenset(m for m in PATCH_MARKERS.values() if m in data)


def build_identity() -> str:
    """Changes whenever the installed llama.cpp libraries change (path, size, mtime)."""
    parts = []
    lib = library_path()
    for f in sorted(lib.glob("*")) if lib.is_dir() else []:
        try:
            st = f.stat()
        except OSError:
            continue
        parts.append(f"{f.name}:{st.st_size}:{int(st.st_mtime)}")
    return f"{lib}|{'|'.join(parts)}|{cpu_model()}"


def gpu_offload() -> bool:
    """Whether this build can offload layers to a GPU (CUDA, Metal, Vulkan, ...)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def amx_compiled(info: dict[str, str] | None = None) -> bool:
    info = system_info() if info is None else info
    return info.get("AMX_INT8", "0") == "1"


# ---- the child -------------------------------------------------------------------------------
@dataclass
class ProbeResult:
    ok: bool
    model: str
    stage: str = ""  # the last stage the child reached: load, prefill, decode N, done
    signal: str | None = None  # e.g. "SIGSEGV" when the child died by a signal
    returncode: int | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)  # {"1": t(1), "8": t(8), "64": t(64)}
    threads: dict[str, Any] = field(default_factory=dict)  # counts, and one-token ms per count
    model_desc: str = ""  # llama.cpp's description, e.g. "llama ?B Q4_1"
    # Rows of one batched decode against the same tokens decoded one at a time (see
    # `batch_parity`): {"rows", "identical", "max_logit_diff"}
    parity: dict[str, Any] = field(default_factory=dict)
    rpc_devices: list[dict] = field(default_factory=list)  # with `rpc`: the servers' devices (rpc.devices)
    # What lookahead's first request with the child's settings would measure: {"key" (the
    # measurement cache's), "decode_threads", "verify_ms", "verify_threads"}
    measurements: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # the tail of the child's stderr, or why it could not run
    cause: str = ""  # for a failure: what went wrong and how to fix it

    def to_dict(self) -> dict:
        return asdict(self)


def probe(model_path: str | os.PathLike, context_tokens: int = 256, reps: int = 3, timeout: float = 300.0,
          command: list[str] | None = None, extra_env: dict[str, str] | None = None,
          rpc: list[str] | None = None, flash_attn: bool = True) -> ProbeResult:
    """Run the batched-decode check in a child process and explain a failure.

    `command` replaces the child's command line (tests use it to simulate a crash);
    `extra_env` is added to the child's environment (e.g. EXACT_BATCHES_ENV); `rpc`: RPC
    servers ("host:port") the child registers, with every layer offloaded to them; `flash_attn`:
    the child's model loaded with it (as lookahead.load and the commands do by default).
    """
    cmd = command or [sys.executable, "-m", "lookahead.adapters.health", str(model_path),
                      str(context_tokens), str(reps)]
    result = ProbeResult(ok=False, model=str(model_path))
    # The child writes no cache: the parent keeps what it measured (keep_measurements).
    env = {**os.environ, **(extra_env or {}), "LOOKAHEAD_HEALTH_CHILD": "1", "LOOKAHEAD_NO_CACHE": "1"}
    if rpc:
        env[RPC_ENV] = ",".join(rpc)
    env[FLASH_ATTN_ENV] = "1" if flash_attn else "0"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        result.error = f"the check did not finish within {timeout:.0f} s"
        result.cause = result.error
        return result
    result.returncode = proc.returncode
    for line in proc.stdout.splitlines():
        if line.startswith("stage: "):
            result.stage = line[len("stage: "):]
        elif line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            result.timings_ms = data.get("timings_ms", {})
            result.threads = data.get("threads", {})
            result.model_desc = data.get("model_desc", "")
            result.parity = data.get("parity", {})
            result.rpc_devices = data.get("rpc_devices", [])
            result.measurements = data.get("measurements", {})
    result.error = "\n".join(proc.stderr.strip().splitlines()[-5:])
    if proc.returncode < 0:
        try:
            result.signal = signal.Signals(-proc.returncode).name
        except ValueError:
            result.signal = f"signal {-proc.returncode}"
    result.ok = proc.returncode == 0 and result.stage == "done"
    if not result.ok:
        result.cause = explain(result)
    elif result.measurements:
        keep_measurements(result.measurements)
    return result


def keep_measurements(measured: dict[str, Any]) -> None:
    """Keep a probe's thread count and verify-cost curve for lookahead's first request with
    the same settings (the Llama's defaults: the commands' without --threads, `load()`'s),
    which then times nothing (the set-up ends with `lookahead doctor`). Only what is missing
    is filled in: a curve learned from real requests is better than one at the probe's short
    context. The curve is on probation there as any restored one (CostModel.from_dict)."""
    from .llama_cpp.state import MEASUREMENTS

    key = measured.get("key")
    if not key:
        return
    known = cache.get(MEASUREMENTS, key) or {}
    missing = {}
    if "decode_threads" not in known and measured.get("decode_threads"):
        missing["decode_threads"] = measured["decode_threads"]
    if "verify_ms" not in known and measured.get("verify_ms"):
        missing.update(verify_ms=measured["verify_ms"], verify_threads=measured.get("verify_threads"))
    if missing:
        cache.put(MEASUREMENTS, key, {**known, **missing})


def explain(result: ProbeResult) -> str:
    """What a failed probe means, and what to do about it."""
    where = f"at stage '{result.stage or 'start'}'"
    if result.signal is None:
        return (f"the batched-decode check failed {where} (exit code {result.returncode}): "
                f"{result.error or 'no error output'}")
    try:
        info = system_info()
    except Exception:  # the parent may not load the library either
        info = {}
    flags = cpu_flags()
    lines = [f"a batched decode of {Path(result.model).name} killed the process with {result.signal} {where}."]
    if amx_compiled(info):
        reported = "reports AMX" if "amx_int8" in flags else "does not report AMX"
        lines.append(
            "This llama-cpp-python build has AMX compiled in (AMX_INT8 = 1, from -march=native), "
            f"and this CPU ({cpu_model()}) {reported}: some virtual machines report AMX but fault on it.")
    else:
        compiled = ", ".join(k for k, v in info.items() if v == "1" and k.startswith(("AVX", "F16C", "FMA", "BMI")))
        lines.append(f"The build uses instructions this CPU ({cpu_model()}) may not execute "
                     f"(compiled with: {compiled or 'unknown'}).")
    lines.append(
        "Fix: rebuild llama-cpp-python for the features that run here: `bash scripts/setup.sh` in a "
        "lookahead checkout, or\n  CMAKE_ARGS=\"$(python -m lookahead.adapters.cmake_args)\" pip install "
        "--force-reinstall --no-cache-dir --no-deps llama-cpp-python==0.3.36")
    return "\n".join(lines)


def ensure_batched_decodes(model_path: str | os.PathLike) -> None:
    """Raise BackendCrash if batched decodes die on this machine; checked once per build.

    Only a build with AMX compiled in is checked (the crash seen in the field); the answer
    is cached per build and CPU, so the child runs once. LOOKAHEAD_NO_HEALTH_CHECK=1 skips it.
    """
    if os.environ.get("LOOKAHEAD_HEALTH_CHILD") or os.environ.get("LOOKAHEAD_NO_HEALTH_CHECK", "") not in ("", "0"):
        return
    if not amx_compiled():
        return
    key = build_identity()
    known = cache.get(CACHE_KIND, key)
    if known is None:
        result = probe(model_path, context_tokens=64, reps=1)
        if result.signal is None and not result.ok:
            return  # not a crash (e.g. a timeout): nothing known, do not block the caller
        known = {"ok": result.ok, "cause": result.cause}
        cache.put(CACHE_KIND, key, known)
    if not known["ok"]:
        raise BackendCrash(known["cause"])


PARITY_TOKENS = 64  # enough rows for the kernels llama.cpp keeps for long batches (flash attention's tiled one)


def batch_parity(target, n_tokens: int = PARITY_TOKENS) -> dict[str, Any]:
    """Decode `n_tokens` tokens at the current position one at a time, then again as one
    batch, and compare the logits rows: {"rows", "identical" (bit for bit), "max_logit_diff"}.

    llama.cpp's CPU build hands batches of 2+ rows to llamafile's tinyBLAS kernels (attention
    over the F16 KV cache, Q8_0 weights) and one-token decodes to its own dot products: the
    sums are rounded in another order, and the int8 quantization of activations between layers
    turns last-bit differences into logit differences of ~0.5 (measured here). Verify rows then
    differ a little from the plain decoding's, and greedy output can part from plain's at a
    near-tie. A build with -DGGML_LLAMAFILE=OFF, or the set-up's build with EXACT_BATCHES_ENV
    set (Q4_1 or Q8_0 weights), runs both through the same kernels: identical rows. Rolled back
    afterwards.
    """
    import numpy as np

    base = target.n_past
    n_tokens = min(n_tokens, target.max_batch, target.n_ctx - base)
    tokens = [(101 + 7 * i) % target.n_vocab for i in range(n_tokens)]
    single = np.concatenate([target.decode([t], 1).copy() for t in tokens])
    target.rollback(base)
    batched = target.decode(tokens, n_tokens).copy()
    target.rollback(base)
    diff = np.abs(single.astype(np.float64) - batched.astype(np.float64)).max(axis=1)
    return {"rows": int(n_tokens), "identical": int((diff == 0).sum()), "max_logit_diff": round(float(diff.max()), 4)}


def _child(model_path: str, context_tokens: int, reps: int) -> None:
    """Load, prefill `context_tokens`, time decodes of PROBE_SIZES; print stages and a JSON line."""
    import numpy as np

    def stage(name: str) -> None:
        print(f"stage: {name}", flush=True)

    stage("load")
    import llama_cpp

    from lookahead.adapters.llama_cpp import LlamaCppTarget, rpc
    from lookahead.adapters.llama_cpp.threads import faster_thread_count
    from lookahead.drafter.cost import CALIBRATION_SIZES

    endpoints = [e for e in os.environ.get(RPC_ENV, "").split(",") if e]
    if endpoints:
        rpc.register(endpoints)
    # (at least n_batch: llama-cpp-python cuts n_batch down to n_ctx, and the measurement key
    # holds it, which would then differ from the defaults' key the measurements are kept for)
    n_ctx = max(context_tokens + max(PROBE_SIZES) + 16, 512)
    # the weights read, not mapped, as lookahead.load has them (on 2 MiB pages where the build asks)
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=n_ctx, n_batch=512, n_gpu_layers=-1 if endpoints else 0,
                          flash_attn=os.environ.get(FLASH_ATTN_ENV, "1") != "0", use_mmap=False, verbose=False)
    target = LlamaCppTarget(llm, threads="keep")
    stage("prepare")
    target.prepare()  # else the first batch timed below would pay for it
    n_vocab = target.n_vocab
    text = "The quick brown fox jumps over the lazy dog. " * (context_tokens // 8 + 1)
    prompt = target.tokenize(text, add_bos=True)[:context_tokens]
    prompt += [(97 + i) % n_vocab for i in range(context_tokens - len(prompt))]
    stage("prefill")
    target.begin(prompt)
    target.decode(prompt[-1:], 1)
    # One-token decodes at the Llama's own thread count and at its batch count: llama-cpp-python
    # defaults the first to half the CPUs, which is slow where the CPUs are not SMT siblings.
    # The curve below is timed with the faster, as lookahead's decodes run (threads="auto").
    own, batch = int(llm.n_threads), int(llm.n_threads_batch)
    one_token: dict[str, float] = {}
    for n_threads in sorted({own, batch}):
        stage(f"decode 1, {n_threads} threads")
        llama_cpp.llama_set_n_threads(llm._ctx.ctx, n_threads, batch)
        one_token[str(n_threads)] = round(float(np.median(
            [target.calibrate([1], reps=1)[1] for _ in range(max(3, reps))])), 2)
    chosen = faster_thread_count({int(n): ms for n, ms in one_token.items()}, own)  # as tune() chooses
    llama_cpp.llama_set_n_threads(llm._ctx.ctx, chosen, batch)
    # PROBE_SIZES are reported; with the calibration's sizes they make the curve kept for
    # lookahead's first request (which then times nothing)
    sizes = sorted(set(PROBE_SIZES) | set(CALIBRATION_SIZES))
    timings: dict[str, list[float]] = {str(n): [] for n in sizes}
    for _ in range(reps):
        for n in sizes:
            stage(f"decode {n}")
            for size, ms in target.calibrate([n], reps=1).items():
                timings[str(size)].append(ms)
    curve = {n: round(float(np.median(v)), 2) for n, v in timings.items() if v}
    llama_cpp.llama_set_n_threads(llm._ctx.ctx, own, batch)
    stage("parity")
    parity = batch_parity(target)
    target.end(prompt)
    threads = {"n_threads": own, "n_threads_batch": batch, "cpu_count": os.cpu_count(),
               "one_token_ms": one_token}
    stage("done")
    print(json.dumps({"timings_ms": {str(n): curve[str(n)] for n in PROBE_SIZES if str(n) in curve},
                      "threads": threads, "model_desc": llm._model.desc(), "context_tokens": context_tokens,
                      "parity": parity, "rpc_devices": rpc.devices() if endpoints else [],
                      "measurements": {"key": target.measurement_key, "decode_threads": chosen,
                                       "verify_ms": curve, "verify_threads": chosen}}),
          flush=True)


if __name__ == "__main__":  # the child
    _child(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 256, int(sys.argv[3]) if len(sys.argv) > 3 else 3)
