"""A model endpoint that answers a redirect: refloop never follows it (the openai client's
httpx client did, re-posting the whole prompt to the Location, 47 times across hops), and
the task gets one clear, non-retryable error naming the endpoint and the Location."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from refloop.contract.activity_io import ModelEndpoint
from refloop.contract.errors import ModelRedirected
from refloop.contract.messages import ChatMessage, Purpose
from refloop.llm.gateway import LLMGateway
from refloop.llm.outage import endpoint_name
from refloop.settings import Settings
from tests.llm_fixtures import unique_scenario

PROMPT = "a secret prompt " * 64  # 1 KB that must reach no other origin


@pytest.fixture
def redirecting(scripted_llm) -> Iterator[tuple[str, list[str]]]:
    """An endpoint answering every POST with a redirect to the scripted model (a live
    listener that would answer): (its base URL, the paths it was asked for)."""
    seen: list[str] = []
    target = f"{scripted_llm.base_url.rstrip('/')}/chat/completions"

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append(self.path)
            code = 308 if len(seen) % 2 else 307
            self.send_response(code)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("stream", ["off", "auto"])
async def test_a_redirect_is_refused_and_the_prompt_goes_nowhere_else(
        redirecting, scripted_llm, stream):
    base_url, seen = redirecting
    model = unique_scenario(scripted_llm, {"act": [{"content": "answered"}]}, repeat=True)
    gateway = LLMGateway(Settings(openai_base_url=base_url, openai_api_key="k",
                                  refloop_llm_stream=stream))
    user = [ChatMessage(role="user", content=PROMPT)]
    with pytest.raises(ModelRedirected) as raised:
        await gateway.chat(Purpose.act, user, model=model)
    err = raised.value
    assert not err.retryable and err.status in (307, 308)
    assert endpoint_name(base_url) in str(err) and "redirecting to http" in str(err)
    assert "/v1/chat/completions" in str(err)  # the Location, which was not followed
    assert scripted_llm.requests(model=model) == []  # the target never saw the prompt
    assert seen == ["/v1/chat/completions"]  # asked once, no re-post

    # A task's model config on another base URL: the same refusal.
    endpoint = ModelEndpoint(model=model, base_url=base_url)
    with pytest.raises(ModelRedirected):
        await gateway.chat(Purpose.act, user, model=model, endpoint=endpoint)
    assert scripted_llm.requests(model=model) == [] and len(seen) == 2
