"""Binding off loopback never serves unauthenticated: without REFLOOP_API_TOKEN a token is
generated and printed with the console URL (as Jupyter does)."""

from __future__ import annotations

import ipaddress
import secrets

from refloop.settings import Settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def with_bind_host(settings: Settings, host: str) -> Settings:
    """The address the API binds to is a Host it answers for (a wildcard bind names none:
    REFLOOP_ALLOWED_HOSTS then lists the names clients use)."""
    if host in ("0.0.0.0", "::", "") or is_loopback(host):
        return settings
    hosts = ",".join(filter(None, (settings.refloop_allowed_hosts, host.strip("[]"))))
    return settings.model_copy(update={"refloop_allowed_hosts": hosts})


def secure_bind(settings: Settings, host: str) -> tuple[Settings, str | None]:
    """(settings to serve with, the generated token or None when none was needed)."""
    settings = with_bind_host(settings, host)
    if settings.refloop_api_token or is_loopback(host):
        return settings, None
    token = secrets.token_urlsafe(24)
    return settings.model_copy(update={"refloop_api_token": token}), token


def console_url(host: str, port: int, token: str | None) -> str:
    shown = "localhost" if host in ("0.0.0.0", "::") else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/ui/" + (f"#token={token}" if token else "")
