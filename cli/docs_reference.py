"""The documentation's reference pages, generated from the code so they cannot drift: the
settings table from `refloop.settings.Settings` (each field's comment in its source is its
meaning) and the command reference from `refloop.cli.main.build_parser`.

The generated text is committed between `<!-- refloop:settings -->` (or `refloop:cli`) and
its closing `<!-- /refloop:settings -->`, so the pages read on a code host too;
`python -m refloop.cli.docs_reference --write` writes it again after a change, and
tests/docs/test_reference_pages.py fails while a page is stale. MkDocs also runs this file
as a hook (mkdocs.yml `hooks:`), so a built site always has the code's text.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import re
import sys
from pathlib import Path
from typing import Any

MARKERS = {"settings": "docs/configuration.md", "cli": "docs/cli.md"}  # name: its page
ROOT = Path(__file__).resolve().parents[1]
USAGE_WIDTH = 90  # usage lines wrap here, whatever the terminal that writes the page


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _field_comments(source: str, class_name: str) -> dict[str, tuple[str | None, str | None]]:
    """{field: (section heading, its own comment or None)} from the class's source. The
    comment lines right above a field (and its trailing one) say what it means; a field
    with none shares the meaning of the field above it. A first comment line of at most
    three plain words is the heading of the fields below it."""
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(node for node in tree.body
               if isinstance(node, ast.ClassDef) and node.name == class_name)
    out: dict[str, tuple[str | None, str | None]] = {}
    heading, last_end = None, cls.body[0].lineno - 1
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            last_end = node.end_lineno or node.lineno
            continue
        texts = [line.strip()[1:].strip() for line in lines[last_end:node.lineno - 1]
                 if line.strip().startswith("#")]
        if texts and len(texts[0].split()) <= 3 and re.fullmatch(r"[A-Za-z ]+", texts[0]):
            heading, texts = texts[0], texts[1:]
        trailing = lines[node.lineno - 1].split("  # ", 1)
        if len(trailing) > 1:
            texts.append(f"({trailing[1].strip()})" if texts else trailing[1].strip())
        out[node.target.id] = (heading, " ".join(texts) or None)
        last_end = node.end_lineno or node.lineno
    return out


def _default(field: Any) -> str:
    if field.default_factory is not None:
        return "computed"
    value = field.default
    if value is None:
        return "unset"
    if value == "":  # `` would read as two backticks
        return "empty"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value}`"


def _kind(field: Any) -> str:
    annotation = field.annotation
    text = str(annotation).replace("typing.", "").replace("pathlib.", "")
    literal = re.search(r"Literal\[(.*?)\]", text)
    if literal:
        return " or ".join(f"`{v.strip().strip(chr(39))}`" for v in literal.group(1).split(","))
    text = re.sub(r"<class '(\w+)'>", r"\1", text)
    bounds = [f"{sign} {getattr(m, name)}" for m in field.metadata
              for name, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))
              if getattr(m, name, None) is not None]
    return text.replace(" | None", "").replace("Optional[", "").rstrip("]") \
        + (f" ({', '.join(bounds)})" if bounds else "")


def settings_markdown() -> str:
    """Every setting: its variable, default, type and meaning, grouped by heading; fields
    that share one comment share one row."""
    from refloop import settings as module
    from refloop.settings import Settings

    comments = _field_comments(inspect.getsource(module), "Settings")
    rows: list[tuple[str | None, list[str], list[str], list[str], str]] = []
    for name, field in Settings.model_fields.items():
        heading, said = comments.get(name, (None, None))
        cells = (f"`{name.upper()}`", _default(field), _kind(field))
        if said is None and rows and rows[-1][0] == heading:
            for column, cell in zip(rows[-1][1:4], cells, strict=True):
                column.append(cell)
            continue
        rows.append((heading, [cells[0]], [cells[1]], [cells[2]], said or ""))
    parts: list[str] = []
    current: object = object()
    for heading, names, defaults, kinds, said in rows:
        if heading != current:
            parts += ["", f"### {heading or 'General'}", "",
                      "| variable | default | type | meaning |", "| --- | --- | --- | --- |"]
            current = heading
        parts.append(f"| {', '.join(names)} | {', '.join(defaults)} | "
                     f"{_cell('; '.join(dict.fromkeys(kinds)))} | {_cell(said)} |")
    return "\n".join(parts).strip() + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, Any]]:
    for action in parser._actions:  # noqa: SLF001 (argparse keeps them only here)
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            helps = {choice.dest: choice.help for choice in action._choices_actions}  # noqa: SLF001
            return {name: (helps.get(name, ""), sub) for name, sub in action.choices.items()}
    return {}


def cli_markdown() -> str:
    """A table of every command, then each one's usage and options."""
    from refloop.cli.main import build_parser

    parser = build_parser()
    commands = _subcommands(parser)
    parts = ["Before the command: `-v`, `--verbose`: "
             + _cell(next(a.help for a in parser._actions  # noqa: SLF001
                          if "--verbose" in a.option_strings)) + ".", "",
             "| command | what it does |", "| --- | --- |"]
    parts += [f"| [`refloop {name}`](#refloop-{name}) | {_cell(text or '')} |"
              for name, (text, _) in commands.items()]
    for name, (text, sub) in commands.items():
        sub.prog = f"refloop {name}"
        sub.formatter_class = functools.partial(sub.formatter_class, width=USAGE_WIDTH)
        said = text or ""
        parts += ["", f"### refloop {name}", "", said[:1].upper() + said[1:] + ".", "",
                  "```text", sub.format_usage().strip(), "```", ""]
        rows = []
        for action in sub._actions:  # noqa: SLF001
            if isinstance(action, argparse._HelpAction):  # noqa: SLF001
                continue
            names = ", ".join(action.option_strings) or action.dest
            default = action.default
            shown = "" if default in (None, False, argparse.SUPPRESS) else f"`{default}`"
            choices = f" (one of {', '.join(map(str, action.choices))})" \
                if action.choices else ""
            needed = "required" if action.required or not action.option_strings else ""
            rows.append(f"| `{names}` | {_cell((action.help or '') + choices)} | "
                        f"{shown or needed} |")
        if rows:
            parts += ["| argument | meaning | default |", "| --- | --- | --- |", *rows]
    return "\n".join(parts).strip() + "\n"


