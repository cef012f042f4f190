"""llama.cpp's RPC backend: remote `ggml-rpc-server` hosts registered as devices before a model
loads, so that `n_gpu_layers` offloads layers to them.

llama-cpp-python 0.3.36 has no RPC argument; this does what llama.cpp's own `--rpc` does
(common/arg.cpp): find the "RPC" backend in ggml's registry, call its
`ggml_backend_rpc_add_server` for each endpoint and register the backend it returns. The
build must have RPC in it (scripts/setup.sh builds it in unless LOOKAHEAD_RPC=0). Each
endpoint is first reached over TCP with a timeout, so a host that is down is an error naming
it, not a hang.

The RPC server is unauthenticated: keep it to a trusted network.
"""
from __future__ import annotations

import ctypes
import functools
import socket
from pathlib import Path
from typing import Sequence

CONNECT_TIMEOUT_S = 3.0
_registered: set[str] = set()  # endpoints this process has registered (ggml keeps them)
# The output layer's weights, by llama.cpp's tensor names (token_embd: tied embeddings, where
# the input embedding doubles as the output layer). See `keep_output_layer_here`.
OUTPUT_LAYER_PATTERNS = (rb"^output\.weight$", rb"^token_embd\.weight$")


class RpcError(RuntimeError):
    """An RPC endpoint that is malformed, unreachable, or a build without RPC."""


class RpcServerLost(RpcError):
    """A registered RPC server went away: the layers it held are gone until the model is
    loaded again (with the server back)."""


