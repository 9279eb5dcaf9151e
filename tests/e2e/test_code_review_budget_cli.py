"""A code review's spend limit from a shell: `refloop review --max-cost-usd` waits
`waiting_for_budget` after its Review call (`refloop tasks --status` lists it, and the
command says how to raise it), `refloop budget` (a fresh process) raises it, and the review
ends with its cost. Every call of the scripted model costs exactly $0.01."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_budget_cli import refloop, refloop_env, until_waiting
from tests.workflow.test_budget import answered, cent_scenario
from tests.workflow.test_code_review import DIFF, issue, review, verify


@pytest.mark.slow  # `refloop review`'s own stack and a process per command
def test_refloop_review_pauses_and_refloop_budget_raises(tmp_path: Path, scripted_llm):
    model = cent_scenario(scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]})
    diff = tmp_path / "change.diff"
    diff.write_text(DIFF)
    env = refloop_env(tmp_path, scripted_llm, model)
    run = subprocess.Popen(
        [sys.executable, "-m", "refloop", "review", "--diff", str(diff), "--workdir",
         str(tmp_path), "--model", model, "--format", "simple", "--max-cost-usd", "0.01"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        review_id = until_waiting(env, run, asked=lambda: answered(scripted_llm, model) >= 1)
        assert answered(scripted_llm, model) == 1
        time.sleep(1)
        assert answered(scripted_llm, model) == 1  # no call while it waits
        refused = refloop(env, "budget", review_id, "--max-cost-usd", "0.005")
        assert refused.returncode != 0 and "$0.01" in refused.stderr
        raised = refloop(env, "budget", review_id, "--max-cost-usd", "0.02")
        assert raised.returncode == 0, raised.stderr
        assert "goes on" in raised.stdout
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err
    assert "ISSUE-001" in out or "hard-coded secret" in out
    assert f"refloop budget {review_id} --max-cost-usd" in err
    assert "cost: $0.0200, 2 model calls" in err
    assert answered(scripted_llm, model) == 2
