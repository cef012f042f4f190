"""What the `lookahead` commands share: model options, model resolution and loading, exit codes."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
THREADS_HELP = ("CPU threads for llama.cpp (one-token and batch decodes). Default: llama-cpp-python's "
                "(half the CPUs for one-token decodes, all for batches); lookahead then times both counts "
                "for one-token decodes and keeps the faster.")


EXACT_HELP = ("On by default: batched decodes compute exactly what one-token decodes would, so greedy "
              "output with speculation is plain decoding's, token for token. Needs the set-up's patched "
              "llama.cpp on an x86 CPU with AVX2; `lookahead doctor` checks it, "
              "and --stats/--json say whether a run was exact. --no-exact: llama.cpp's stock kernels "
              "(greedy output can then part from plain decoding's at a near-tie). Sets "
              "LOOKAHEAD_EXACT_BATCHES (default: that variable's value, else on).")


def _exact_batches(ctx: click.Context, param: click.Parameter, value: bool | None) -> None:
    """--exact/--no-exact: set the variable the patched llama.cpp reads at its first model load
    and first product, before any model is loaded (the commands load theirs after parsing)."""
    if value is None:
        return
    from lookahead.adapters import exact
    from lookahead.adapters.health import exact_batches_available

    if value and not exact_batches_available():
        raise click.BadParameter("this llama-cpp-python build lacks lookahead's llama.cpp patches; build it "
                                 "with scripts/setup.sh", param_hint="--exact")
    try:
        exact.set_for_process(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--exact/--no-exact") from None


FLASH_ATTN_HELP = ("llama.cpp's flash attention (on by default, as in llama.cpp's own tools): the prompt's "
                   "prefill costs less. Exact with the set-up's build either way; greedy output differs "
                   "between the two settings at near-ties.")
FLASH_ATTN_META = "lookahead.flash_attn"


def _kept_flag(decls: str, meta: str, default: bool, help: str) -> Callable:
    """A --x/--no-x option whose value is kept in the command's context (not passed to it), for
    `_kept_setting(meta, default)` to read wherever the model is loaded."""
    def keep(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        ctx.meta[meta] = value

    return click.option(decls, default=default, show_default=True, expose_value=False, callback=keep, help=help)


def _kept_setting(meta: str, default: bool) -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx.meta.get(meta, default)) if ctx is not None else default


def flash_attn_option(help: str = FLASH_ATTN_HELP) -> Callable:
    """--flash-attn/--no-flash-attn (default on); `flash_attn_setting()` gives its value."""
    return _kept_flag("--flash-attn/--no-flash-attn", FLASH_ATTN_META, True, help)


def flash_attn_setting() -> bool:
    """--flash-attn/--no-flash-attn as this command was given it (default: on)."""
    return _kept_setting(FLASH_ATTN_META, True)


MMAP_HELP = ("Map the model file instead of reading it (off by default): mapped weights load faster and share the "
             "page cache, but stay on 4 KiB pages, and a one-token decode, which streams all of them, runs slower "
             "than from read weights on 2 MiB pages (8% for the default model on a 2-vCPU EPYC).")
MMAP_META = "lookahead.mmap"


def mmap_setting() -> bool:
    """--mmap/--no-mmap as this command was given it (default: off, as lookahead.load)."""
    return _kept_setting(MMAP_META, False)


RPC_HELP = ("Split the model across llama.cpp RPC servers (.venv/bin/ggml-rpc-server on each host, built by "
            "scripts/setup.sh). Their devices are registered before the model loads, and "
            "--gpu-layers then defaults to -1 (all layers on them). Each is reached first: one that is down is "
            "an error naming it. The RPC server is unauthenticated: use it on a trusted network only.")
RPC_META = "lookahead.rpc"


def _rpc_endpoints(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--rpc: the endpoints, checked now (format, reachable); registered by llama_settings, when
    the command is about to load its model."""
    if not value:
        return
    from lookahead.adapters.llama_cpp import rpc

    try:
        endpoints = rpc.parse_endpoints(value)
        for endpoint in endpoints:
            rpc.check_reachable(endpoint)
    except (ValueError, rpc.RpcError) as e:
        raise click.BadParameter(str(e), param_hint="--rpc") from None
    ctx.meta[RPC_META] = endpoints


def rpc_option(help: str = RPC_HELP) -> Callable:
    """--rpc HOST:PORT[,...]: checked while parsing; `rpc_endpoints()` gives the endpoints."""
    return click.option("--rpc", metavar="HOST:PORT[,HOST:PORT...]", default=None, expose_value=False,
                        callback=_rpc_endpoints, help=help)


def rpc_endpoints() -> list[str]:
    """The endpoints --rpc gave this command (checked reachable), or []."""
    ctx = click.get_current_context(silent=True)
    return list(ctx.meta.get(RPC_META) or []) if ctx is not None else []


