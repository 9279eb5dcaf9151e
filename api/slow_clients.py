"""Slow clients are cut off: uvicorn's h11 protocol with read deadlines.

uvicorn times out only an idle keep-alive connection after a response; a client that
opens a connection and trickles its headers (slowloris) or its body holds a connection
for ever. Here a request must arrive whole, headers within `header_s` of its first byte
(or of the connection), body within `body_s` after its headers. The deadline stops once
the request is read: a long answer (an event stream) is never cut.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("refloop.api")


class DeadlineH11Protocol(H11Protocol):
    header_s: float = 10.0
    body_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._stage = ""

    def _arm(self, stage: str, seconds: float) -> None:
        self._disarm()
        self._stage = stage
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._stage = ""

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.info("closed a connection whose request %s did not arrive in time", self._stage)
        self.transport.close()

    def _follow(self) -> None:
        """Move the deadline with the request's progress."""
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._stage != "headers" and self.timeout_keep_alive_task is None:
                self._arm("headers", self.header_s)
        elif state is h11.SEND_BODY:
            if self._stage != "body":
                self._arm("body", self.body_s)
        else:  # read whole (DONE), or closing: the app's answer is not timed
            self._disarm()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers", self.header_s)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.transport.is_closing():
            self._follow()

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()  # arms uvicorn's keep-alive timeout

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_with(header_s: float, body_s: float) -> type[DeadlineH11Protocol]:
    return type("RefloopH11Protocol", (DeadlineH11Protocol,),
                {"header_s": header_s, "body_s": body_s})
