"""The soak's short form (bench/soak.py): the whole stack, tasks in flight, and the model
endpoint answering HTTP 500 for 45 s in the middle of the run.

Runs once per module (about 1.5 minutes); the tests read its report. The outage outlasts the
31 s after which the model call's retry policy used to give up, with load before and after
it (20 s before, the rest of the 81 s run after); a long task still running at the end of
the drain is in flight, not lost."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.soak import Report, run_soak, short_profile

pytestmark = pytest.mark.slow

OUTAGE_S = 45.0


def have_postgres() -> bool:
    return shutil.which("initdb") is not None or any(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"))


@pytest.fixture(scope="module")
async def soak_report() -> Report:
    if not have_postgres():
        pytest.skip("the soak runs a PostgreSQL cluster of its own: initdb is not installed")
    profile = short_profile(minutes=1.35)
    profile.outage_s = OUTAGE_S
    profile.first_fault_s = 20.0
    profile.drain_s = 20.0
    report = await run_soak(profile)
    print(report.text)
    return report


async def test_soak_through_a_model_outage_loses_nothing(soak_report: Report) -> None:
    report = soak_report
    assert report.submitted >= 6, report.text  # the load was there
    assert [f.kind for f in report.faults] == ["model_5xx"], report.text
    outage = report.faults[0]
    assert outage.ended - outage.started >= OUTAGE_S - 1
    assert outage.resumed is not None, "no task made progress after the outage\n" + report.text
    assert report.lost == 0, report.text
    assert report.stuck == [], report.text
    assert report.completed > 0, report.text
    assert report.exact == report.completed, report.text
    assert report.unexplained_failures == 0, report.text


async def test_soak_every_task_outlasts_a_model_outage(soak_report: Report) -> None:
    """Tasks wait out the outage (waiting_for_model) instead of failing: before, the model
    call's retry policy gave up after about 31 s of HTTP 500 and every task in flight
    failed."""
    report = soak_report
    assert report.waited_for_model > 0, report.text
    assert report.failed == {}, report.text
    assert report.completed + len(report.in_flight) == report.submitted, report.text
