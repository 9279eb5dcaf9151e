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
    assert SERVICES["api"]["ports"] == ["8000:8000"] and "healthcheck" in SERVICES["api"]
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
