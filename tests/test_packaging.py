"""The package list in pyproject.toml covers every Python package in the repo.

setuptools installs only the packages listed; an editable install finds the rest anyway, so a
missing entry shows only in a wheel (`pip install .`): `lookahead bench` would be missing.
"""
from __future__ import annotations

from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    dirs = config["package-dir"]
    assert listed == set(dirs), "every listed package needs its folder in package-dir"
    folders = {ROOT / folder: name for name, folder in dirs.items()}
    for folder, name in folders.items():
        for init in folder.rglob("__init__.py"):
            sub = init.parent.relative_to(folder)
            dotted = ".".join([name, *sub.parts]) if sub.parts else name
            assert dotted in listed, f"{init.parent} is the package {dotted}, missing from pyproject.toml"


def test_importing_lookahead_imports_no_backend():
    import subprocess
    import sys

    code = ("import sys, lookahead, lookahead.index, lookahead.edit, lookahead.models; "
            "print(sorted(m for m in sys.modules if m == 'llama_cpp' or m.startswith('lookahead.adapters')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # Only the exact mode's choice (an environment variable, set before any model is loaded).
    assert out.strip() == "['lookahead.adapters', 'lookahead.adapters.exact']"
    code = "import sys, lookahead; lookahead.wrap; print('lookahead.adapters.llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"  # the adapter, on first use
