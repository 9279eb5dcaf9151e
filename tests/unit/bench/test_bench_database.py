"""Benches never touch a real database: an operator ran `python -m bench.bench_hosts` with
DATABASE_URL naming the real one, and the bench registered host0 and host1 in its hosts
table."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common import BENCH_DATABASE_ENV, bench_settings

REAL = "postgresql+psycopg://refloop:secret@db.example:5432/refloop"


def test_a_bench_run_under_an_operators_database_url_uses_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DATABASE_URL", REAL)
    monkeypatch.delenv(BENCH_DATABASE_ENV, raising=False)
    url = bench_settings(tmp_path / "shared").effective_database_url
    assert url == f"sqlite:///{(tmp_path / 'shared' / 'refloop.db').resolve()}"


def test_a_bench_told_its_database_uses_that_one(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DATABASE_URL", REAL)
    told = "postgresql+psycopg://postgres@127.0.0.1:5432/bench"
    monkeypatch.setenv(BENCH_DATABASE_ENV, told)
    assert bench_settings(tmp_path).effective_database_url == told

