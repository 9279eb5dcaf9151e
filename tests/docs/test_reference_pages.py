"""The reference pages (docs/configuration.md, docs/cli.md) hold the text the code generates,
committed so that they read on a code host too: a setting or a flag changed without writing
them again fails here."""

from __future__ import annotations

from refloop.cli.docs_reference import MARKERS, ROOT, fill, stale_pages


def test_the_committed_reference_pages_are_the_codes():
    stale = stale_pages()
    assert not stale, f"{', '.join(stale)}: stale; write them again with " \
        "`.venv/bin/python -m refloop.cli.docs_reference --write`"


def test_a_block_is_filled_between_its_markers_once():
    page = (ROOT / MARKERS["cli"]).read_text()
    assert page.count("<!-- refloop:cli -->") == page.count("<!-- /refloop:cli -->") == 1
    assert "### refloop watch" in page and "| `--reason` |" in page
    lone = "intro\n\n<!-- refloop:cli -->\n\nafter\n"
    once = fill(lone)
    assert once.endswith("<!-- /refloop:cli -->\n\nafter\n") and fill(once) == once
    edited = once.replace("### refloop watch", "### refloop wotch")
    assert fill(edited) == once  # a hand edit inside the block is written over
