"""Test-wide constants."""

import os

TEST_DATABASE_URL = os.environ.get(
    "REFLOOP_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
