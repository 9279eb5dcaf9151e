"""`refloop fleet-rate`: the operator's way to change the fleet's model-call rate limit,
which a worker cannot change alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from refloop.cli.main import fleet_rate
from refloop.settings import Settings
from refloop.store.db import store_for
from refloop.store.fleet import fleet_llm_rate


def test_the_operator_sets_shows_and_lifts_the_fleets_rate(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture):
    settings = Settings(refloop_data_dir=tmp_path, database_url=None)
    store = store_for(settings.effective_database_url)
    assert fleet_rate("2", settings) == 0
    assert fleet_llm_rate(store, settings.task_queue, None, "worker") == 2.0
    assert fleet_rate(None, settings) == 0
    assert "model calls 2 a second" in capsys.readouterr().out
    for bad in ("0", "-1", "fast"):
        assert fleet_rate(bad, settings) == 2
    assert fleet_rate("off", settings) == 0
    assert fleet_llm_rate(store, settings.task_queue, None, "worker") is None
