"""Schemathesis against the ASGI app in-process, on SQLite and on PostgreSQL, with every
check (the `--checks all` of its CLI). Zero failures expected.

Examples per operation are capped (SCHEMATHESIS_MAX_EXAMPLES, default 15) to keep `make
test` short. No worker polls the task queue here, so started workflows stay queued: the
API's answers, not the agent, are under test (tests/api/test_api.py runs tasks end to end).
Case counts land in test-artifacts/schemathesis-<db>.json.

Exclusions, each with its reason (EXCLUDED and CONFIG below):
- NUL bytes are not generated: the API refuses them at the boundary on purpose (422,
  covered by tests/api/test_hardening.py), which the schema does not express.
- 413 counts as a correct refusal: the 1 MB cap counts bytes, field lengths count
  characters.
- positive_data_acceptance on the three routes that take a directory (session start,
  a task in one call, code-review start): a schema-valid string is still refused (422)
  unless it names an existing directory inside REFLOOP_WORKSPACE_ROOTS, which no schema
  can express (nor that a task in one call names a session or the session's fields, not
  both).
Model configs are checked in full: the document says which `api_key_env` names
REFLOOP_MODEL_KEY_ENVS binds and to which base URLs (none bound: null only), so a
schema-valid config is accepted whatever the operator configured (test_bound_model_keys).
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig

from refloop.api.main import create_app
from refloop.settings import Settings
from tests.constants import TEST_DATABASE_URL

MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "15"))
ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"
load_all_checks()
ALL_CHECKS = CHECKS.get_all()
EXCLUDED = {  # (method, path): check names, reasons in the module docstring
    ("POST", "/agent/interactive/start"): {"positive_data_acceptance"},
    ("POST", "/tasks"): {"positive_data_acceptance"},
    ("POST", "/code-reviews"): {"positive_data_acceptance"},
}
COUNTS: dict[str, dict[str, int]] = {}


def build_app(client, tmp_path_factory, scripted_llm, database_url: str | None,
              token: str | None = None, key_envs: str | None = None):
    data = tmp_path_factory.mktemp("schemathesis")
    settings = Settings(
        openai_base_url=scripted_llm.base_url, openai_api_key="test",
        database_url=database_url, refloop_data_dir=data / "data",
        refloop_workspace_roots=str(data), refloop_semantic_index=False,
        refloop_task_queue=f"st-{uuid.uuid4().hex[:8]}",  # no worker: tasks stay queued
        refloop_api_token=token, refloop_model_key_envs=key_envs,
    )
    return create_app(settings, client=client)


@pytest.fixture
def sqlite_app(client, tmp_path_factory, scripted_llm):
    return build_app(client, tmp_path_factory, scripted_llm, None)


@pytest.fixture
def postgres_app(client, tmp_path_factory, scripted_llm):
    return build_app(client, tmp_path_factory, scripted_llm, TEST_DATABASE_URL)


KEY_ENVS = "MODELS_KEY=https://models.example/v1,OWN_KEY"


@pytest.fixture
def bound_keys_app(client, tmp_path_factory, scripted_llm):
    return build_app(client, tmp_path_factory, scripted_llm, None, key_envs=KEY_ENVS)


@pytest.fixture
def secured_app(client, tmp_path_factory, scripted_llm):
    return build_app(client, tmp_path_factory, scripted_llm, None, token=TOKEN)


TOKEN = "schemathesis-token"
# The document as served (no token configured): built once at import, without a database.
NEGATIVE_OK = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428",
               "429", "5xx"]
POSITIVE_OK = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]
CONFIG_DATA = {
    # NUL bytes: refused at the boundary by design (422; tests/api/test_hardening.py).
    "generation": {"allow-x00": False},
    "checks": {
        # 413: the 1 MB body cap is in bytes, not characters; a body of long strings of
        # 4-byte characters is refused by size before (or instead of) by field lengths.
        "negative_data_rejection": {"expected-statuses": NEGATIVE_OK},
        "positive_data_acceptance": {"expected-statuses": POSITIVE_OK},
    },
}
CONFIG = SchemathesisConfig.from_dict(CONFIG_DATA)
SCHEMA = schemathesis.openapi.from_dict(
    create_app(Settings(refloop_data_dir=Path("/nonexistent")), client=None).openapi(),
    config=CONFIG)


def checks_for(case) -> list:
    skip = EXCLUDED.get((case.method.upper(), case.path), set())
    return [check for check in ALL_CHECKS if check.__name__ not in skip]


@contextlib.contextmanager
def counted(counts: dict[str, int], name: str) -> Iterator[None]:
    """Failures counted; the counts saved after every case (test-artifacts/)."""
    try:
        yield
    except BaseException:
        counts["failures"] += 1
        raise
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"schemathesis-{name}.json").write_text(json.dumps(counts))


def run_case(case, app, db: str, headers: dict[str, str] | None = None) -> None:
    counts = COUNTS.setdefault(db, {"cases": 0, "failures": 0})
    # answered / refused_401: with the token, most cases must get past the auth check
    counts["cases"] += 1
    with counted(counts, db):
        # Checks that send probes of their own (ignored_auth) use the schema's transport.
        case.operation.schema.app = app
        response = case.call_and_validate(app=app, base_url="http://localhost",
                                          checks=checks_for(case), headers=headers)
        key = "refused_401" if response.status_code == 401 else "answered"
        counts[key] = counts.get(key, 0) + 1


SETTINGS = hypothesis_settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                               suppress_health_check=list(HealthCheck))
# With a token: the document that declares bearer security and 401s (ignored_auth then
# checks that a request without the token really is refused). Fewer examples: the routes
# behind the token are the ones above.
# The coverage phase (every boundary value, ~1,000 cases) already ran without the token.
# The token goes in as schemathesis' own auth, so it knows which cases tamper with it.
SECURED_CONFIG = SchemathesisConfig.from_dict({
    **CONFIG_DATA, "phases": {"coverage": {"enabled": False}},
    "auth": {"openapi": {"bearer": {"bearer": TOKEN}}}})
SECURED_SCHEMA = schemathesis.openapi.from_dict(
    create_app(Settings(refloop_data_dir=Path("/nonexistent"), refloop_api_token=TOKEN),
               client=None).openapi(), config=SECURED_CONFIG)


# An operator who bound model keys: their names and URLs are in the document.
BOUND_SCHEMA = schemathesis.openapi.from_dict(
    create_app(Settings(refloop_data_dir=Path("/nonexistent"), refloop_model_key_envs=KEY_ENVS,
                        openai_base_url=None), client=None).openapi(),
    config=CONFIG).include(path_regex="^/model-configs")


@BOUND_SCHEMA.parametrize()
@SETTINGS
def test_bound_model_keys(case, bound_keys_app):
    run_case(case, bound_keys_app, "sqlite-bound-keys")


@SCHEMA.parametrize()
@SETTINGS
def test_api_on_sqlite(case, sqlite_app):
    run_case(case, sqlite_app, "sqlite")


@pytest.mark.db
@SCHEMA.parametrize()
@SETTINGS
def test_api_on_postgresql(case, postgres_app):
    run_case(case, postgres_app, "postgresql")


@SECURED_SCHEMA.parametrize()
@hypothesis_settings(max_examples=max(3, MAX_EXAMPLES // 3), deadline=None, database=None,
                     suppress_health_check=list(HealthCheck))
def test_api_with_a_token(case, secured_app):
    run_case(case, secured_app, "sqlite-token")


def stateful_test(app, db: str, max_examples: int) -> None:
    """The stateful phase: sequences that follow the document's links (create a prompt,
    then read, change and delete it; start a session, then a task in it, then read and
    cancel it; a code review, then its state), every check on every step."""
    counts = COUNTS.setdefault(f"{db}-stateful", {"steps": 0, "failures": 0})
    SCHEMA.app = app

    class Machine(SCHEMA.as_state_machine()):  # type: ignore[misc, valid-type]
        def get_call_kwargs(self, case):
            return {"app": app, "base_url": "http://localhost"}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            counts["steps"] += 1
            with counted(counts, f"{db}-stateful"):
                case.validate_response(response, checks=checks_for(case))

    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(Machine, settings=hypothesis_settings(
        max_examples=max_examples, stateful_step_count=6, deadline=None, database=None,
        suppress_health_check=list(HealthCheck)))


STATEFUL_EXAMPLES = int(os.environ.get("SCHEMATHESIS_STATEFUL_EXAMPLES", "10"))


def test_api_stateful_on_sqlite(sqlite_app):
    stateful_test(sqlite_app, "sqlite", STATEFUL_EXAMPLES)


@pytest.mark.db
def test_api_stateful_on_postgresql(postgres_app):
    stateful_test(postgres_app, "postgresql", STATEFUL_EXAMPLES)
