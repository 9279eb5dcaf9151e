"""The API's boundary: the Host header, body size (streamed, chunked included), NUL
bytes, JSON that Python accepts but JSON does not (NaN, lone surrogates), short 422s.

A pure ASGI middleware reads the body as it arrives and stops at MAX_BODY_BYTES, so a
chunked upload without Content-Length is refused the same way, never buffered whole.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import operator
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1_000_000
# Bounds checked before any parse: 90,000 unknown keys took 3.6 s on the event loop to
# become a 422 (parse, validation, one error each), stalling every other request.
MAX_JSON_MEMBERS = 10_000  # object members and array items, all levels together
MAX_JSON_DEPTH = 64
# The shape scan's unit of event-loop work: the server reads up to 256 KB at once, and
# other requests run between two slices of it (about 0.1 ms each).
SHAPE_SLICE_BYTES = 16_384
ECHO_CHARS = 80  # a 422 quotes at most this much of the offending input


LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(header: bytes) -> str:
    """`Host` without its port, lower-cased: "[::1]:8000" -> "::1"."""
    host = header.decode("latin-1").strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def allowed_hosts(extra: str | None) -> frozenset[str]:
    """Loopback names plus REFLOOP_ALLOWED_HOSTS (comma-separated; `*`: any)."""
    names = {part.strip().lower().strip("[]") for part in (extra or "").split(",")}
    return LOOPBACK_HOSTS | {name for name in names if name}


class HostGuard:
    """421 for a Host header not on the allowlist, on every route: a page on another site
    whose name is rebound to 127.0.0.1 (DNS rebinding) reaches a loopback API without a
    token, but its requests carry that site's name."""

    def __init__(self, app: ASGIApp, hosts: Callable[[], frozenset[str]]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            allowed = self.hosts()
            header = dict(scope.get("headers") or []).get(b"host", b"")
            if "*" not in allowed and host_name(header) not in allowed:
                await _send_json(send, 421, "this server does not answer for that Host "
                                            "(REFLOOP_ALLOWED_HOSTS)")
                return
        await self.app(scope, receive, send)


async def _send_json(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


class NotJson(ValueError):
    """A value Python's json module accepts but JSON has not (NaN, Infinity)."""


def _refuse_constant(name: str) -> Any:
    raise NotJson(f"{name} is not a JSON number")


def _has_surrogate(value: Any) -> bool:
    """A lone UTF-16 surrogate ("\\ud800"): valid JSON escapes, but no text can hold it
    (UTF-8 encoding of it fails in the database and in every answer)."""
    if isinstance(value, str):
        return any("\ud800" <= ch <= "\udfff" for ch in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def unrepresentable_json(body: bytes) -> str | None:
    """Why a JSON body holds what no stored or answered value can, or None (also for a body
    that is not JSON at all: validation answers that one)."""
    if not body.strip():
        return None
    try:
        parsed = json.loads(body, parse_constant=_refuse_constant)
    except NotJson as err:
        return str(err)
    except (ValueError, RecursionError):
        return None
    if _has_surrogate(parsed):
        return "a string holds a lone UTF-16 surrogate"
    return None


def nul_in_request(path: str, query: bytes, body: bytes) -> str | None:
    """Where a NUL byte hides in the request, or None. Stored strings never hold one
    (PostgreSQL refuses them), so they stop here with a 422 instead of a 500."""
    if "\x00" in path:  # the ASGI path is already percent-decoded
        return "the path"
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    if any("\x00" in k or "\x00" in v for k, v in pairs):
        return "the query string"
    if b"\x00" in body:
        return "the body"
    if b"\\u0000" in body.lower():
        try:
            parsed = json.loads(body)
        except ValueError:
            return None  # not JSON: validation answers it
        if _has_nul(parsed):
            return "the body"
    return None


_NOT_STRUCTURE = bytes(range(256)).translate(None, b'"{}[],')  # for translate(None, ...)
_NOT_BRACKETS = bytes(range(256)).translate(None, b"{}[]")
_STEP = bytes.maketrans(b"{[}]", b"\x02\x02\x00\x00")  # an opening +1, a closing -1 (less 1)


class JsonShape:
    """The structure of a JSON body counted as it streams in, chunk by chunk: members
    (object members and array items) and nesting outside strings. The first bound passed
    stops the read there (a body of 90,000 keys is refused after its first ~110 KB).

    Every step runs in C over the whole chunk, never per token in Python:
    - escapes are dropped (`\\\\` pairs, then `\\"`), as JSON pairs them, left to right;
    - every byte but `"{}[],` is dropped, then every `""`: a string without structure in it
      leaves nothing, and two adjacent quotes bound an empty stretch, so the parity of the
      quotes after them is unchanged;
    - only strings that hold structure are left: the rest is split at its quotes (every
      other piece is inside a string), then counted by `bytes.count`; the depth is followed
      (only when it could pass the bound) by `itertools.accumulate`.
    A 64 KB chunk of the 90,000-key body costs about 0.1 ms; the token-by-token loop this
    replaces took ~15 ms of event-loop time per refused body (far more on a loaded
    machine), which held /healthz's p99 over 100 ms under ten such clients. A body that
    is not JSON may be miscounted; validation refuses it anyway."""

    def __init__(self, max_members: int = MAX_JSON_MEMBERS,
                 max_depth: int = MAX_JSON_DEPTH) -> None:
        self.max_members, self.max_depth = max_members, max_depth
        self.members = self.depth = 0
        self.in_string = False
        self.skip = False  # the next chunk's first byte is escaped (a chunk ended in `\`)

    def feed(self, chunk: bytes) -> str | None:
        """Why the body so far passes a bound, or None."""
        if self.skip and chunk:
            chunk, self.skip = chunk[1:], False
        if b"\\" in chunk:
            chunk = chunk.replace(b"\\\\", b"").replace(b'\\"', b"")
            if chunk.endswith(b"\\"):  # an escape the chunk's end cut: its byte comes next
                chunk, self.skip = chunk[:-1], True
        outside = chunk.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
        if b'"' in outside:
            pieces = outside.split(b'"')
            outside = b"".join(pieces[1 if self.in_string else 0::2])
            self.in_string ^= len(pieces) % 2 == 0
        elif self.in_string:  # the whole chunk is inside one string
            outside = b""
        opens = outside.count(b"{") + outside.count(b"[")
        self.members += opens + outside.count(b",")
        if self.depth + opens > self.max_depth:
            steps = outside.translate(_STEP, _NOT_BRACKETS)
            deepest = max(map(operator.sub, itertools.accumulate(steps, initial=self.depth),
                              itertools.count(0)), default=self.depth)
            if deepest > self.max_depth:
                return f"the body nests JSON deeper than {self.max_depth} levels"
        self.depth += opens - outside.count(b"}") - outside.count(b"]")
        if self.members > self.max_members:
            return f"the body has more than {self.max_members} JSON members"
        return None


def json_shape_refusal(body: bytes, max_members: int = MAX_JSON_MEMBERS,
                       max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why a whole body passes a bound of JsonShape, or None."""
    return JsonShape(max_members, max_depth).feed(body)


async def _scan(shape: JsonShape, chunk: bytes) -> str | None:
    """Feed a chunk to the scan slice by slice, letting the loop run others between two
    slices, and stop at the first bound passed (90,000 keys: after about 110 KB)."""
    for start in range(0, len(chunk), SHAPE_SLICE_BYTES):
        if start:
            await asyncio.sleep(0)
        if (refusal := shape.feed(chunk[start:start + SHAPE_SLICE_BYTES])) is not None:
            return refusal
    return None


class BoundaryGuard:
    """Body limit while streaming, then NUL bytes anywhere: 413 / 422 before any route."""

    def __init__(self, app: ASGIApp, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body:
            await _send_json(send, 413, f"body larger than {self.max_body} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        shape = JsonShape()
        more = scope["method"] not in ("GET", "HEAD", "DELETE", "OPTIONS")
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:  # chunked or lying Content-Length: stop reading here
                await _send_json(send, 413, f"body larger than {self.max_body} bytes")
                return
            if (too_big := await _scan(shape, chunk)) is not None:  # stop reading here too
                await _send_json(send, 413, too_big)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        where = nul_in_request(scope.get("path", ""), scope.get("query_string", b""), body)
        if where:
            await _send_json(send, 422, f"NUL bytes are not accepted ({where})")
            return
        if (why := unrepresentable_json(body)) is not None:
            await _send_json(send, 422, f"the body is not valid JSON text: {why}")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnects, for streaming responses

        await self.app(scope, replay, send)


def short_echo(value: Any) -> Any:
    if isinstance(value, bytes):  # a body that is not JSON: quoted as text
        value = value[:ECHO_CHARS * 4].decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value[:ECHO_CHARS] + ("…" if len(value) > ECHO_CHARS else "")
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):  # a 4,000-digit integer is quoted short too
        text = repr(value)
        return value if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "…"
    text = json.dumps(jsonable_encoder(value), ensure_ascii=False, default=str)
    return text[:ECHO_CHARS] + ("…" if len(text) > ECHO_CHARS else "")


async def short_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 shape, but each `input` cut to a short prefix (never the whole body)."""
    errors = []
    for error in exc.errors():
        item = {k: v for k, v in error.items() if k in ("type", "loc", "msg")}
        if "input" in error:
            item["input"] = short_echo(error["input"])
        errors.append(item)
    return JSONResponse({"detail": jsonable_encoder(errors[:20])}, status_code=422)


async def http_error(request: Request, exc: StarletteHTTPException) -> Any:
    """405 names every method of the path in `Allow` (Starlette names only the first
    route's, while /prompts has GET and POST on two routes); other statuses as FastAPI."""
    if exc.status_code == 405:
        methods: set[str] = set()
        for template, operations in request.app.openapi()["paths"].items():
            if compile_path(template)[0].match(request.url.path):
                methods |= {method.upper() for method in operations}
        if methods:
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(methods))}
    return await http_exception_handler(request, exc)
