"""A model endpoint that is down is waited out, not failed: the decisions (which errors an
endpoint may recover from, how long to wait before the next try) and the per-worker gate
through which every request of a waiting call goes.

A call never waits inside its activity attempt. While an endpoint is known down, one
request of this worker probes it (backing off up to `REFLOOP_MODEL_PROBE_S`, longer when
the endpoint's `Retry-After` says so): the probing call's attempts retry on Temporal's
side, sending one request each. Every other call is parked: its attempt ends at once,
sending nothing (`EndpointParked`), and its task waits in the workflow (no slot, no
attempts, a timer) until this worker sees the endpoint answer and wakes the parked tasks,
or its recheck comes. N workers send at most N probes per interval.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from refloop.contract.errors import LLMError, ModelUnavailable, unavailable_message

# A Retry-After beyond this is read as this (a hostile or confused endpoint cannot park a
# task for a year; the outage bound still applies).
RETRY_AFTER_CAP_S = 15 * 60.0


def recoverable(err: LLMError) -> bool:
    """An error the endpoint may recover from (refused, reset, timed out, 5xx, 408/409/429,
    401/403, a garbled or empty answer): waited out. Everything else (400, 404, 422: the
    request itself, or a model it does not serve) fails the call at once."""
    return err.retryable


def probe_delay(failures: int, retry_after: float | None, probe_s: float) -> float:
    """Seconds from a failed probe to the next: doubling from an eighth of `probe_s` up to
    `probe_s`; a longer `Retry-After` is honoured (up to RETRY_AFTER_CAP_S)."""
    backoff = min(probe_s, probe_s / 8 * 2 ** max(failures - 1, 0))
    if retry_after:
        return max(backoff, min(retry_after, RETRY_AFTER_CAP_S))
    return backoff


def release_spread(probe_s: float) -> float:
    """The window over which waiting requests go once the endpoint answers again."""
    return min(1.5, probe_s / 4)


def parked_recheck_s(probe_s: float) -> float:
    """A parked call's first recheck (its task doubles it each time it parks again, up to
    a cap of its own): a fallback, since the probe's answer wakes it."""
    return 20 * probe_s


def wait_bound(status: int | None, bound_s: float, auth_bound_s: float | None
               ) -> tuple[float, str]:
    """How long a call waits for its endpoint, and the setting that says so: a refused
    key (401/403) its own shorter bound."""
    if status in (401, 403) and auth_bound_s is not None and auth_bound_s < bound_s:
        return auth_bound_s, "REFLOOP_MODEL_AUTH_WAIT_S"
    return bound_s, "REFLOOP_MODEL_OUTAGE_S"


def outage_over(waited_s: float, bound_s: float) -> bool:
    return waited_s >= bound_s


def endpoint_name(base_url: str) -> str:
    """The endpoint as messages name it: its URL without credentials or query."""
    try:
        parts = urlsplit(base_url)
    except ValueError:
        return "the model endpoint"
    if not parts.scheme:
        return base_url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass
class EndpointDown:
    """What this worker knows of one endpoint that is down."""

    since: float  # monotonic
    last_error: str
    last_status: int | None = None
    failures: int = 0  # failed probes in a row
    next_probe: float = 0.0  # monotonic
    probing: bool = False
    parked: set[str] = field(default_factory=set)  # who to wake when it answers
    # This outage, as against an earlier one at this endpoint: a call told its task of an
    # earlier one (which another request's answer ended) tells it again
    episode: str = field(default_factory=lambda: secrets.token_hex(6))
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass(frozen=True)
class Turn:
    """How a request got through the gate: `probe` when it tries a down endpoint for
    everyone waiting on it."""

    probe: bool = False


