"""Test-wide constants."""

import os

BASE_DATABASE_URL = os.environ.get(
    "REFLOOP_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def per_worker_url(url: str) -> str:
    """Under pytest-xdist each worker process gets its own database (`<name>_gw0`, ...), made
    on demand by tests/conftest.py: tests that count rows never see another worker's."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return url
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.set(database=f"{parsed.database}_{worker}").render_as_string(
        hide_password=False)


TEST_DATABASE_URL = per_worker_url(BASE_DATABASE_URL)
