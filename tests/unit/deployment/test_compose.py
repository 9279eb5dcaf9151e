"""docker-compose.yml wiring, checked without Docker (no engine on these machines), and by
a real compose parser where one is installed (Debian's `docker-compose` runs `config`
without an engine)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from refloop.contract.visibility import SEARCH_ATTRIBUTES

ROOT = Path(__file__).parents[3]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_services_and_pinned_images():
    assert {"postgres", "temporal-schema", "temporal", "temporal-setup", "temporal-ui",
            "worker-a", "worker-b", "api"} <= set(SERVICES)
    for name, service in SERVICES.items():
        if "image" in service:
            assert ":" in service["image"] and not service["image"].endswith(":latest"), name
        else:
            assert service["build"] == "." and (ROOT / "Dockerfile").exists()


def test_todays_images_matching_the_embedded_dev_server():
    assert SERVICES["temporal"]["image"].startswith("temporalio/server:1.32.")
    assert SERVICES["temporal-ui"]["image"].startswith("temporalio/ui:2.54.")
    for job in ("temporal-schema", "temporal-setup"):
        assert SERVICES[job]["image"].startswith("temporalio/admin-tools:1.32."), job
    assert not any("auto-setup" in s.get("image", "") for s in SERVICES.values())
    assert "tctl" not in str(SERVICES["temporal"]["healthcheck"]["test"])


def test_one_shot_jobs_create_schema_namespace_and_search_attributes():
    schema = SERVICES["temporal-schema"]
    assert "setup-schema" in schema["command"][0] and "temporal_visibility" in schema["command"][0]
    temporal = SERVICES["temporal"]
    assert temporal["depends_on"]["temporal-schema"]["condition"] == \
        "service_completed_successfully"
    assert temporal["environment"]["DB"].startswith("postgres")
    assert temporal["environment"]["POSTGRES_SEEDS"] == "postgres"
    setup = SERVICES["temporal-setup"]["command"][0]
    assert "namespace create" in setup
    for name, kind in SEARCH_ATTRIBUTES.items():
        assert f"{name}={kind}" in setup
    assert SERVICES["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_refloop_services_wait_for_healthy_dependencies_and_share_settings():
    for name in ("worker-a", "worker-b", "api"):
        service = SERVICES[name]
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert service["depends_on"]["temporal"]["condition"] == "service_healthy"
        assert service["depends_on"]["temporal-setup"]["condition"] == \
            "service_completed_successfully"
        env = service["environment"]
        assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
        assert env["DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "healthcheck" in SERVICES["api"]
    assert all("healthcheck" in SERVICES[name] for name in ("postgres", "temporal"))
    # The API refuses to start unauthenticated.
    assert SERVICES["api"]["environment"]["REFLOOP_API_TOKEN"].startswith(
        "${REFLOOP_API_TOKEN:?")


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="no docker-compose")
def test_a_real_compose_parser_accepts_the_file_and_requires_the_api_token(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "REFLOOP_API_TOKEN"}
    command = ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"]
    done = subprocess.run(command, env={**env, "REFLOOP_API_TOKEN": "t"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    missing = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode != 0 and "REFLOOP_API_TOKEN" in missing.stderr


def test_two_hosts_each_with_its_own_volume_and_host_id():
    """Many hosts, no shared disk: a host's workspaces, journal and index on its volume."""
    hosts = {name: SERVICES[name] for name in ("worker-a", "worker-b")}
    assert {s["environment"]["REFLOOP_HOST_ID"] for s in hosts.values()} == {"a", "b"}
    volumes = [s["volumes"][0].split(":")[0] for s in hosts.values()]
    assert len(set(volumes)) == 2 and set(volumes) <= set(COMPOSE["volumes"])
    assert all(s["volumes"][0].endswith(":/home/refloop/data") for s in hosts.values())
    assert "REFLOOP_JOURNAL_DIR" not in hosts["worker-a"]["environment"]  # host-local


def test_temporal_and_its_web_ui_are_not_published_on_all_interfaces():
    """Outsiders reached 7233 and 8080 without authentication and approved writes through
    `decide_approval`, bypassing the API token."""
    for name in ("temporal", "temporal-ui"):
        for port in SERVICES[name].get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_the_ui_and_worker_services_have_health_checks():
    for name in ("temporal-ui", "worker-a", "worker-b", "api"):
        assert SERVICES[name]["healthcheck"]["test"], name
    for name in ("worker-a", "worker-b"):
        assert "refloop.worker.health" in " ".join(SERVICES[name]["healthcheck"]["test"])


