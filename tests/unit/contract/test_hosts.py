"""Host choice, queue names and the waiting bound: pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from refloop.contract.hosts import (
    MAX_HOST_WAIT,
    UNKNOWN_HOST_POLL,
    CallClaim,
    CallClaimed,
    HostInfo,
    HostMove,
    HostRefused,
    UnknownHost,
    check_host,
    choose_host,
    claim_id,
    holds,
    host_queue,
    model_queue,
    needs_claim,
    next_wait,
    refuse_claim,
    refuse_move,
    unknown_host_pause,
)


def host(name: str, *roots: str, live: bool = True) -> HostInfo:
    return HostInfo(host_id=name, roots=list(roots), last_seen=datetime.now(UTC), live=live)


def test_queue_names_derive_from_the_shared_queue():
    assert host_queue("refloop", "a") == "refloop@a"
    assert model_queue("refloop") == "refloop.llm"


def test_holds_is_by_whole_path_components():
    assert holds(["/srv/ws"], "/srv/ws/x") and holds(["/srv/ws/"], "/srv/ws")
    assert not holds(["/srv/ws"], "/srv/wsx") and not holds(["/srv/ws"], "/srv/ws/../etc")


def test_the_one_host_holding_the_path_is_chosen_live_or_not():
    hosts = [host("a", "/a"), host("b", "/b"), host("down", "/d", live=False)]
    assert choose_host("/a/ws", hosts) == "a"
    assert choose_host("/d/ws", hosts) == "down"  # its task waits for it
    with pytest.raises(HostRefused, match=r"no host holds /c/ws; hosts: a \(live"):
        choose_host("/c/ws", hosts)
    with pytest.raises(HostRefused, match="several hosts hold /a/ws: a .*; old \\(not live"):
        choose_host("/a/ws", [*hosts, host("old", "/a", live=False)])


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


def test_an_unknown_host_is_asked_for_again_until_the_bound_is_spent():
    bound = timedelta(seconds=5)
    assert unknown_host_pause(timedelta(0), bound) == UNKNOWN_HOST_POLL
    assert unknown_host_pause(timedelta(seconds=4), bound) == timedelta(seconds=1)
    assert unknown_host_pause(bound, bound) is None
    with pytest.raises(UnknownHost, match="unknown host 'x'"):
        check_host("x", "/a", [host("a", "/a")])


def test_a_call_claimed_by_a_host_that_came_back_refuses_every_move():
    move = HostMove(host=host("b", "/ws"))
    waiting = {"claim-1": CallClaimed(host="a", activity="refloop.tool.run_cmd")}
    refuse_move("a", "/ws/t", "waiting_for_host", move, waiting)  # not claimed: it moves
    waiting["claim-1"].claimed = True
    with pytest.raises(ValueError, match="host 'a' is back and has started the call"):
        refuse_move("a", "/ws/t", "waiting_for_host", move, waiting)
    with pytest.raises(ValueError, match="not waiting_for_host"):
        refuse_move("a", "/ws/t", "running", move, {})


def test_only_a_call_still_waiting_for_its_own_host_can_be_claimed():
    waiting = {"claim-2": CallClaimed(host="a", activity="refloop.tool.run_cmd")}
    refuse_claim(waiting, CallClaim(activity_id="claim-2", host="a"))
    waiting["claim-2"].claimed = True  # asked again by a retried attempt: still its own
    refuse_claim(waiting, CallClaim(activity_id="claim-2", host="a"))
    with pytest.raises(ValueError, match="went to host 'a', not 'b'"):
        refuse_claim(waiting, CallClaim(activity_id="claim-2", host="b"))
    with pytest.raises(ValueError, match="taken back by a move, or ended"):
        refuse_claim(waiting, CallClaim(activity_id="claim-1", host="a"))
    with pytest.raises(ValueError, match="taken back"):  # a hostile id: cut in the message
        refuse_claim({}, CallClaim(activity_id="x" * 10_000, host="a"))


def test_claim_ids_are_told_apart_from_the_sdks_own():
    assert needs_claim(claim_id(3)) and claim_id(3) != claim_id(4)
    assert not needs_claim("3") and not needs_claim("")
