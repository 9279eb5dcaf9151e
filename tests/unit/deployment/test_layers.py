"""The layer contract holds: entry points on top, workflows on the contract only, the
contract free of I/O, activities apart from workflows, no cycles; and one import name."""

from __future__ import annotations

import subprocess
import sys

from tests.layers import ROOT, lint, package_dirs


def test_the_layer_contract_is_kept():
    assert lint() == 0


def test_every_installed_package_is_under_refloop_and_exists():
    dirs = package_dirs()
    assert all(name == "refloop" or name.startswith("refloop.") for name in dirs)
    assert all((folder / "__init__.py").is_file() for folder in dirs.values())
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
