"""Smoke test of `refloop eval`: the shipped suite through the real workflow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources

import pytest

from refloop.cli.eval_harness import load_suite, run_suite, summarise
from refloop.runtime.net import free_port
from refloop.settings import Settings


@pytest.mark.slow
async def test_shipped_suite_meets_seed_001_goals():
    scenarios = load_suite(None)
    assert len(scenarios) >= 12
    kinds = {s.kind for s in scenarios}
    assert {"healthy", "repetition", "alternation", "stall", "deviation", "error_storm",
            "justified_exception"} <= kinds
    # Without the semantic index (no scenario searches code): each of the suite's runs
    # would otherwise start an embedding process for its workspace (58 s against 19 s).
    outcomes = await run_suite(scenarios, Settings(refloop_semantic_index=False))
    table = summarise(outcomes)
    on, off = table["on"], table["off"]
    assert on["healthy_triggers"] == 0  # no false positives on healthy traces
    assert on["completion_rate"] == 1.0 and off["completion_rate"] < on["completion_rate"]
    assert on["stuck_detection_latency"] is not None and on["stuck_detection_latency"] <= 3
    assert on["loop_detection_point"] is not None and on["loop_detection_point"] <= 4
    assert off["loop_detection_point"] is None
    assert on["average_iterations"] < off["average_iterations"]
    justified = [o for o in outcomes if o.scenario == "justified_exception" and o.mode == "on"]
    assert justified[0].completed


def test_empty_or_bad_suite_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no scenarios"):
        load_suite(str(tmp_path))
    (tmp_path / "bad.yaml").write_text("name: x\nkind: healthy\ntask: t\nresponses:\n"
                                       "  act: [{}]\n")
    with pytest.raises(ValueError, match="invalid scenario"):
        load_suite(str(tmp_path))


def test_eval_runs_in_the_data_dir_and_on_the_port_it_is_given(tmp_path):
    """REFLOOP_DATA_DIR and REFLOOP_TEMPORAL_PORT are honoured (it took another port and a
    temporary data dir, which it removed): the server runs there and the dir is kept."""
    suite = tmp_path / "suite"
    suite.mkdir()
    shipped = resources.files("refloop.eval_suite") / "01_healthy_single_step.yaml"
    shutil.copyfile(str(shipped), suite / "one.yaml")
    data, port = tmp_path / "data", free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("TEMPORAL_ADDRESS", "OPENAI_BASE_URL", "DATABASE_URL")}
    env.update({"REFLOOP_DATA_DIR": str(data), "REFLOOP_TEMPORAL_PORT": str(port),
                "REFLOOP_UI_PORT": str(free_port()), "REFLOOP_SEMANTIC_INDEX": "false"})
    done = subprocess.run([sys.executable, "-m", "refloop", "eval", "--suite", str(suite),
                           "--json"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"at 127.0.0.1:{port}" in done.stderr, done.stderr[-2000:]
    assert (data / "temporal.log").exists() and (data / "refloop.db").exists()
    assert len(json.loads(done.stdout)["runs"]) == 2  # triggers on and off
