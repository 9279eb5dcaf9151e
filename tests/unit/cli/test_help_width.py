"""`refloop --help` and every subcommand's `--help` fit an 80-column terminal."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from refloop.cli.main import build_parser

WIDTH = 80


def helps(parser: argparse.ArgumentParser, name: str = "refloop"
          ) -> Iterator[tuple[str, str]]:
    yield name, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from helps(sub, f"{name} {sub_name}")


def test_every_help_fits_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))  # argparse wraps to the terminal's width
    shown = dict(helps(build_parser()))
    assert len(shown) > 10 and "refloop rewind" in shown
    too_wide = {name: [line for line in text.splitlines() if len(line) > WIDTH]
                for name, text in shown.items()}
    assert not {name: lines for name, lines in too_wide.items() if lines}
