"""`refloop review --git-range` with REFLOOP_SANDBOX=none: the model's commands then run
unconfined by choice, but a repository still runs no program of its own. Without the
sandbox there is no bind to replace the repository's config with: git is given a private
git dir instead (`safe_git`), whose config holds only the allowlisted keys."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cli.tasks import review_request
from refloop.settings import Settings
from refloop.tools.safe_git import git_diff
from tests.security.test_edges import git
from tests.security.test_whole_command import plant_filter_driver, repository

UNSANDBOXED = {"refloop_sandbox": "none"}


@pytest.mark.parametrize("plant", ["config", "include.path", "info/attributes", "worktree"])
def test_an_unsandboxed_review_runs_no_filter_driver(tmp_path: Path, plant: str):
    repo = repository(tmp_path)
    marker = tmp_path / "pwned"  # outside the repository: nothing would stop a hook here
    hook = plant_filter_driver(repo, marker, plant, "[core]\n\tfsmonitor = {hook}\n")
    if plant == "worktree":  # the per-worktree config a repository can turn on
        git(repo, "config", "extensions.worktreeConfig", "true")
        (repo / ".git" / "config.worktree").write_text(f"[core]\n\tfsmonitor = {hook}\n")
    (repo / "a.txt").write_text("one\ntwo\nthree\n")  # a working-tree diff runs the filter
    args = argparse.Namespace(workdir=str(repo), desc="review", format="json", model=None,
                              snippet=None, file=None, git_range="HEAD~1", diff=None)
    request = review_request(args, Settings(refloop_data_dir=tmp_path / "data",
                                            **UNSANDBOXED))
    assert not marker.exists(), marker.read_text()
    assert "+two" in request.content and "+three" in request.content


def test_an_unsandboxed_range_between_commits_still_works(tmp_path: Path):
    repo = repository(tmp_path)
    diff = git_diff(repo, "HEAD~1..HEAD", Settings(refloop_data_dir=tmp_path / "data",
                                                   **UNSANDBOXED))
    assert "+two" in diff
