"""REFLOOP_EMBEDDINGS_URL: code search through the user's own OpenAI-compatible embeddings
endpoint, here a local server that serves the packaged model over that API (through the
real `openai` client): the same chunks, an index of its own, the same answers; bounded
concurrency; transient failures retried a bounded number of times, refusals not at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refloop.search import embedders
from refloop.search.embedders import EmbeddingsUnavailable, embedder, endpoint_base
from refloop.search.index import CodeIndex
from refloop.settings import Settings
from tests.semantic.embeddings_server import SERVED_MODEL, EmbeddingsServer

MODEL = f"api:{SERVED_MODEL}"


@pytest.fixture(autouse=True)
def fresh_endpoint_models(monkeypatch):
    """Each test reaches its own server: endpoint models are loaded (and probed) anew."""
    monkeypatch.setattr(embedders, "REMOTE_BACKOFF_S", 0.01)
    for name in [n for n in os.environ if n.startswith("REFLOOP_EMBEDDING")]:
        monkeypatch.delenv(name, raising=False)
    embedders._load.cache_clear()
    yield
    embedders._load.cache_clear()


def _workspace(root: Path) -> Path:
    root.mkdir()
    (root / "ledger.py").write_text(
        'def parse_record(line):\n    """Split a comma separated ledger line into fields."""\n'
        '    return line.split(",")\n\n\n'
        'def checksum(data):\n    """The additive checksum of a payload, modulo 256."""\n'
        '    return sum(data) % 256\n')
    (root / "zoo.py").write_text(
        'class Inventory:\n    """The animals of the zoo."""\n\n'
        '    def count_zebras(self, herd):\n        """How many zebras the herd holds."""\n'
        '        return sum(1 for animal in herd if animal == "zebra")\n')
    return root


def _vectors(index: CodeIndex) -> dict[tuple, np.ndarray]:
    rows = index._table(create=False).search().limit(None).to_list()
    return {(r["path"], r["start_line"], r["part"], r["text"]): np.array(r["vector"])
            for r in rows}


def test_an_endpoint_model_indexes_the_same_chunks_and_answers_the_same(tmp_path, monkeypatch):
    workspace = _workspace(tmp_path / "ws")
    local = CodeIndex(tmp_path / "index", workspace)
    local.update()
    with EmbeddingsServer() as server:
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_URL", f"{server.url}/embeddings")  # either form
        remote = CodeIndex(tmp_path / "index", workspace, MODEL)
        report = remote.update()
        assert remote.table_name != local.table_name  # an index per model
        assert report.chunks_total == local.chunk_count() and server.texts >= report.chunks_total
        ours, theirs = _vectors(local), _vectors(remote)
        assert ours.keys() == theirs.keys()  # the same chunks
        for key, vector in ours.items():
            assert np.allclose(vector, theirs[key], atol=1e-5)
        for query in ("how many zebras are there", "split a ledger line", "checksum"):
            assert [(h.path, h.start_line) for h in remote.search(query, 3)] == \
                [(h.path, h.start_line) for h in local.search(query, 3)]
        again = remote.update()
        assert again.files_unchanged == 2 and again.chunks_embedded == 0


def test_requests_stay_within_the_concurrency_bound(monkeypatch):
    with EmbeddingsServer(delay_s=0.05) as server:
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_URL", server.url)
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_CONCURRENCY", "2")
        texts = [f"text number {n}" for n in range(32 * 6 + 1)]  # the default batch: 32
        vectors = embedder(MODEL).embed(texts)
        assert len(vectors) == len(texts)
        assert server.most_in_flight == 2  # in parallel, and never more than the bound
        single = embedder(MODEL).embed([texts[-1]])[0]
        assert np.allclose(single, vectors[-1], atol=1e-5)  # order kept across batches


def test_a_transient_failure_is_retried_and_the_pass_loses_nothing(tmp_path, monkeypatch):
    workspace = _workspace(tmp_path / "ws")
    with EmbeddingsServer(fail_first=2) as server:  # 503, 503, then answers
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_URL", server.url)
        report = CodeIndex(tmp_path / "index", workspace, MODEL).update()
        assert report.files_indexed == 2 and report.chunks_embedded > 0
        assert server.requests >= 3


def test_an_endpoint_that_keeps_failing_stops_after_the_bounded_tries(monkeypatch):
    with EmbeddingsServer(fail_first=1_000) as server:
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_URL", server.url)
        with pytest.raises(EmbeddingsUnavailable, match="failed 4 times"):
            embedder(MODEL)
        assert server.requests == embedders.REMOTE_ATTEMPTS


def test_a_refusal_is_reported_at_once_and_not_retried(monkeypatch):
    with EmbeddingsServer() as server:
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_URL", server.url)
        with pytest.raises(EmbeddingsUnavailable, match=r"refused the request \(404\)"):
            embedder("api:no-such-model")
        assert server.requests == 1


def test_an_endpoint_model_without_a_url_is_a_clear_error():
    with pytest.raises(EmbeddingsUnavailable, match="needs REFLOOP_EMBEDDINGS_URL"):
        embedder(MODEL)
    with pytest.raises(ValueError, match="unknown embedding model"):
        embedder("api:")


def test_settings_choose_the_endpoint_model_and_hand_the_pass_its_address():
    packaged = Settings(_env_file=None)
    assert packaged.search_model == "minilm-int8" and packaged.search_model_env == {}
    own = Settings(_env_file=None, refloop_embeddings_url="http://127.0.0.1:9/v1",
                   refloop_embeddings_model="nomic-embed-text",
                   refloop_embeddings_api_key="sk-embeddings")
    assert own.search_model == "api:nomic-embed-text"
    assert own.search_model_env == {"REFLOOP_EMBEDDINGS_URL": "http://127.0.0.1:9/v1",
                                    "REFLOOP_EMBEDDINGS_MODEL": "nomic-embed-text",
                                    "REFLOOP_EMBEDDINGS_API_KEY": "sk-embeddings"}
    # Every endpoint setting the operator gave reaches the pass, as its variable
    tuned = own.model_copy(update={"refloop_embeddings_query_prefix": "search_query: ",
                                   "refloop_embeddings_batch_size": 8})
    assert tuned.search_model_env["REFLOOP_EMBEDDINGS_QUERY_PREFIX"] == "search_query: "
    assert tuned.search_model_env["REFLOOP_EMBEDDINGS_BATCH_SIZE"] == "8"
    assert endpoint_base("http://h:1/v1/embeddings/") == endpoint_base("http://h:1/v1") == \
        "http://h:1/v1"


def test_queries_and_documents_get_their_prefixes_and_input_types(tmp_path, monkeypatch):
    """e5-style prefixes and a Cohere/Voyage/NVIDIA-style input_type: documents go with
    theirs, searches with theirs; the documents' form gets its own index."""
    workspace = _workspace(tmp_path / "ws")
    with EmbeddingsServer() as server:
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_URL", server.url)
        plain = CodeIndex(tmp_path / "index", workspace, MODEL).table_name
        for name, value in {"QUERY_PREFIX": "query: ", "DOCUMENT_PREFIX": "passage: ",
                            "QUERY_INPUT_TYPE": "query",
                            "DOCUMENT_INPUT_TYPE": "passage"}.items():
            monkeypatch.setenv(f"REFLOOP_EMBEDDINGS_{name}", value)
        index = CodeIndex(tmp_path / "index", workspace, MODEL)
        assert index.table_name != plain  # documents embedded otherwise: another index
        report = index.update()
        stored = list(server.sent)
        hits = index.search("how many zebras are there", 3)
        asked = server.sent[len(stored):]
    documents = [r for r in stored if r.get("input_type") == "passage"]
    assert sum(len(r["input"]) for r in documents) == report.chunks_embedded
    assert all(text.startswith("passage: ") for r in documents for text in r["input"])
    assert [(r["input"], r["input_type"]) for r in asked] == [
        (["query: how many zebras are there"], "query")]
    assert hits[0].path == "zoo.py"
    assert all(r["model"] == SERVED_MODEL for r in server.sent)


