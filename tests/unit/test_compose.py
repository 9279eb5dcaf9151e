"""docker-compose.yml wiring, checked without Docker (no engine on these machines)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_services_and_pinned_images():
    assert {"postgres", "temporal", "temporal-ui", "worker", "api"} <= set(SERVICES)
    for name, service in SERVICES.items():
        if "image" in service:
            assert ":" in service["image"] and not service["image"].endswith(":latest"), name
        else:
            assert service["build"] == "." and (ROOT / "Dockerfile").exists()


def test_temporal_persists_in_postgresql_and_ui_points_at_it():
    env = SERVICES["temporal"]["environment"]
    assert env["DB"].startswith("postgres") and env["POSTGRES_SEEDS"] == "postgres"
    assert SERVICES["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_refloop_services_wait_for_healthy_dependencies_and_share_settings():
    for name in ("worker", "api"):
        service = SERVICES[name]
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert service["depends_on"]["temporal"]["condition"] == "service_healthy"
        env = service["environment"]
        assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
        assert env["DATABASE_URL"].startswith("postgresql+psycopg://")
    assert SERVICES["api"]["ports"] == ["8000:8000"] and "healthcheck" in SERVICES["api"]
    assert all("healthcheck" in SERVICES[name] for name in ("postgres", "temporal"))
