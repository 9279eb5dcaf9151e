"""Semantic search needs the `semantic` extra (installed by `make test`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from refloop.search.runtime import missing_extra

FIXTURES = Path(__file__).parent.parent / "fixtures"
QUERIES = yaml.safe_load((FIXTURES / "semantic_queries.yaml").read_text())

if missing_extra():
    pytest.skip(missing_extra(), allow_module_level=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A private copy of the fixture repo, free to edit."""
    return Path(shutil.copytree(FIXTURES / "semantic_repo", tmp_path / "repo"))
