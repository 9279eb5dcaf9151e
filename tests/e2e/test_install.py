"""The install: `make demo`'s extras carry no PyTorch, the package data is declared (no
setuptools warning per file), and the PyTorch embedder, absent, says what to install."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HEAVY = {"torch", "sentence-transformers"}


def requirement_names(extras: list[str]) -> set[str]:
    """Distribution names the project's dependencies and these extras name, following
    `refloop[...]` inside an extra."""
    project = PYPROJECT["project"]
    lines, todo, seen = list(project["dependencies"]), list(extras), set()
    names: set[str] = set()
    while lines or todo:
        if todo:
            extra = todo.pop()
            if extra not in seen:
                seen.add(extra)
                lines += project["optional-dependencies"][extra]
            continue
        name, inner = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", lines.pop()).groups()
        if name == "refloop":
            todo += inner.split(",")
        else:
            names.add(name.lower())
    return names


def test_the_makefiles_install_has_no_pytorch():
    make = (ROOT / "Makefile").read_text()
    installed = re.search(r"pip install --quiet -e '\.\[([a-z,-]+)\]'", make)
    assert installed, "the Makefile's install line"
    extras = installed.group(1).split(",")
    assert not requirement_names(extras) & HEAVY, extras
    assert not requirement_names(["semantic"]) & HEAVY
    assert requirement_names(["minilm-torch"]) >= HEAVY | {"onnxruntime", "lancedb"}


def test_every_data_folder_is_a_declared_package():
    """setuptools warns once per file of a folder it includes as data but that is not in
    `packages` ("Package 'refloop.api.static' is absent from the `packages`
    configuration"): every folder under a package's directory that holds files is one."""
    tool = PYPROJECT["tool"]["setuptools"]
    packages = set(tool["packages"])
    dirs = tool["package-dir"]

    def folder(package: str) -> Path:
        parts = package.split(".")
        for cut in range(len(parts), 0, -1):
            mapped = dirs.get(".".join(parts[:cut]))
            if mapped is not None:
                return ROOT / mapped / Path(*parts[cut:])
        return ROOT / Path(*parts)

    undeclared = [f"{package}.{sub.name}" for package in packages
                  for sub in folder(package).iterdir()
                  if sub.is_dir() and sub.name != "__pycache__"
                  and any(p.is_file() for p in sub.iterdir())
                  and f"{package}.{sub.name}" not in packages]
    assert not undeclared, undeclared
    data = tool["package-data"]
    assert data["refloop.api.static"] == ["*"] and "refloop.scenarios" in data


def test_the_pytorch_embedder_absent_names_its_extra():
    script = r"""
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "sentence_transformers"}:
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, NoTorch())
from refloop.search.runtime import missing_extra
print(missing_extra("minilm"))
print(missing_extra("minilm-int8"))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    torch_line, default_line = done.stdout.splitlines()
    assert "missing sentence_transformers" in torch_line
    assert torch_line.endswith("pip install 'refloop[minilm-torch]'")
    assert default_line == "None" or "refloop[semantic]" in default_line