class EndpointGates:
    """Per endpoint (base URL) on this worker: up, or down with one probe at a time."""

    def __init__(self, probe_s: float, rng: random.Random | None = None) -> None:
        self.probe_s = probe_s
        self.rng = rng or random.Random()
        self.down: dict[str, EndpointDown] = {}

    def is_down(self, base_url: str) -> bool:
        return base_url in self.down

    def try_turn(self, base_url: str) -> Turn | None:
        """A request to `base_url` may go now (as the probe, when it is down and a probe is
        due); None: it is down and not this request's turn."""
        state = self.down.get(base_url)
        if state is None:
            return Turn()
        if not state.probing and time.monotonic() >= state.next_probe:
            state.probing = True
            return Turn(probe=True)
        return None

    def retry_in(self, base_url: str) -> float:
        """Seconds until a call that could not go should try again: the next probe (or a
        quarter interval while one is out), spread so the waiting calls do not all come at
        once."""
        state = self.down.get(base_url)
        spread = self.rng.uniform(0, release_spread(self.probe_s))
        if state is None:
            return 0.1 + spread
        if state.probing:
            return self.probe_s / 4 + spread
        return max(state.next_probe - time.monotonic(), 0.1) + spread

    def park(self, base_url: str, waiter: str) -> float:
        """A call of `waiter` (its workflow) waits for the endpoint outside any attempt: it
        is woken when the endpoint answers here. The seconds after which it calls again
        if nobody wakes it (its probe gone, the worker restarted)."""
        state = self.down.get(base_url)
        if state is not None:
            state.parked.add(waiter)
        return parked_recheck_s(self.probe_s)

    def episode(self, base_url: str) -> str | None:
        """The outage of `base_url` as this worker sees it now (None: it is up here)."""
        state = self.down.get(base_url)
        return state.episode if state is not None else None

    def last_error(self, base_url: str) -> str:
        state = self.down.get(base_url)
        return state.last_error if state is not None else ""

    def last_status(self, base_url: str) -> int | None:
        state = self.down.get(base_url)
        return state.last_status if state is not None else None

    def failed(self, base_url: str, turn: Turn, err: LLMError) -> None:
        """A request failed in a way the endpoint may recover from. A failed probe (or the
        first failure) sets the next probe's time; others only update the last error."""
        now = time.monotonic()
        state = self.down.get(base_url)
        if state is None:
            state = self.down[base_url] = EndpointDown(since=now, last_error=str(err))
        state.last_error = str(err)
        state.last_status = err.status
        if turn.probe or state.failures == 0:
            state.failures += 1
            state.probing = False
            state.next_probe = now + probe_delay(state.failures, err.retry_after, self.probe_s)
        elif err.retry_after:
            state.next_probe = max(state.next_probe, now + min(err.retry_after,
                                                               RETRY_AFTER_CAP_S))
        state.notify()

    def answered(self, base_url: str) -> set[str] | None:
        """The endpoint answered (any answer, even a refusal of this request): it is up.
        The calls parked on it here, to wake (None: it was not down here)."""
        state = self.down.pop(base_url, None)
        if state is None:
            return None
        state.notify()
        return state.parked

    def abandoned(self, base_url: str, turn: Turn) -> None:
        """The probe ended without a verdict (cancelled): the next waiting request probes."""
        state = self.down.get(base_url)
        if state is not None and turn.probe:
            state.probing = False
            state.notify()


# What the calling activity does when its call has to wait, and when the endpoint is back.
Notify = Callable[[dict[str, object]], Awaitable[None]]
# Wake the tasks parked on an endpoint that answers again: its name, and the workflows
# parked on it at this worker.
Wake = Callable[[str, set[str]], None]


class OutageWatch:
    """One model call's outage: when its wait began (carried across attempts in the
    activity's heartbeat) and who is told. The bound is the worker's setting, which the
    gateway passes."""

    def __init__(self, since: float | None = None, notify: Notify | None = None,
                 clock: Callable[[], float] = time.time, waiter: str | None = None,
                 told_episode: str | None = None) -> None:
        self.since = since  # wall-clock start of the wait (None: not waiting)
        self.notify = notify
        self.waiter = waiter  # the workflow a parked call's task is (None: it cannot park)
        self.clock = clock
        self.told = since is not None  # an earlier attempt of the call told its task
        self.told_episode = told_episode  # of which outage (None: not known)
        self.endpoint = ""
        self.status: int | None = None  # the HTTP status of the last failure, if any

    async def waiting(self, endpoint: str, error: str, bound_s: float,
                      status: int | None = None, auth_bound_s: float | None = None,
                      episode: str | None = None) -> None:
        """The call waits for `endpoint` (its own request failed, or a probe is out):
        tell once an outage (`episode`: another task's answer in between ended the wait
        its task was told of, and woke it); past the bound (a refused key's shorter one for
        401/403), give up naming the endpoint and its last error."""
        now = self.clock()
        if self.since is None:
            self.since = now
        self.endpoint = endpoint
        waited = now - self.since
        bound_s, setting = wait_bound(status, bound_s, auth_bound_s)
        if outage_over(waited, bound_s):
            if self.notify is not None:  # the time waited still goes into the task's stats
                await self.notify({"waiting": False, "endpoint": endpoint, "gave_up": True,
                                   "waited_s": round(waited, 3)})
            raise ModelUnavailable(unavailable_message(endpoint, waited, setting, bound_s,
                                                       error))
        again = episode is not None and self.told_episode not in (None, episode)
        if (not self.told or again) and self.notify is not None:
            self.told = True
            self.told_episode = episode
            await self.notify({"waiting": True, "endpoint": endpoint, "error": error[:500],
                               "since": self.since})

    async def back(self) -> float:
        """The endpoint answered: the seconds waited (0 when the call never waited)."""
        if self.since is None:
            return 0.0
        waited = max(self.clock() - self.since, 0.0)
        self.since = None
        if self.notify is not None:
            await self.notify({"waiting": False, "endpoint": self.endpoint,
                               "waited_s": round(waited, 3)})
        self.told = False
        self.told_episode = None
        return waited


current_watch: ContextVar[OutageWatch | None] = ContextVar("refloop_outage_watch",
                                                           default=None)
