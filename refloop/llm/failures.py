"""How a failed model request is classified: errors the endpoint may recover from (waited
out, with the server's retry hints) or errors no wait can fix (the call fails at once).
Every message names the endpoint; none is a Python exception's name.
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime

import openai

from refloop.contract.errors import LLMClientError, LLMError, LLMTransportError
from refloop.llm.endpoint import refuses_shape
from refloop.llm.window import length_refusal

log = logging.getLogger("refloop.llm")
ERROR_CLASS_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}")
def _body_text(err: openai.APIStatusError) -> str:
    try:
        return err.response.text if err.response is not None else str(err)
    except Exception:  # a streamed or closed body
        return str(err)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the endpoint asks us to wait: `retry-after-ms`, else `Retry-After` in
    seconds or as an HTTP date (as the openai client reads them)."""
    try:
        if (millis := headers.get("retry-after-ms")) is not None:
            return max(float(millis) / 1000, 0.0) or None
    except ValueError:
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0) or None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max((when - datetime.now(UTC)).total_seconds(), 0.0) or None


def should_retry(headers: Mapping[str, str]) -> bool | None:
    """The endpoint's own verdict (`x-should-retry: true|false`), which overrides the
    status code's; None when it gives none."""
    value = (headers.get("x-should-retry") or "").strip().lower()
    return {"true": True, "false": False}.get(value)


def error_class(err: openai.APIStatusError) -> str:
    """A short class for the failure: the body's `code` or `type` when it is an identifier
    (`scenario_exhausted`, `invalid_request_error`), else the client's exception name."""
    for value in (getattr(err, "code", None), getattr(err, "type", None)):
        if isinstance(value, str) and ERROR_CLASS_RE.fullmatch(value):
            return value
    return type(err).__name__


# Statuses a wait may fix besides 5xx. 401/403: the key was refused; keys get rotated, so
# the task waits (with that said) until workers run with a valid one or the bound passes.
RECOVERABLE_STATUSES = frozenset({401, 403, 408, 409, 429})
REFUSED_KEY_STATUSES = frozenset({401, 403})


def classify(err: Exception, endpoint: str = "the model endpoint") -> LLMError:
    """Map an openai exception onto our recoverable (`LLMTransportError`: waited out) and
    permanent (`LLMClientError`) errors; each message names `endpoint`."""
    if isinstance(err, openai.APITimeoutError):
        return LLMTransportError(f"{endpoint} timed out (no answer within the client timeout)")
    if isinstance(err, openai.APIConnectionError):
        return LLMTransportError(f"{endpoint} unreachable ({_connection_failure(err)})")
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        # The endpoint's own words stay in the worker log: a body can be anything a URL
        # chosen by an API client answers (an internal page), and task errors reach clients.
        message = f"HTTP {status} from {endpoint} ({error_class(err)})"
        if status in REFUSED_KEY_STATUSES:
            message += ": the endpoint refuses the API key; waiting for a valid one"
        body = _body_text(err)
        log.warning("%s: %s", message, " ".join(body.split())[:2000])
        headers = err.response.headers if err.response is not None else {}
        verdict = should_retry(headers)
        if verdict is None:
            # llama-cpp-python answers a request it cannot parse with a 500 ("validation
            # error", or naming the field), and llama.cpp once answered a prompt too long
            # for its window so: retrying the same request cannot help.
            verdict = (status in RECOVERABLE_STATUSES or status >= 500) and not (
                refuses_shape(status, body) or length_refusal(status, body) is not None)
        if verdict:
            error: LLMError = LLMTransportError(message, status, retry_after(headers))
        else:
            error = LLMClientError(message, status)
        error.body = body
        return error
    if isinstance(err, (UnicodeDecodeError, json.JSONDecodeError)):
        return garbled(err, endpoint)
    log.warning("model call failed: %r", err)
    return LLMTransportError(f"{endpoint}: the call failed ({type(err).__name__})")


def garbled(err: UnicodeDecodeError | json.JSONDecodeError, endpoint: str) -> LLMTransportError:
    """A success status with a body that is not UTF-8 or not JSON: the endpoint's fault,
    said as such. Where in the body and what byte go in the message; the excerpt itself
    only in the worker log (a body from a URL an API client chose may be an internal page)."""
    if isinstance(err, UnicodeDecodeError):
        data = bytes(err.object)
        bad = data[err.start:err.start + 1].hex() or "end"
        what = (f"a body that is not UTF-8 (byte 0x{bad} at offset {err.start} of "
                f"{len(data)})")
        excerpt = data[max(err.start - 40, 0):err.start + 40]
    else:
        what = (f"a body that is not valid JSON ({err.msg} at offset {err.pos} of "
                f"{len(err.doc)})" if err.doc.strip() else "an empty body")
        excerpt = err.doc[max(err.pos - 40, 0):err.pos + 40].encode()
    message = f"{endpoint} answered HTTP 2xx with {what}"
    log.warning("%s: %r", message, excerpt)
    error = LLMTransportError(message, 200)
    error.body = repr(excerpt)
    return error


def _connection_failure(err: openai.APIConnectionError) -> str:
    """"connection refused", "connection reset", ...: what the transport said, short."""
    cause = err.__cause__
    while cause is not None and cause.__cause__ is not None and not str(cause):
        cause = cause.__cause__
    words = " ".join(str(cause).split()).lower() if cause is not None else ""
    for said in ("refused", "reset", "closed", "name or service not known", "timed out"):
        if said in words:
            return f"connection {said}" if said in ("refused", "reset", "closed") else said
    return "connection failed"


def abandoned_by(err: openai.OpenAIError) -> bool:
    """The request went out and its answer never came: a timeout, or a connection lost
    after it was sent (a refused connection reached no server)."""
    if isinstance(err, openai.APITimeoutError):
        return True
    return (isinstance(err, openai.APIConnectionError)
            and not isinstance(err.__cause__, _connect_errors()))


def _connect_errors() -> tuple[type[Exception], ...]:
    """The transport's "could not connect": httpx2's (openai 3), httpx's (openai 1 and 2).
    Whichever raised it is loaded; neither is imported for this."""
    return tuple(module.ConnectError for name in ("httpx2", "httpx")
                 if (module := sys.modules.get(name)) is not None)