def parse_endpoints(spec: str | Sequence[str]) -> list[str]:
    """"host:port,host:port" (or a list of them) as a list; a ValueError names a bad one."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        item = str(item).strip()
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"RPC endpoint {item!r} is not HOST:PORT (a port in 1..65535)")
        out.append(f"{host}:{int(port)}")
    if not out:
        raise ValueError(f"no RPC endpoint in {spec!r}")
    return out


def check_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Open and close a TCP connection to `endpoint`; RpcError naming it if that fails."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise RpcError(f"RPC server {endpoint} is not reachable ({e}); start `ggml-rpc-server "
                       f"--host HOST --port {port}` there, or check the address") from None


@functools.lru_cache(maxsize=1)
def _ggml() -> ctypes.CDLL:
    """The libggml that llama.cpp uses, with the registry calls typed.

    llama-cpp-python's wheel holds copies, not links: libggml.so, libggml.so.0, ... Opening
    another file than the one libllama loaded by its soname (libggml.so.0) would give a
    second copy of ggml with a registry of its own, and the model would never see the
    servers. So the soname is opened by name first (the loader hands back the loaded one)."""
    import llama_cpp  # loads libllama and, through it, libggml

    libdir = Path(llama_cpp.__file__).parent / "lib"
    candidates = ["libggml.so.0", str(libdir / "libggml.so.0"), str(libdir / "libggml.dylib"),
                  str(libdir / "ggml.dll"), str(libdir / "libggml.so")]
    for name in candidates:
        try:
            lib = ctypes.CDLL(name, mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        except OSError:
            continue
        lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
        lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
        lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.ggml_backend_register.restype = None
        lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, name).restype = ctypes.c_char_p
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_memory.restype = None
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)]
        return lib
    raise RpcError(f"no libggml found in {libdir}")


def available() -> bool:
    """Whether the installed llama.cpp build has the RPC backend."""
    try:
        return bool(_ggml().ggml_backend_reg_by_name(b"RPC"))
    except (ImportError, OSError, RpcError):
        return False


def offload_layers(n_gpu_layers: int | None) -> int:
    """The n_gpu_layers of a model split over RPC servers: as given, else -1 (every layer)."""
    return n_gpu_layers or -1


class _BuftOverride(ctypes.Structure):  # llama.h: struct llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def keep_output_layer_here() -> None:
    """Make every model loaded from now on in this process keep its output layer on this
    host's CPU, however many layers go to the RPC servers.

    Each row a pass decodes comes back as logits: 4 bytes per vocabulary entry (600 KB a row
    for a 152k vocabulary), so with the output layer on a server a 64-token draft would
    cross the network as 39 MB. Computed here, a row crosses as one hidden state (6 KB for a
    1536-wide model). llama-cpp-python 0.3.36 has no argument for llama.cpp's tensor
    overrides (`--override-tensor`), so the model parameters it starts from get them."""
    import llama_cpp.llama_cpp as low

    if getattr(low.llama_model_default_params, "lookahead_overrides", None) is not None:
        return
    cpu = ctypes.CDLL("libggml-cpu.so.0", mode=getattr(ctypes, "RTLD_GLOBAL", 0))  # the loaded copy
    cpu.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    overrides = (_BuftOverride * (len(OUTPUT_LAYER_PATTERNS) + 1))()  # NULL-terminated
    for slot, pattern in zip(overrides, OUTPUT_LAYER_PATTERNS):
        slot.pattern, slot.buft = pattern, cpu.ggml_backend_cpu_buffer_type()
    defaults = low.llama_model_default_params

    def with_overrides():
        params = defaults()
        params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p).value
        return params

    with_overrides.lookahead_overrides = overrides  # kept alive with the function
    low.llama_model_default_params = with_overrides


def lost() -> tuple[int, str]:
    """(RPC connections lost in this process, the first one's endpoint).

    lookahead's patch to llama.cpp (adapters/patches/ggml-rpc-lost-server.patch) marks a
    connection that fails as lost instead of aborting the process; a build without it, or
    without RPC, gives (0, "")."""
    fn = _lost_fn()
    if fn is None:
        return 0, ""
    buf = ctypes.create_string_buffer(256)
    return int(fn(buf, len(buf))), buf.value.decode(errors="replace")


def _rpc_proc(lib, name: bytes) -> int | None:
    """The address of `name` in ggml's RPC backend; RpcError if the build has no RPC backend,
    None if the backend has no such procedure."""
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcError("this llama-cpp-python build has no RPC backend; rebuild it with "
                       "`bash scripts/setup.sh` (without LOOKAHEAD_RPC=0)")
    return lib.ggml_backend_reg_get_proc_address(reg, name) or None


@functools.lru_cache(maxsize=1)
def _lost_fn():
    try:
        address = _rpc_proc(_ggml(), b"ggml_backend_rpc_lost")
    except (ImportError, OSError, RpcError):
        return None
    if not address:
        return None
    return ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)(address)


class LossWatch:
    """Raises RpcServerLost once a connection is lost after this watch began (see `lost`).

    Check after a decode's outputs are synchronised (llama_get_logits) and before they are
    read: on a lost connection they are zeros, not the model's."""

    def __init__(self):
        self.since = lost()[0]
        self._reported = False  # a later request fails at once, saying the loss came earlier

    def check(self) -> None:
        count, endpoint = lost()
        if count > self.since:
            when = "during an earlier request" if self._reported else "during this request"
            self._reported = True
            raise RpcServerLost(f"RPC server {endpoint or '(unknown)'} went away {when}; the layers it held "
                                "are gone. Restart it, then load the model again (restart `lookahead serve`, "
                                "or rerun the command)")


def devices() -> list[dict]:
    """The registered RPC servers' devices, as ggml lists them: name (RPC0, RPC1, ...),
    endpoint, and the memory each server reports (MiB). Asks each server for its memory."""
    lib = _ggml()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        name = (lib.ggml_backend_dev_name(dev) or b"").decode()
        if not name.startswith("RPC"):
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append({"name": name, "endpoint": (lib.ggml_backend_dev_description(dev) or b"").decode(),
                    "free_mib": free.value >> 20, "total_mib": total.value >> 20})
    return out


def registered() -> list[str]:
    """The endpoints this process has registered (ggml keeps them until it exits)."""
    return sorted(_registered)


def register(endpoints: str | Sequence[str], timeout: float = CONNECT_TIMEOUT_S) -> list[str]:
    """Register each RPC server's devices with ggml (once per endpoint per process), and keep
    the output layer of models loaded later here (`keep_output_layer_here`); returns the
    endpoints. Call before the model loads, and load it with n_gpu_layers > 0."""
    endpoints = parse_endpoints(endpoints)
    for endpoint in endpoints:
        check_reachable(endpoint, timeout)
    lib = _ggml()
    add = _rpc_proc(lib, b"ggml_backend_rpc_add_server")
    if not add:
        raise RpcError("the RPC backend of this build has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    for endpoint in endpoints:
        if endpoint in _registered:
            continue
        server_reg = add_server(endpoint.encode())
        if not server_reg:
            raise RpcError(f"RPC server {endpoint} did not answer as a ggml-rpc-server")
        lib.ggml_backend_register(server_reg)
        _registered.add(endpoint)
    keep_output_layer_here()
    return endpoints
