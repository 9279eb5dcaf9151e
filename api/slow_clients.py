"""Slow clients are cut off: uvicorn's httptools protocol with read deadlines.

uvicorn times out only an idle keep-alive connection after a response; a client that
opens a connection and trickles its headers (slowloris) or its body holds a connection
for ever. Here a request must arrive whole, headers within `header_s` of its first byte
(or of the connection), body within `body_s` after its headers. The deadline stops once
the request is read: a long answer (an event stream) is never cut. A body still arriving
after its answer (a 413 sent before the whole body was read) stays under its deadline.

httptools parses in C: the h11 protocol this replaces parsed every body byte in Python on
the event loop, so ten clients sending 1 MB bodies held /healthz's p99 near a second.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("refloop.api")


class DeadlineHttpToolsProtocol(HttpToolsProtocol):
    header_s: float = 10.0
    body_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._stage = ""
        self._reading = False  # between a request's first byte and its last

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

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers", self.header_s)

    # The parser's callbacks, called from data_received as the bytes arrive.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = True
        if self._stage != "headers":  # else the connection's own deadline runs on
            self._arm("headers", self.header_s)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm("body", self.body_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = False
        self._disarm()  # read whole: the app's answer is not timed

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timeout
        if not self._reading:
            self._disarm()
        elif self._stage != "body":  # answered early: the rest of the body stays timed
            self._arm("body", self.body_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_with(header_s: float, body_s: float) -> type[DeadlineHttpToolsProtocol]:
    return type("RefloopHttpProtocol", (DeadlineHttpToolsProtocol,),
                {"header_s": header_s, "body_s": body_s})
