#!/usr/bin/env python3
"""Print the CMake arguments for a llama-cpp-python build that runs on *this* machine.

llama-cpp-python compiles llama.cpp with `-march=native` by default. On some virtual machines
the CPU reports AMX (Intel Sapphire Rapids and later) but the AMX instructions fault, and
a native build then dies with SIGSEGV or SIGILL on the first batched decode. So on x86-64
this script does not trust the CPU's report: for each instruction set llama.cpp can use, it
compiles a tiny program with that set and runs it, and only the sets whose program exits
cleanly are turned on, with `-DGGML_NATIVE=OFF`. AMX is never turned on here; opt in with
CMAKE_ARGS (see the README).

On other architectures (ARM, Apple) the native build is kept: nothing of the kind has been
seen there. Standard library only: it runs before the virtual environment has anything.

Usage: python3 adapters/cmake_args.py [--explain]   (or: python -m lookahead.adapters.cmake_args)
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile

# One entry per llama.cpp option: (option, compiler flags, options it needs, C body using it).
# Each body computes something from `seed` (volatile) so the compiler cannot fold it away,
# and returns 0 when the instructions ran and gave the right answer.
X86_FEATURES: list[tuple[str, list[str], list[str], str]] = [
    ("GGML_SSE42", ["-msse4.2"], [],
     "unsigned c = _mm_crc32_u32(0u, (unsigned)seed); return c == 0u;"),
    ("GGML_AVX", ["-mavx"], [],
     "__m256 a = _mm256_set1_ps((float)seed); a = _mm256_add_ps(a, a);"
     "return _mm256_cvtss_f32(a) != 2.0f * seed;"),
    ("GGML_F16C", ["-mf16c"], ["GGML_AVX"],
     "__m128i h = _mm_set1_epi16(0x3c00 + (short)(seed - 1)); __m128 f = _mm_cvtph_ps(h);"
     "return _mm_cvtss_f32(f) != 1.0f;"),
    ("GGML_FMA", ["-mfma"], ["GGML_AVX"],
     "__m256 a = _mm256_set1_ps((float)seed); a = _mm256_fmadd_ps(a, a, a);"
     "return _mm256_cvtss_f32(a) != 2.0f;"),
    ("GGML_BMI2", ["-mbmi2"], [],
     "return _pdep_u32((unsigned)seed, 0xF0u) != 0x10u;"),
    ("GGML_AVX2", ["-mavx2"], ["GGML_AVX"],
     "__m256i a = _mm256_set1_epi32(seed); a = _mm256_add_epi32(a, a);"
     "return _mm256_extract_epi32(a, 7) != 2 * seed;"),
    ("GGML_AVX_VNNI", ["-mavxvnni"], ["GGML_AVX2"],
     "__m256i a = _mm256_set1_epi8((char)seed); __m256i z = _mm256_setzero_si256();"
     "z = _mm256_dpbusd_avx_epi32(z, a, a); return _mm256_extract_epi32(z, 0) != 4 * seed * seed;"),
    ("GGML_AVX512", ["-mavx512f", "-mavx512cd", "-mavx512vl", "-mavx512dq", "-mavx512bw"], ["GGML_AVX2"],
     "__m512i a = _mm512_set1_epi16((short)seed); a = _mm512_add_epi16(a, a);"
     "return _mm512_reduce_add_epi32(a) != 16 * (2 * seed + (2 * seed << 16));"),
    ("GGML_AVX512_VBMI", ["-mavx512vbmi"], ["GGML_AVX512"],
     "__m512i a = _mm512_set1_epi8((char)seed); a = _mm512_permutexvar_epi8(a, a);"
     "return _mm512_reduce_add_epi32(a) != 16 * 0x01010101 * seed;"),
    ("GGML_AVX512_VNNI", ["-mavx512vnni"], ["GGML_AVX512"],
     "__m512i a = _mm512_set1_epi8((char)seed); __m512i z = _mm512_setzero_si512();"
     "z = _mm512_dpbusd_epi32(z, a, a); return _mm512_reduce_add_epi32(z) != 16 * 4 * seed * seed;"),
    ("GGML_AVX512_BF16", ["-mavx512bf16"], ["GGML_AVX512"],
     "__m512 a = _mm512_set1_ps((float)seed); __m512bh b = (__m512bh)_mm512_castsi256_si512((__m256i)"
     "_mm512_cvtneps_pbh(a)); __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), b, b);"
     "return _mm512_reduce_add_ps(d) < 0.0f;"),
]
# Options llama.cpp would take from -march=native that are never turned on here.
X86_NEVER = ["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"]

PROGRAM = """#include <immintrin.h>
int main(void) {{ volatile int seed_v = 1; int seed = seed_v; {body} }}
"""


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def _runs(cc: str, flags: list[str], body: str, workdir: str) -> tuple[bool, str]:
    """Compile `body` with `flags` and run it: (ran correctly, why not)."""
    src = os.path.join(workdir, "probe.c")
    exe = os.path.join(workdir, "probe")
    with open(src, "w") as f:
        f.write(PROGRAM.format(body=body))
    build = subprocess.run([cc, "-O1", *flags, src, "-o", exe], capture_output=True, text=True)
    if build.returncode != 0:
        return False, "the compiler does not support it"
    try:
        run = subprocess.run([exe], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False, "the probe hung"
    if run.returncode < 0:
        return False, f"the probe died by signal {-run.returncode} (the CPU reports it but it does not execute)"
    if run.returncode != 0:
        return False, "the probe gave a wrong result"
    return True, ""


def x86_args(explain: bool = False) -> list[str]:
    cc = _compiler()
    if cc is None:  # pip's build will fail anyway without a compiler; say nothing here
        return []
    enabled: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="lookahead-cpu-") as workdir:
        for option, flags, needs, body in X86_FEATURES:
            if not all(n in enabled for n in needs):
                ok, why = False, f"needs {', '.join(n for n in needs if n not in enabled)}"
            else:
                all_flags = [f for n in needs for f in enabled[n]] + flags
                ok, why = _runs(cc, all_flags, body, workdir)
            if ok:
                enabled[option] = [f for n in needs for f in enabled[n]] + flags
            if explain:
                print(f"  {option:18s} {'on' if ok else 'off: ' + why}", file=sys.stderr)
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{option}={'ON' if option in enabled else 'OFF'}" for option, *_ in X86_FEATURES]
    args += [f"-D{option}=OFF" for option in X86_NEVER]
    return args


def cmake_args(explain: bool = False) -> list[str]:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i686", "i386"):
        args = x86_args(explain)
    else:
        args = []  # keep llama.cpp's native build
        if explain:
            print(f"  {machine}: llama.cpp's native build", file=sys.stderr)
    # The multimodal library is not used by lookahead and doubles the build time.
    return args + ["-DLLAVA_BUILD=OFF"]


if __name__ == "__main__":
    print(" ".join(cmake_args(explain="--explain" in sys.argv)))
