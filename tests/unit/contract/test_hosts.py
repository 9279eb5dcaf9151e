"""Host choice, queue names and the waiting bound: pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from refloop.contract.hosts import (
    MAX_HOST_WAIT,
    HostInfo,
    HostRefused,
    check_host,
    choose_host,
    holds,
    host_queue,
    model_queue,
    next_wait,
)


def host(name: str, *roots: str, live: bool = True) -> HostInfo:
    return HostInfo(host_id=name, roots=list(roots), last_seen=datetime.now(UTC), live=live)


def test_queue_names_derive_from_the_shared_queue():
    assert host_queue("refloop", "a") == "refloop@a"
    assert model_queue("refloop") == "refloop.llm"


def test_holds_is_by_whole_path_components():
    assert holds(["/srv/ws"], "/srv/ws/x") and holds(["/srv/ws/"], "/srv/ws")
    assert not holds(["/srv/ws"], "/srv/wsx") and not holds(["/srv/ws"], "/srv/ws/../etc")


def test_the_one_live_host_holding_the_path_is_chosen():
    hosts = [host("a", "/a"), host("b", "/b"), host("old", "/a", live=False)]
    assert choose_host("/a/ws", hosts) == "a"
    with pytest.raises(HostRefused, match=r"no live host holds /c/ws; hosts: a \(live"):
        choose_host("/c/ws", hosts)
    with pytest.raises(HostRefused, match="several live hosts hold /a/ws: a, b2"):
        choose_host("/a/ws", [*hosts, host("b2", "/a")])


def test_a_named_host_must_be_known_and_hold_the_path_live_or_not():
    hosts = [host("a", "/a"), host("old", "/o", live=False)]
    assert choose_host("/o/ws", hosts, requested="old") == "old"
    with pytest.raises(HostRefused, match="unknown host 'x'; known hosts: a"):
        check_host("x", "/a/ws", hosts)
    with pytest.raises(HostRefused, match=r"host 'old' does not hold /a/ws .*holding it: a"):
        check_host("old", "/a/ws", hosts)


def test_the_wait_for_a_host_doubles_up_to_a_cap():
    assert next_wait(timedelta(seconds=60)) == timedelta(seconds=120)
    assert next_wait(MAX_HOST_WAIT) == MAX_HOST_WAIT
