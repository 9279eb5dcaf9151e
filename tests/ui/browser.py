"""Headless Debian Chromium through Playwright, as the console's browser tests drive it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.ui.test_console import CHROMIUM

BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def chromium_page(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A page of a fresh headless Chromium, 20 s for each wait."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(20_000)
        try:
            yield page
        finally:
            browser.close()
