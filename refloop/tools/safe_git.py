"""git on a workspace without running anything the repository configures.

A repository's `.git/config` can name programs git runs: `diff.external`, a textconv or
external diff driver, a clean/smudge filter (chosen by `.gitattributes`), `core.fsmonitor`,
a pager, hooks, credential helpers, and pull in more of them with `include.path`. The model
can write that config (`git config` is a command like any other), so `refloop review
--git-range` runs git in the command sandbox (no secrets, no host privilege, the repository
bound alone) and, inside it:
- the repository's config is replaced by one written here from a fixed allowlist of keys
  that name no program (`ALLOWED_CONFIG`): no filter, driver, include or other `core.*`;
  attribute files of the git dir are empty, so attributes can name only drivers that do not
  exist;
- every such program is switched off on the command line as well.
A `.git` file or a `commondir` that points outside the repository is refused, never bound.

With REFLOOP_SANDBOX=none (the model's commands unconfined, by choice) the promise holds
all the same, without a bind to lean on: git gets a private git dir (`private_gitdir`)
with the allowlisted config, the repository's HEAD, and its objects, refs and index linked
in; no attribute file of the git dir, no per-worktree config, no hook directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from refloop.settings import Settings
from refloop.tools.os_sandbox import SandboxUnavailableError, sandbox_mode, sandboxed_command

# Command-line config wins over the repository's: these name no program at all.
NO_PROGRAMS = ("core.hooksPath=/dev/null", "core.fsmonitor=false", "core.pager=cat",
               "core.sshCommand=false", "core.askPass=", "credential.helper=",
               "core.editor=false", "sequence.editor=false", "diff.external=",
               "protocol.allow=never", "core.gitProxy=false", "core.attributesFile=/dev/null")
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "GIT_PAGER": "cat"}
GIT_TIMEOUT_S = 60.0
# The only keys of the repository's config git gets to see: what the repository's format
# needs, and how file names and modes are compared. None of them names a program or a path.
ALLOWED_CONFIG = frozenset({
    "core.repositoryformatversion", "core.bare", "core.filemode", "core.ignorecase",
    "core.precomposeunicode", "core.symlinks", "extensions.objectformat"})
PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SECTION = re.compile(r"\[\s*([A-Za-z0-9.-]+)\s*\]")
ENTRY = re.compile(r"([A-Za-z][A-Za-z0-9-]*)\s*=\s*([A-Za-z0-9_.-]{1,64})\s*(?:[#;].*)?")


class GitError(RuntimeError):
    """git refused, failed or could not run; the message says why."""


def _inside(path: Path, top: Path, what: str) -> Path:
    resolved = path.resolve()
    if resolved != top and top not in resolved.parents:
        raise GitError(f"refused: {what} points outside the repository ({resolved}); refloop "
                       "reads no git data from outside the directory it reviews")
    return resolved


def repository_root(workdir: Path) -> tuple[Path, Path, Path]:
    """(top directory, git dir, common dir) of the repository at `workdir`: the nearest
    directory with a `.git`. A `.git` file or `commondir` naming a place outside the top
    directory, or a `.git` that is a symbolic link, is refused."""
    for candidate in (workdir, *workdir.parents):
        marker = candidate / ".git"
        if marker.is_symlink():
            raise GitError(f"refused: {marker} is a symbolic link; refloop reads no git data "
                           "from outside the directory it reviews")
        if not marker.exists():
            continue
        top = candidate.resolve()
        gitdir = top / ".git"
        if marker.is_file():
            text = marker.read_text(errors="replace").strip()
            named = Path(text.removeprefix("gitdir:").strip())
            gitdir = _inside(named if named.is_absolute() else top / named, top, "the .git file")
        common = gitdir
        pointer = gitdir / "commondir"
        if pointer.is_file():
            named = Path(pointer.read_text(errors="replace").strip())
            common = _inside(named if named.is_absolute() else gitdir / named, top,
                             f"{pointer.relative_to(top)}")
        return top, gitdir, common
    raise GitError(f"{workdir} is not inside a git repository")


def allowed_config(text: str) -> str:
    """The repository's config reduced to ALLOWED_CONFIG: plain `key = value` lines of plain
    sections only; anything else (subsections, includes, quoted or continued values) is
    dropped, not interpreted."""
    kept: list[str] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        header = SECTION.fullmatch(line)
        if header:
            section = header.group(1).lower()
            continue
        if line.startswith("["):
            section = ""  # a subsection or something odd: nothing under it is kept
            continue
        entry = ENTRY.fullmatch(line)
        if section and entry and f"{section}.{entry.group(1).lower()}" in ALLOWED_CONFIG:
            kept.append(f"[{section}]\n\t{entry.group(1).lower()} = {entry.group(2)}\n")
    return "".join(kept)


def private_gitdir(folder: Path, gitdir: Path, common: Path, config: str) -> Path:
    """A git dir in `folder` that reads the repository's history and index but none of its
    configuration: `config` is written here, HEAD copied, objects, refs, packed-refs and
    the index linked (git only reads them: GIT_OPTIONAL_LOCKS=0)."""
    (folder / "config").write_text(config)
    (folder / "HEAD").write_bytes((gitdir / "HEAD").read_bytes())
    for name, source in (("objects", common), ("refs", common), ("packed-refs", common),
                         ("index", gitdir)):
        if (source / name).exists():
            (folder / name).symlink_to(source / name)
    return folder


def git_diff(workdir: Path, git_range: str, settings: Settings) -> str:
    """`git diff RANGE` of the repository at `workdir`, run as described above."""
    if not git_range or git_range.startswith("-") or "\x00" in git_range:
        raise GitError(f"not a revision range: {git_range!r}")
    top, gitdir, common = repository_root(workdir)
    argv = ["git", "--no-pager"]
    for setting in NO_PROGRAMS:
        argv += ["-c", setting]
    argv += ["diff", "--no-ext-diff", "--no-textconv", "--no-color", git_range, "--"]
    config = common / "config"
    overlays = {config: allowed_config(config.read_text(errors="replace")
                                       if config.is_file() else "").encode()}
    for folder in dict.fromkeys((gitdir, common)):
        for name in ("info/attributes", "config.worktree"):
            if (folder / name).is_file():
                overlays[folder / name] = b""
    env = {**GIT_ENV, "GIT_DIR": str(gitdir), "GIT_WORK_TREE": str(top)}
    try:
        unconfined = sandbox_mode(settings) == "none"
    except SandboxUnavailableError as err:
        raise GitError(str(err)) from None
    if unconfined:  # no bind can replace the config: a git dir of our own instead
        with tempfile.TemporaryDirectory(prefix="refloop-git-") as folder:
            env["GIT_DIR"] = str(private_gitdir(Path(folder), gitdir, common,
                                                overlays[config].decode()))
            return _run(argv, top, env, settings, overlays)
    return _run(argv, top, env, settings, overlays)


def _run(argv: list[str], top: Path, env: dict[str, str], settings: Settings,
         overlays: dict[Path, bytes]) -> str:
    try:
        command = sandboxed_command(argv, workspace=top, allow_network=False, env=env,
                                    settings=settings, workspace_fd=os.open(
                                        top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC),
                                    overlays=overlays, hand_over_workspace=False)
    except SandboxUnavailableError as err:
        raise GitError(str(err)) from None
    try:
        done = command.run(timeout_s=GIT_TIMEOUT_S,
                           cwd=str(top) if not command.sandboxed else "/")
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GitError(f"git diff did not finish: {err}") from None
    if done.returncode != 0:
        raise GitError(done.stderr.decode(errors="replace").strip()[-2000:]
                       or f"exit code {done.returncode}")
    return done.stdout.decode(errors="replace")


__all__ = ["GitError", "git_diff"]
