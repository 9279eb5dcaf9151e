"""Smoke test of `refloop eval`: the shipped suite through the real workflow."""

from __future__ import annotations

import pytest

from refloop.cli.eval_harness import load_suite, run_suite, summarise


@pytest.mark.slow
async def test_shipped_suite_meets_seed_001_goals():
    scenarios = load_suite(None)
    assert len(scenarios) >= 12
    kinds = {s.kind for s in scenarios}
    assert {"healthy", "repetition", "alternation", "stall", "deviation", "error_storm",
            "justified_exception"} <= kinds
    outcomes = await run_suite(scenarios)
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