def model_options(tree_width: bool = True) -> Callable:
    """--model, --n-ctx, --threads, --gpu-layers, --rpc, --exact, --flash-attn, --mmap (and --tree-width), in
    this order in --help."""
    options = [
        model_option(),
        click.option("--n-ctx", type=click.IntRange(min=64), default=4096, show_default=True,
                     help="Context window in tokens (prompt + output)."),
        click.option("--threads", type=click.IntRange(min=1), default=None, help=THREADS_HELP),
        click.option("--gpu-layers", type=click.IntRange(min=-1), default=0, show_default=True,
                     help="Layers to offload to a GPU build of llama.cpp or to --rpc servers (-1: all)."),
        rpc_option(),
        click.option("--exact/--no-exact", default=None, expose_value=False, callback=_exact_batches,
                     help=EXACT_HELP),
        flash_attn_option(),
        _kept_flag("--mmap/--no-mmap", MMAP_META, False, MMAP_HELP),
    ]
    if tree_width:
        options.append(click.option(
            "--tree-width", type=click.IntRange(1, 8), default=1, show_default=True,
            help="Branches one decode may verify where earlier occurrences continue differently "
                 "(llama.cpp sequence ids). The cost model uses them only when a wider batch pays: "
                 "rarely on a CPU, more on a GPU."))

    def decorate(f):
        for option in reversed(options):  # decorators apply bottom-up; keep --help in this order
            f = option(f)
        return f

    return decorate


MODEL_HELP = ("A model name or a GGUF file: qwen2.5-coder-1.5b (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the default), "
              "smollm2-135m (SmolLM2-135M-Instruct Q4_1: tiny, for quick tries), or PATH. `lookahead models` lists "
              "what is installed. Default: $LOOKAHEAD_MODEL, else qwen2.5-coder-1.5b.")


def model_option(help: str = MODEL_HELP) -> Callable:
    """--model NAME|PATH (its value is kept as given; resolve_model turns it into a file)."""
    return click.option("--model", "model_path", metavar="NAME|PATH", default=None, help=help)


def resolve_model(model: str | Path | None) -> Path:
    """The GGUF for a model name, a path, or None ($LOOKAHEAD_MODEL, else the default model);
    BadParameter naming the model otherwise."""
    from lookahead.models import ModelError, resolve

    try:
        return resolve(model)
    except ModelError as e:
        raise click.BadParameter(str(e), param_hint="--model") from None


def llama_settings(n_ctx: int, threads: int | None, gpu_layers: int) -> dict[str, Any]:
    """llama_cpp.Llama keyword arguments for the model options (threads: None = its defaults).
    With --rpc, registers its servers first (the model loads next) and offloads every layer
    unless --gpu-layers says how many."""
    endpoints = rpc_endpoints()
    if endpoints:
        from lookahead.adapters.llama_cpp import rpc

        try:
            rpc.register(endpoints)
        except rpc.RpcError as e:
            raise click.ClickException(str(e)) from None
        gpu_layers = rpc.offload_layers(gpu_layers)
    settings: dict[str, Any] = dict(n_ctx=n_ctx, n_gpu_layers=gpu_layers, flash_attn=flash_attn_setting(),
                                    use_mmap=mmap_setting(), verbose=False)
    if threads is not None:
        settings.update(n_threads=threads, n_threads_batch=threads)
    return settings


def load_wrapped(model_path: Path | None, n_ctx: int, threads: int | None, gpu_layers: int,
                 tree_width: int = 1, **wrapper: Any):
    """Resolve the model and load it wrapped (lookahead.load); ClickException if that fails."""
    import lookahead
    from lookahead.adapters.health import BackendCrash

    path = resolve_model(model_path)
    try:
        fast = lookahead.load(path, tree_width=tree_width, **llama_settings(n_ctx, threads, gpu_layers), **wrapper)
    except BackendCrash as e:
        raise click.ClickException(str(e)) from None
    except ValueError as e:  # llama-cpp-python: "Failed to load model from file: ..."
        raise click.ClickException(f"cannot load model {str(path)!r}: {e}") from None
    announce_calibration(fast)
    return fast


def announce_calibration(fast: Any) -> None:
    """Say on stderr that the first request will time this machine's decodes, when it will:
    a one-off cost (about 1 s on the default model, 2 CPUs) that is then kept for later runs."""
    from lookahead.cache import cache_dir, enabled

    if fast.speculate and fast.cost.needs_calibration:
        kept = f"kept in {cache_dir()} for later runs" if enabled() else "not kept: LOOKAHEAD_NO_CACHE is set"
        click.echo("lookahead: first run of this model, build and thread setting here: the first request times "
                   f"decodes of 1 to 16 tokens once (about a second), {kept}.", err=True)


def dist_version(dist: str) -> str | None:
    """The installed version of a distribution (e.g. "llama-cpp-python"), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
