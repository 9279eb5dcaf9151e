"""Settings: defaults, embedded fallbacks, and start-up errors naming the variable."""

from __future__ import annotations

import pytest

from refloop.settings import Settings, SettingsError, load_settings


def test_defaults_use_embedded_parts(monkeypatch, tmp_path):
    for name in ("TEMPORAL_ADDRESS", "OPENAI_BASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REFLOOP_DATA_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.temporal_address is None
    assert settings.uses_scripted_model
    assert settings.effective_database_url.startswith("sqlite:///")
    assert settings.task_queue == f"refloop-{settings.store_id}"  # the data dir's own
    assert settings.review_model() == settings.refloop_model == settings.reflection_model()


def test_workers_of_different_stores_get_different_default_queues(monkeypatch, tmp_path):
    """The default queue is the data dir's own without DATABASE_URL (the store is its
    SQLite file), `refloop` with one (every worker of that database shares it), and an
    explicit REFLOOP_TASK_QUEUE always wins. The store id never depends on a password."""
    for name in ("DATABASE_URL", "REFLOOP_TASK_QUEUE"):
        monkeypatch.delenv(name, raising=False)
    one = Settings(refloop_data_dir=tmp_path / "one")
    two = Settings(refloop_data_dir=tmp_path / "two")
    assert one.task_queue != two.task_queue and one.store_id != two.store_id
    assert one.task_queue == Settings(refloop_data_dir=tmp_path / "one").task_queue
    shared = "postgresql+psycopg://refloop:{}@db.example/refloop"
    assert Settings(database_url=shared.format("a")).task_queue == "refloop"
    assert Settings(database_url=shared.format("a")).store_id == Settings(
        database_url=shared.format("b")).store_id
    assert Settings(database_url="postgresql+psycopg://refloop@db.example/other").store_id \
        != Settings(database_url=shared.format("a")).store_id
    assert Settings(refloop_data_dir=tmp_path, refloop_task_queue="mine").task_queue == "mine"


def test_role_models_fall_back_and_override(monkeypatch):
    monkeypatch.setenv("REFLOOP_MODEL", "main")
    monkeypatch.setenv("REFLECTION_FC_MODEL", "judge")
    settings = load_settings()
    assert settings.review_model() == "main" and settings.reflection_model() == "judge"
    assert settings.review_model("asked") == "asked"
    assert settings.reflection_model("asked") == "judge"  # the operator's judge wins
    monkeypatch.setenv("REFLOOP_REVIEW_MODEL", "reviewer")
    assert load_settings().review_model("asked") == "reviewer"


def test_tasks_start_with_the_operators_reflection_settings(monkeypatch):
    monkeypatch.setenv("REFLECTION_MAX_ROUNDS", "4")
    monkeypatch.setenv("ENABLE_REFLECTION", "false")
    settings = load_settings()
    task = settings.task_input(task="t", workspace="w", max_iterations=7)
    assert (task.enable_reflection, task.reflection_max_rounds, task.max_iterations) == (
        False, 4, 7)
    assert settings.task_input(task="t", workspace="w", enable_reflection=True).enable_reflection


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TEMPORAL_ADDRESS", "nohostport"),
        ("DATABASE_URL", "mysql://x"),
        ("REFLECTION_MAX_SUPPLEMENTS", "-1"),
        ("FC_REFLECTION_TEMPERATURE", "hot"),
        ("ENABLE_REFLECTION", "perhaps"),
        ("FC_REFLECTION_TOP_P", "0"),
    ],
)
def test_invalid_values_fail_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert name in str(err.value)


def test_blank_values_mean_unset(monkeypatch):
    monkeypatch.setenv("TEMPORAL_ADDRESS", "")
    monkeypatch.setenv("OPENAI_BASE_URL", "")
    settings = load_settings()
    assert settings.temporal_address is None and settings.uses_scripted_model
