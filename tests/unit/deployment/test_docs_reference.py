"""The configuration and command-line pages are generated from the code: every setting and
every command and option is on them, each with its meaning."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from refloop.cli.docs_reference import cli_markdown, on_page_markdown, settings_markdown
from refloop.cli.main import build_parser
from refloop.settings import Settings

ROOT = Path(__file__).parents[3]


def test_every_setting_is_a_row_with_a_meaning():
    table = settings_markdown()
    for name in Settings.model_fields:
        assert f"`{name.upper()}`" in table, name
    rows = [re.split(r"(?<!\\)\|", line)[1:-1] for line in table.splitlines()
            if line.startswith("| `")]
    assert rows and all(len(cells) == 4 for cells in rows)
    for cells in rows:  # a setting added without a comment in refloop/settings.py fails here
        assert cells[3].strip(), f"no meaning: {cells[0]}"


def test_every_command_and_option_is_in_the_reference():
    text = cli_markdown()
    sub = next(a for a in build_parser()._actions  # noqa: SLF001
               if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    assert set(sub.choices) >= {"run", "up", "api", "worker", "mcp", "review", "eval",
                                "history", "replay", "move", "rewind", "fork", "scripted-llm"}
    for name, parser in sub.choices.items():
        assert f"### refloop {name}" in text and f"[`refloop {name}`](#refloop-{name})" in text
        for action in parser._actions:  # noqa: SLF001
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in text or f", {option}" in text, (name, option)
    assert "--approval-mode" in text


def test_the_site_runs_the_generator_on_the_pages_that_ask_for_it():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "cli/docs_reference.py" in config["hooks"]
    nav = {page for entry in config["nav"] for page in entry.values()}
    pages = {"configuration.md": "<!-- refloop:settings -->", "cli.md": "<!-- refloop:cli -->"}
    for page, marker in pages.items():
        assert page in nav and marker in (ROOT / "docs" / page).read_text()
        built = on_page_markdown((ROOT / "docs" / page).read_text())
        # the generated text between the markers (HTML comments, not shown), written once
        assert "| --- |" in built and on_page_markdown(built) == built
