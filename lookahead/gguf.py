"""Reading a GGUF file's header: its metadata and the weight formats of its tensors.

Enough of the GGUF format (version 2 and 3) to check a model file before llama.cpp loads it,
without mapping the weights: the key-value metadata and the tensor table, read sequentially
from the start of the file. Written here rather than taken from the `gguf` package because
these checks need the header only, and must run before anything else of the file is trusted.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)

# Value types of the metadata (gguf_type in ggml's gguf.h).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# Arrays longer than this (a tokenizer's vocabulary) are skipped, not kept: only scalars and
# short lists are ever checked.
_KEEP_ARRAY_ITEMS = 64

# ggml_type ids of tensor formats (ggml.h), for naming what a model is made of.
TENSOR_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
                10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 30: "BF16"}
# llama_ftype ids of general.file_type (llama.h): the format a file was quantized to.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


class GGUFError(ValueError):
    """A file that is not a readable GGUF model, with the path and what is wrong."""


@dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensor_types: dict[str, int] = field(default_factory=dict)  # format name -> tensor count

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", ""))

    @property
    def block_count(self) -> int | None:
        value = self.metadata.get(f"{self.architecture}.block_count")
        return int(value) if value is not None else None

    @property
    def file_type(self) -> str:
        """The quantization the file was made with (e.g. "Q4_K_M"), or "" if not recorded."""
        ftype = self.metadata.get("general.file_type")
        return FILE_TYPES.get(int(ftype), f"type {ftype}") if ftype is not None else ""

    @property
    def quantized_formats(self) -> list[str]:
        """The weight formats of the tensors, most used first, F32 and F16 left out."""
        kept = {k: v for k, v in self.tensor_types.items() if k not in ("F32", "F16")}
        return sorted(kept, key=lambda k: -kept[k])


class _Reader:
    def __init__(self, f: BinaryIO, path: str):
        self.f, self.path = f, path

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise GGUFError(f"{self.path!r} ends inside its GGUF header (a truncated or damaged file)")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 24:
            raise GGUFError(f"{self.path!r}: a GGUF string of {n} bytes (a damaged header)")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALARS and count > _KEEP_ARRAY_ITEMS:
                self.f.seek(count * struct.calcsize(_SCALARS[item_type]), os.SEEK_CUR)
                return None
            items = [self.value(item_type) for _ in range(count)]
            return items if count <= _KEEP_ARRAY_ITEMS else None
        raise GGUFError(f"{self.path!r}: unknown GGUF value type {vtype} (a damaged header)")


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """The metadata and tensor formats of the GGUF at `path`; GGUFError if it is not one."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            r = _Reader(f, p)
            magic = f.read(4)
            if magic != MAGIC:
                raise GGUFError(f"not a GGUF model: {p!r} starts with {magic!r}, expected {MAGIC!r}")
            version = r.unpack("<I")
            if version not in SUPPORTED_VERSIONS:
                raise GGUFError(f"{p!r} is GGUF version {version}; supported: {SUPPORTED_VERSIONS}")
            n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
            metadata = {}
            for _ in range(n_kv):
                key = r.string()
                metadata[key] = r.value(r.unpack("<I"))
            tensor_types: dict[str, int] = {}
            for _ in range(n_tensors):
                r.string()  # name
                n_dims = r.unpack("<I")
                r.take(8 * n_dims)  # dims
                ttype = r.unpack("<I")
                r.take(8)  # offset
                name = TENSOR_TYPES.get(ttype, f"type {ttype}")
                tensor_types[name] = tensor_types.get(name, 0) + 1
    except OSError as e:
        raise GGUFError(f"cannot read {p!r}: {e.strerror}") from e
    return GGUFHeader(version, metadata, tensor_types)
