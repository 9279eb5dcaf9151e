"""`import openai` without importing the whole API's types.

The SDK's generated `openai.types` packages re-export every model of the API (about a
thousand pydantic classes) from their `__init__`, and `import openai` imports them all: half
a CPU-second, a quarter of a fresh worker's way to its first model request. refloop uses a
handful (chat completions). This finder imports such a package without running its
`__init__`; each re-exported name is imported from its own module on first use (PEP 562
`__getattr__`), so `openai.types.chat.ChatCompletion` and `from openai.types import Batch`
work as before. A package whose `__init__` does anything but re-export from its own modules
is imported as written.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

LAZY_PACKAGES = ("openai.types",)


def reexports(source: str) -> dict[str, tuple[str, str]] | None:
    """{exported name: (submodule, its name there)} when `source` (a package `__init__`)
    only re-exports from its own submodules (`from .chat import X as X`), else None."""
    names: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if not (isinstance(node, ast.ImportFrom) and node.level == 1 and node.module):
            return None
        for alias in node.names:
            if alias.name == "*":
                return None
            names[alias.asname or alias.name] = (node.module, alias.name)
    return names


class _ReexportsOnFirstUse(importlib.abc.Loader):
    def __init__(self, names: dict[str, tuple[str, str]]) -> None:
        self.names = names

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object; its __path__ comes from the spec

    def exec_module(self, module: ModuleType) -> None:
        names = self.names

        def __getattr__(attr: str) -> Any:
            if attr not in names:
                raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}")
            submodule, original = names[attr]
            source = importlib.import_module(f".{submodule}", module.__name__)
            try:
                value = getattr(source, original)
            except AttributeError:  # `from .pkg import submodule`
                value = importlib.import_module(f".{submodule}.{original}", module.__name__)
            setattr(module, attr, value)
            return value

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__dir__ = lambda: sorted(set(module.__dict__) | set(names))  # type: ignore[method-assign]


class LazyReexportFinder(importlib.abc.MetaPathFinder):
    """Imports the re-export-only packages under `prefixes` lazily (see the module doc)."""

    def __init__(self, prefixes: Sequence[str]) -> None:
        self.prefixes = tuple(prefixes)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not any(fullname == p or fullname.startswith(p + ".") for p in self.prefixes):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.submodule_search_locations is None or not spec.origin:
            return None  # a plain module: the normal import
        try:
            with open(spec.origin, encoding="utf-8") as file:
                names = reexports(file.read())
        except (OSError, SyntaxError, ValueError):
            return None
        if names is None:
            return None
        spec.loader = _ReexportsOnFirstUse(names)
        return spec


def install() -> None:
    """Once per process, before openai is imported; a no-op after that."""
    if "openai" in sys.modules or any(isinstance(f, LazyReexportFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, LazyReexportFinder(LAZY_PACKAGES))
