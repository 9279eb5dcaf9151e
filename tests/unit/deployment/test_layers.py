"""The layer contract holds: entry points on top, workflows on the contract only, the
contract free of I/O, activities apart from workflows, no cycles; a breach of it is
caught; and one import name."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import grimp
from importlinter.application import use_cases
from importlinter.application.app_config import settings
from importlinter.configuration import configure

from tests.layers import ROOT, MappedGraphBuilder, lint, package_dirs


def test_the_layer_contract_is_kept():
    assert lint() == 0


class WithAnActivityImportingAWorkflow(MappedGraphBuilder):
    """refloop's own import graph, plus one import the layers forbid."""

    def build(self, *args, **kwargs) -> grimp.ImportGraph:
        graph = super().build(*args, **kwargs)
        assert not graph.direct_import_exists(importer="refloop.activities.tool_activities",
                                              imported="refloop.workflows.agent")
        graph.add_import(importer="refloop.activities.tool_activities",
                         imported="refloop.workflows.agent", line_number=1,
                         line_contents="from refloop.workflows.agent import AgentWorkflow")
        return graph


def test_a_breach_of_the_layers_is_caught():
    # The same contracts and graph as `lint`, one illegal edge added: the check must fail
    # on it (a contract that cannot fail would pass `test_the_layer_contract_is_kept` too).
    configure()
    settings.configure(GRAPH_BUILDER=WithAnActivityImportingAWorkflow())
    try:
        report = use_cases.create_report(
            use_cases.read_user_options(str(ROOT / "pyproject.toml")), cache_dir=None)
    finally:
        settings.configure(GRAPH_BUILDER=MappedGraphBuilder())
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    expected = {contract["name"] for contract in contracts["contracts"]
                if contract["type"] == "layers"
                or contract.get("source_modules") == ["refloop.activities"]}
    broken = {contract.name for contract, check in report.get_contracts_and_checks()
              if not check.kept}
    assert report.contains_failures
    assert len(expected) == 2 and broken == expected


def test_every_installed_package_is_under_refloop_and_exists():
    dirs = package_dirs()
    assert all(name == "refloop" or name.startswith("refloop.") for name in dirs)
    # Code packages have an __init__.py; data folders (static files, YAML) are listed as
    # packages only so setuptools ships them without a warning, and hold no code.
    assert all((folder / "__init__.py").is_file() or not any(folder.glob("*.py"))
               for folder in dirs.values())
    assert all(folder.is_dir() for folder in dirs.values())
    assert dirs["refloop.workflows"] == ROOT / "workflows"


def test_the_layer_folders_are_not_importable_as_top_level_names(tmp_path):
    # From anywhere but the repository root: `workflows` (also LlamaIndex's import name),
    # `activities`, `worker`, `api` and `cli` are not installed names.
    for name in ("workflows", "activities", "worker", "api", "cli"):
        probe = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path,
                               capture_output=True, text=True)
        assert probe.returncode != 0 and "No module named" in probe.stderr, name
    ok = subprocess.run([sys.executable, "-c", "import refloop.workflows.agent"],
                        cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_every_package_folder_is_installed():
    """A folder with an __init__.py that the package list leaves out is missing from a
    wheel and from the Dockerfile's `pip install .` (the editable install hides it)."""
    dirs = package_dirs()
    listed = set(dirs.values())
    for top in set(dirs.values()):
        for init in top.rglob("__init__.py"):
            folder = init.parent
            assert "__pycache__" not in folder.parts
            assert folder in listed, f"{folder.relative_to(ROOT)} is not in the package list"
