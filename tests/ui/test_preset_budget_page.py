"""A system prompt's default spend limit in the console, in a real headless Chromium: the
prompts page's form sets it (the badge says it, the API stores it), and clears it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.ui.browser import chromium_page
from tests.ui.test_console import CHROMIUM, console_and_model

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
    "browser tests skipped")


def test_a_prompts_default_limit_is_set_and_cleared_in_its_form(tmp_path: Path):
    from playwright.sync_api import expect

    with console_and_model(tmp_path, REFLOOP_SEMANTIC_INDEX="false") as (console, _), \
            chromium_page() as page:
        page.goto(f"{console}/ui/prompts.html")
        page.get_by_role("button", name="New system prompt").click()
        page.get_by_label("Name").fill("frugal")
        page.get_by_role("textbox", name="System prompt").fill("You are brief.")
        page.get_by_label("Default spend limit").fill("2.5")
        page.get_by_label("Default token limit").fill("100000")
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_text("limit $2.5, 100000 tokens")).to_be_visible()
        stored = httpx.get(f"{console}/prompts", timeout=30).json()
        assert [(p["max_cost_usd"], p["max_tokens"]) for p in stored] == [(2.5, 100000)]
        # Emptied: no default any more
        page.get_by_role("button", name="Edit").click()
        expect(page.get_by_label("Default token limit")).to_have_value("100000")
        page.get_by_label("Default spend limit").fill("")
        page.get_by_label("Default token limit").fill("")
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_text("limit $2.5")).to_have_count(0)
        stored = httpx.get(f"{console}/prompts", timeout=30).json()
        assert [(p["max_cost_usd"], p["max_tokens"]) for p in stored] == [(None, None)]
