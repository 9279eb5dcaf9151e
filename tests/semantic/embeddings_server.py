"""A local OpenAI-compatible `/v1/embeddings` server over the packaged model
(all-MiniLM-L6-v2, int8 ONNX), as Ollama, llama.cpp or a TEI server would serve it: JSON
in, float or base64 vectors out. It can fail its first requests (503) and answers 404 for
a model it does not serve; it counts the requests it had in flight at once, and keeps what
each request sent (`sent`: its model, texts and input_type)."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from refloop.search.embedders import embedder

SERVED_MODEL = "all-MiniLM-L6-v2"


class EmbeddingsServer:
    def __init__(self, fail_first: int = 0, delay_s: float = 0.0) -> None:
        self.fail_first = fail_first
        self.delay_s = delay_s
        self.requests = 0
        self.texts = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.sent: list[dict] = []  # each request's body, as it came
        self._lock = threading.Lock()
        # loaded before serving: a client loading an endpoint model in this process holds
        # the model-loading lock while it probes the endpoint
        self._model = embedder("minilm-int8")
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> EmbeddingsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (the http.server interface)
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests += 1
                    server.sent.append(request)
                    failing = server.requests <= server.fail_first
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                try:
                    if self.path != "/v1/embeddings":
                        return self._answer(404, {"error": {"message": "no such route"}})
                    if failing:
                        return self._answer(503, {"error": {"message": "warming up"}})
                    if request.get("model") != SERVED_MODEL:
                        return self._answer(404, {"error": {
                            "message": f"model {request.get('model')!r} not found"}})
                    texts = request["input"]
                    texts = [texts] if isinstance(texts, str) else texts
                    if server.delay_s:
                        threading.Event().wait(server.delay_s)
                    vectors = np.asarray(server._model.embed(texts), dtype=np.float32)
                    with server._lock:
                        server.texts += len(texts)
                    encoded = request.get("encoding_format") == "base64"
                    data = [{"object": "embedding", "index": i,
                             "embedding": base64.b64encode(v.tobytes()).decode() if encoded
                             else v.tolist()} for i, v in enumerate(vectors)]
                    return self._answer(200, {"object": "list", "data": data[::-1],
                                              "model": SERVED_MODEL,
                                              "usage": {"prompt_tokens": 0,
                                                        "total_tokens": 0}})
                finally:
                    with server._lock:
                        server.in_flight -= 1

        return Handler
