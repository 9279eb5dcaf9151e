"""REFLOOP_EMBEDDINGS_URL: code search through the user's own OpenAI-compatible embeddings
endpoint, here a local server that serves the packaged model over that API (through the
real `openai` client): the same chunks, an index of its own, the same answers; bounded
concurrency; transient failures retried a bounded number of times, refusals not at all."""

from __future__ import annotations

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
    for name in ("REFLOOP_EMBEDDINGS_URL", "REFLOOP_EMBEDDINGS_CONCURRENCY"):
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
        texts = [f"text number {n}" for n in range(embedders.REMOTE_BATCH * 6 + 1)]
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
                                    "REFLOOP_EMBEDDINGS_CONCURRENCY": "4",
                                    "REFLOOP_EMBEDDINGS_API_KEY": "sk-embeddings"}
    assert endpoint_base("http://h:1/v1/embeddings/") == endpoint_base("http://h:1/v1") == \
        "http://h:1/v1"
