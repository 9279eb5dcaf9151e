"""Admission: a worker's slots, sized to its CPUs unless the settings fix them; its
collector while it serves."""

from __future__ import annotations

import gc

import pytest

from refloop.settings import Settings
from refloop.worker.admission import (
    COLLECTOR_THRESHOLDS,
    Slots,
    collector_tuned,
    slots_for,
    usable_cpus,
    worker_slots,
)


def test_unset_counts_are_sized_to_the_cpus():
    assert worker_slots(0, 0, cpus=1) == Slots(activities=16, workflow_tasks=2)
    assert worker_slots(0, 0, cpus=2) == Slots(activities=32, workflow_tasks=4)
    assert worker_slots(0, 0, cpus=8) == Slots(activities=128, workflow_tasks=16)


def test_set_counts_win_whatever_the_cpus():
    assert worker_slots(5, 3, cpus=64) == Slots(activities=5, workflow_tasks=3)
    assert worker_slots(5, 0, cpus=2) == Slots(activities=5, workflow_tasks=4)


def test_the_worker_gets_every_count():
    kwargs = Slots(activities=7, workflow_tasks=3).worker_kwargs()
    assert kwargs == {"max_concurrent_activities": 7, "max_concurrent_local_activities": 7,
                      "max_concurrent_workflow_tasks": 3}


def test_settings_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("REFLOOP_WORKER_MAX_ACTIVITIES", "12")
    monkeypatch.setenv("REFLOOP_WORKER_MAX_WORKFLOW_TASKS", "0")
    slots = slots_for(Settings())
    assert slots == Slots(activities=12, workflow_tasks=max(2, 2 * usable_cpus()))


def test_one_workflow_task_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="refloop_worker_max_workflow_tasks"):
        Settings(refloop_worker_max_workflow_tasks=1)
    with pytest.raises(ValueError):
        Settings(refloop_worker_max_activities=-1)


def test_a_serving_worker_freezes_start_up_and_collects_less_often_then_puts_both_back():
    before = gc.get_threshold()
    with collector_tuned():
        assert gc.get_threshold() == COLLECTOR_THRESHOLDS
        assert gc.get_freeze_count() > 0  # start-up's objects are out of every scan
        assert COLLECTOR_THRESHOLDS[0] > before[0] and COLLECTOR_THRESHOLDS[2] > before[2]
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
