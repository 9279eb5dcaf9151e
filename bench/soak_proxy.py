"""A fault-injecting HTTP proxy between the workers and a model endpoint: it passes bytes
through, or answers every request itself with an error or garbage, so a soak breaks the
model the way real endpoints break without touching the product's code.

Modes: `pass`; `5xx` (HTTP 500 with an error body); `garbage` (HTTP 200 whose body is a
JSON answer cut short, with bytes that are not UTF-8). A mode change cuts the open
connections, so a client's kept-alive connection meets the new mode at once.
"""

from __future__ import annotations

import asyncio
import contextlib

MODES = ("pass", "5xx", "garbage")
SERVER_ERROR = (b'{"error": {"message": "soak: the endpoint is failing", '
                b'"type": "server_error"}}')
GARBAGE = b'{"id": "chatcmpl-soak", "object": "chat.completion", "choices": [{"ind\xff\xfe\xc3'


def canned(mode: str) -> bytes:
    """The whole HTTP response a faulty endpoint sends in `mode`."""
    status, body = ("500 Internal Server Error", SERVER_ERROR) if mode == "5xx" \
        else ("200 OK", GARBAGE)
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class ModelFaultProxy:
    def __init__(self, target_port: int, port: int) -> None:
        self.target_port = target_port
        self.port = port
        self.mode = "pass"
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.answered = {mode: 0 for mode in MODES}  # requests (faults) or connections

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self._cut()

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self._cut()

    def _cut(self) -> None:
        for writer in list(self.writers):
            writer.close()
        self.writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            if self.mode == "pass":
                await self._pipe_to_target(reader, writer)
            else:
                await self._answer_faults(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    async def _answer_faults(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        mode = self.mode
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip() or 0)
        await reader.readexactly(length)
        self.answered[mode] += 1
        writer.write(canned(mode))
        await writer.drain()

    async def _pipe_to_target(self, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port)
        except OSError:
            return  # the endpoint is down: the client sees the connection close
        self.answered["pass"] += 1
        self.writers.add(target_writer)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        try:
            await asyncio.gather(pipe(reader, target_writer), pipe(target_reader, writer))
        finally:
            self.writers.discard(target_writer)
            target_writer.close()