GENERATORS = {"settings": settings_markdown, "cli": cli_markdown}


def fill(markdown: str) -> str:
    """Each marked block of the page with the code's text between its two markers (a lone
    opening marker gets its closing one)."""
    for name in MARKERS:
        opening, closing = f"<!-- refloop:{name} -->", f"<!-- /refloop:{name} -->"
        block = re.compile(re.escape(opening) + r"(?:.*?" + re.escape(closing) + r")?",
                           re.DOTALL)
        if opening in markdown:
            text = f"{opening}\n\n{GENERATORS[name]().strip()}\n\n{closing}"
            start = markdown.index(opening)
            found = block.match(markdown, start)
            markdown = markdown[:start] + text + markdown[found.end() if found else start:]
    return markdown


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: the page with the code's text, stale or not."""
    return fill(markdown)


def stale_pages(write: bool = False) -> list[str]:
    """The pages whose generated text is not the code's (written anew with `write`)."""
    stale = []
    for page in MARKERS.values():
        path = ROOT / page
        text = path.read_text(encoding="utf-8")
        if fill(text) != text:
            stale.append(page)
            if write:
                path.write_text(fill(text), encoding="utf-8")
    return stale


if __name__ == "__main__":
    # --write: the pages anew; else print the names of stale ones (exit 1 if any)
    written = stale_pages(write="--write" in sys.argv)
    print("\n".join(written) or "the reference pages are the code's")
    sys.exit(1 if written and "--write" not in sys.argv else 0)