HOST_FILE = ROOT / "docker-compose.host.yml"
HOST = yaml.safe_load(HOST_FILE.read_text())["services"]["worker"]
# What Debian's docker-compose package carries: the compose specification's JSON schema.
COMPOSE_SPEC = Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")
HOST_ENV = {"REFLOOP_FLEET_ADDRESS": "10.0.0.1", "REFLOOP_HOST_ID": "c",
            "REFLOOP_DB_PASSWORD": "secret"}


def test_the_api_is_no_host_and_listens_on_loopback_by_default():
    """The API inherited `REFLOOP_HOST_ID: a` and checked host a's workspaces on its own
    disk; it was published on every interface."""
    api = SERVICES["api"]
    assert "REFLOOP_HOST_ID" not in api["environment"]
    assert api["ports"] == ["${REFLOOP_API_ADDRESS:-127.0.0.1}:8000:8000"]
    assert SERVICES["postgres"]["ports"] == ["${REFLOOP_POSTGRES_ADDRESS:-127.0.0.1}:5432:5432"]


def test_other_machines_reach_temporal_only_through_mutual_tls():
    proxy = SERVICES["temporal-tls"]
    assert proxy["profiles"] == ["fleet"]  # opened only when asked
    config = (ROOT / "deploy" / "temporal-tls.conf").read_text()
    assert "ssl_verify_client on;" in config and "grpc_pass grpc://temporal:7233;" in config
    assert "grpc_read_timeout 300s;" in config  # past a worker's minute-long polls
    assert proxy["volumes"][0].startswith("./deploy/temporal-tls.conf:")


def test_a_worker_host_on_another_machine_names_what_it_needs():
    """Nothing said how worker-b runs on a second machine: compose service names,
    PostgreSQL unreachable, 7233 without TLS, `depends_on` that does not cross machines."""
    env = HOST["environment"]
    assert env["TEMPORAL_ADDRESS"].startswith("${REFLOOP_FLEET_ADDRESS:?")
    assert env["TEMPORAL_ADDRESS"].endswith(":7234")
    assert {"TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_TLS_CLIENT_CERT_PATH",
            "TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_NAME"} <= set(env)
    assert "@${REFLOOP_FLEET_ADDRESS}:5432/refloop?sslmode=verify-full" in env["DATABASE_URL"]
    assert env["REFLOOP_HOST_ID"].startswith("${REFLOOP_HOST_ID:?")
    assert "depends_on" not in HOST and HOST["restart"] == "unless-stopped"
    assert "postgres" not in env["DATABASE_URL"].split("@")[1]  # no compose service names
    assert HOST["volumes"][0].endswith(":/home/refloop/data")


def _compose(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("REFLOOP_", "TEMPORAL_", "OPENAI_"))}
    return subprocess.run(["docker-compose", *args], env={**base, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="no docker-compose (make test installs it)")
def test_docker_compose_config_accepts_both_files(tmp_path: Path):
    first = ["-f", str(ROOT / "docker-compose.yml")]
    for profile in ([], ["--profile", "fleet"]):
        done = _compose(*first, *profile, "config", "-q", env={"REFLOOP_API_TOKEN": "t"},
                        cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    second = ["-f", str(HOST_FILE), "config", "-q"]
    assert _compose(*second, env=HOST_ENV, cwd=tmp_path).returncode == 0
    for missing in HOST_ENV:
        done = _compose(*second, env={k: v for k, v in HOST_ENV.items() if k != missing},
                        cwd=tmp_path)
        assert done.returncode != 0 and missing in done.stderr, (missing, done.stderr)


@pytest.mark.skipif(not COMPOSE_SPEC.exists(), reason="no compose specification schema "
                    "(Debian's docker-compose carries it; make test installs it)")
def test_both_files_match_the_compose_specification():
    import json

    import jsonschema

    # Its $schema names draft 2019-09 with a trailing "#" jsonschema does not match.
    spec = jsonschema.Draft201909Validator(json.loads(COMPOSE_SPEC.read_text()))
    for path in (ROOT / "docker-compose.yml", HOST_FILE):
        spec.validate(yaml.safe_load(path.read_text()))
    broken = yaml.safe_load(HOST_FILE.read_text())
    broken["services"]["worker"]["depends_on"] = {"postgres": {"condition": "sometime"}}
    with pytest.raises(jsonschema.ValidationError):
        spec.validate(broken)
