"""An ASGI app served by uvicorn on a thread of this process (the scripted model, test servers)."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

KEEP_ALIVE_S = 75


def serve_in_thread(app: FastAPI, host: str, port: int, name: str
                    ) -> tuple[uvicorn.Server, threading.Thread, int]:
    """An HTTP app in a background thread with its own event loop; returns the bound port."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                            timeout_keep_alive=KEEP_ALIVE_S)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name=name)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"{name} server did not start")
        time.sleep(0.02)
    return server, thread, server.servers[0].sockets[0].getsockname()[1]


class ThreadedServer:
    """An OpenAI-style app served in a background thread with its own event loop; `start`
    answers its `/v1` base URL."""

    name = "server"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.base_url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def app(self) -> FastAPI:
        raise NotImplementedError

    def start(self) -> str:
        self._server, self._thread, port = serve_in_thread(self.app(), self.host, self.port,
                                                           self.name)
        self.base_url = f"http://{self.host}:{port}/v1"
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
