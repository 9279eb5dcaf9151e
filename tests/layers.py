"""The layer contract ([tool.importlinter] in pyproject.toml), checked by import-linter
over refloop as installed: the layers keep their top-level folders and install as
`refloop.workflows`, `refloop.api`... (setuptools' package-dir map), which grimp's
directory walk cannot follow. So this builds the same import graph from the package-dir
map and hands it to import-linter's own contracts.

`python -m tests.layers` prints import-linter's report and exits non-zero on a breach.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp
from importlinter import cli
from importlinter.application.app_config import settings
from importlinter.application.ports.building import GraphBuilder
from importlinter.configuration import configure

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, Path]:
    """Each installed package and the folder it comes from (pyproject's package-dir)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {name: ROOT / folder for name, folder in config["package-dir"].items()}
    dirs = {}
    for package in config["packages"]:
        parent = max((name for name in mapped if package == name or
                      package.startswith(name + ".")), key=len)
        dirs[package] = mapped[parent].joinpath(*package[len(parent):].split(".")[1:])
    return dirs


def modules() -> Iterator[tuple[str, Path]]:
    for package, folder in package_dirs().items():
        for path in sorted(folder.glob("*.py")):
            yield (package if path.stem == "__init__" else f"{package}.{path.stem}"), path


def imports_of(module: str, path: Path) -> Iterator[tuple[str, int, str]]:
    """(imported name, line, source line) of every import in the file, relative ones
    resolved; a `from X import Y` names X.Y (a submodule or not: resolved later)."""
    source = path.read_text()
    lines = source.splitlines()
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, lines[node.lineno - 1].strip()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno, lines[node.lineno - 1].strip()


class MappedGraphBuilder(GraphBuilder):
    """grimp's graph of refloop, with modules found through the package-dir map."""

    def build(self, root_package_names: list[str], cache_dir: str | None,
              include_external_packages: bool = False,
              exclude_type_checking_imports: bool = False) -> grimp.ImportGraph:
        graph = grimp.ImportGraph()
        found = dict(modules())
        externals: set[str] = set()
        for module in found:
            graph.add_module(module)
        roots = tuple(root_package_names)
        for module, path in found.items():
            for name, line, text in imports_of(module, path):
                target = name
                while target and target not in found and target.startswith(roots):
                    target = target.rpartition(".")[0]  # `from pkg import name`: pkg
                if target.startswith(roots) and target in found:
                    graph.add_import(importer=module, imported=target, line_number=line,
                                     line_contents=text)
                elif include_external_packages and not target.startswith(roots):
                    external = name.split(".")[0]
                    if external not in externals:
                        externals.add(external)
                        graph.add_module(external, is_squashed=True)
                    graph.add_import(importer=module, imported=external, line_number=line,
                                     line_contents=text)
        return graph


def lint(config_filename: str | None = None) -> int:
    configure()
    settings.configure(GRAPH_BUILDER=MappedGraphBuilder())
    return cli.lint_imports(config_filename=config_filename or str(ROOT / "pyproject.toml"),
                            no_cache=True, no_logo=True)


if __name__ == "__main__":
    sys.exit(lint(sys.argv[1] if len(sys.argv) > 1 else None))
