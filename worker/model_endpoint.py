"""The model endpoint a worker calls: the configured one, or the scripted offline model
(started for the process's lifetime, said loudly)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from importlib import resources

from refloop.settings import Settings

log = logging.getLogger("refloop.stack")

DEMO_SCENARIO = "demo.yaml"


def demo_scenario_path() -> str:
    return str(resources.files("refloop") / "scenarios" / DEMO_SCENARIO)


@contextlib.contextmanager
def model_endpoint(settings: Settings) -> Iterator[Settings]:
    """Settings with a model endpoint: the configured one, or the scripted offline model."""
    if not settings.uses_scripted_model:
        yield settings
        return
    from refloop.llm.scripted import ScriptedLLMServer  # FastAPI: only for the test double

    server = ScriptedLLMServer(demo_scenario_path(), port=settings.refloop_scripted_port)
    url = server.start()
    log.warning(
        "OPENAI_BASE_URL is unset: using the SCRIPTED offline model at %s (scenario %s). "
        "Its answers are canned test-double output, not a real model.",
        url,
        DEMO_SCENARIO,
    )
    try:
        yield settings.model_copy(update={"openai_base_url": url})
    finally:
        server.stop()
