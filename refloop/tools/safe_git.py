"""git on a workspace without running anything the repository configures.

A repository's `.git/config` can name programs git runs: `diff.external`, a textconv or
external diff driver, `core.fsmonitor`, a pager, hooks, credential helpers. The model can
write that config (`git config` is a command like any other), so `refloop review
--git-range` runs git in the command sandbox (no secrets, no host privilege, the repository
bound alone) and, inside it, with every such program switched off on the command line.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from refloop.settings import Settings
from refloop.tools.os_sandbox import SandboxUnavailableError, sandboxed_command

# Command-line config wins over the repository's: these name no program at all.
NO_PROGRAMS = ("core.hooksPath=/dev/null", "core.fsmonitor=false", "core.pager=cat",
               "core.sshCommand=false", "core.askPass=", "credential.helper=",
               "core.editor=false", "sequence.editor=false", "diff.external=",
               "protocol.allow=never", "core.gitProxy=false")
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "GIT_PAGER": "cat"}
GIT_TIMEOUT_S = 60.0


class GitError(RuntimeError):
    """git refused, failed or could not run; the message says why."""


def repository_root(workdir: Path) -> tuple[Path, list[str]]:
    """The repository's top directory (nearest with `.git`), and what else git must read:
    a linked worktree's git dir and the common dir it shares."""
    for candidate in (workdir, *workdir.parents):
        marker = candidate / ".git"
        if marker.is_dir():
            return candidate, []
        if marker.is_file():
            text = marker.read_text(errors="replace").strip()
            gitdir = Path(text.removeprefix("gitdir:").strip())
            gitdir = gitdir if gitdir.is_absolute() else (candidate / gitdir).resolve()
            extra = [str(gitdir)]
            common = gitdir / "commondir"
            if common.is_file():
                extra.append(str((gitdir / common.read_text().strip()).resolve()))
            return candidate, extra
    raise GitError(f"{workdir} is not inside a git repository")


def git_diff(workdir: Path, git_range: str, settings: Settings) -> str:
    """`git diff RANGE` of the repository at `workdir`, run as described above."""
    if not git_range or git_range.startswith("-") or "\x00" in git_range:
        raise GitError(f"not a revision range: {git_range!r}")
    top, extra = repository_root(workdir)
    argv = ["git", "--no-pager"]
    for setting in NO_PROGRAMS:
        argv += ["-c", setting]
    argv += ["diff", "--no-ext-diff", "--no-textconv", "--no-color", git_range, "--"]
    confined = settings.model_copy(update={"refloop_sandbox_ro_paths": ",".join(
        [*settings.sandbox_ro_paths, *extra])})
    try:
        command = sandboxed_command(argv, workspace=top, allow_network=False, env=GIT_ENV,
                                    settings=confined)
    except SandboxUnavailableError as err:
        raise GitError(str(err)) from None
    try:
        done = subprocess.run(command.argv, cwd=str(top) if not command.sandboxed else "/",
                              env=command.env, pass_fds=command.pass_fds, capture_output=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GitError(f"git diff did not finish: {err}") from None
    finally:
        command.close()
    if done.returncode != 0:
        raise GitError(done.stderr.decode(errors="replace").strip()[-2000:]
                       or f"exit code {done.returncode}")
    return done.stdout.decode(errors="replace")


__all__ = ["GitError", "git_diff"]