def test_batch_size_timeout_and_the_window_are_settings(tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.md").write_text("".join(
        f"Line {n} of the notes says something about zebras and ledgers.\n"
        for n in range(120)))
    with EmbeddingsServer() as server:
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_URL", server.url)
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_BATCH_SIZE", "5")
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_WINDOW_TOKENS", "64")
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_DOCUMENT_PREFIX", "passage: ")
        small = CodeIndex(tmp_path / "index", workspace, MODEL).update()
        assert max(len(r["input"]) for r in server.sent) == 5
        count = embedder(MODEL).count_tokens
        sent = [text for r in server.sent[1:] for text in r["input"]]
        assert max(count(sent)) + 2 <= 64  # each chunk and its prefix fit the window
        embedders._load.cache_clear()
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_WINDOW_TOKENS", "512")
        large = CodeIndex(tmp_path / "index", workspace, MODEL).update()
    assert large.chunks_total < small.chunks_total / 4  # fewer, longer chunks
    with EmbeddingsServer(delay_s=1.0) as slow:  # a CPU-bound server, a short bound
        embedders._load.cache_clear()
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_URL", slow.url)
        monkeypatch.setenv("REFLOOP_EMBEDDINGS_TIMEOUT_S", "0.2")
        with pytest.raises(EmbeddingsUnavailable, match="failed 4 times"):
            embedder(MODEL)


def _index_command(workspace: Path, index_dir: Path, env: dict[str, str]):
    return subprocess.run([sys.executable, "-m", "refloop.search.index", str(workspace),
                           str(index_dir)], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)


def test_the_index_command_uses_the_endpoint_model_of_the_settings(tmp_path):
    workspace = _workspace(tmp_path / "ws")
    with EmbeddingsServer() as server:
        done = _index_command(workspace, tmp_path / "index", {
            "REFLOOP_EMBEDDINGS_URL": server.url, "REFLOOP_EMBEDDINGS_MODEL": SERVED_MODEL})
        assert done.returncode == 0, done.stderr
        assert f"indexing with api:{SERVED_MODEL}" in done.stderr
        report = json.loads(done.stdout.splitlines()[-1])["report"]
        assert report["chunks_embedded"] > 0
        assert server.requests > 1 and {r["model"] for r in server.sent} == {SERVED_MODEL}
    unset = _index_command(workspace, tmp_path / "index", {
        "REFLOOP_EMBEDDINGS_MODEL": SERVED_MODEL})
    assert unset.returncode != 0
    assert "REFLOOP_EMBEDDINGS_URL is unset" in unset.stderr
