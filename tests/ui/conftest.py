"""The browser tests' console: `refloop up` on free ports with the scripted model."""

from __future__ import annotations

import pytest

from tests.ui.test_console import running_console


@pytest.fixture
def console(tmp_path):
    with running_console(tmp_path) as base:
        yield base
