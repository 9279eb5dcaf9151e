"""The static type check ([tool.mypy] in pyproject.toml): mypy, strict on `refloop.contract`,
`refloop.workflows` and `refloop.activities`.

Workflows call activities by name, so only types tie an `@implements(CALL)` activity
(`refloop.activities.defn`) to the `ActivityCall` its callers use: mypy reports an activity
that takes or returns other types than its call declares, and a call site that sends
another argument.

The layers install as `refloop.workflows`, `refloop.activities`... through setuptools'
package-dir map, which the editable install serves with an import hook that mypy cannot
follow. So this lays the installed package out as symbolic links (`.refloop-data/typecheck`)
and hands that folder to mypy as its search path; reported paths are the repository's.

`python -m tests.typecheck [mypy arguments]` prints mypy's report and exits non-zero on an
error; with arguments (files or `-p`/`-m`), it checks those instead of the configured
packages, with the same configuration.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".refloop-data" / "typecheck"


def package_links() -> dict[Path, Path]:
    """Where each folder of the package-dir map sits in the installed layout: {link: folder}.
    The root package's entries are linked one by one, so the layers can sit beside them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {name: ROOT / folder for name, folder in config["package-dir"].items()}
    links: dict[Path, Path] = {}
    for name, folder in mapped.items():
        parent, _, last = name.rpartition(".")
        if not parent:  # the root package: a real folder of links
            links.update({TREE / name / entry.name: entry for entry in folder.iterdir()
                          if entry.name != "__pycache__"})
        elif mapped.get(parent, ROOT) / last != folder:  # not where its parent puts it
            links[TREE.joinpath(*name.split("."))] = folder
    return links


def lay_out() -> dict[Path, Path]:
    """The link tree, made afresh (cheap: a few dozen links)."""
    links = package_links()
    for link in sorted(TREE.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            link.rmdir()
    for link, target in links.items():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=target.is_dir())
    return links


def repository_paths(report: str, links: dict[Path, Path]) -> str:
    """mypy's report with the tree's paths written as the repository's."""
    for link, target in sorted(links.items(), key=lambda item: -len(item[0].parts)):
        for shown in (str(link), os.path.relpath(link, Path.cwd())):
            report = report.replace(shown, os.path.relpath(target, Path.cwd()))
    return report


def check(args: list[str]) -> tuple[str, str, int]:
    """Run mypy with the repository's configuration: (report, errors, exit status)."""
    links = lay_out()
    env_path = os.environ.get("MYPYPATH")
    os.environ["MYPYPATH"] = os.pathsep.join(filter(None, [str(TREE), env_path]))
    try:
        stdout, stderr, status = api.run(
            ["--config-file", str(ROOT / "pyproject.toml"),
             "--python-executable", sys.executable, *args])
    finally:
        if env_path is None:
            os.environ.pop("MYPYPATH", None)
        else:
            os.environ["MYPYPATH"] = env_path
    return repository_paths(stdout, links), repository_paths(stderr, links), status


def main(args: list[str]) -> int:
    stdout, stderr, status = check(args)
    sys.stdout.write(stdout)
    sys.stderr.write(stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
