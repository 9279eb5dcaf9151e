"""The S3 checkpoint store against a real S3-compatible server (moto's, run as its own
process and spoken to over HTTP by boto3): chosen by REFLOOP_CHECKPOINT_STORE, each content
stored once under `<prefix>/ab/cdef...`, a checkpoint restored from the bucket alone, and an
object changed in the bucket refused rather than restored."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from refloop.checkpoints.objects import content_key
from refloop.checkpoints.restore import restore_checkpoint
from refloop.checkpoints.s3 import S3ObjectStore
from refloop.checkpoints.snapshot import load_manifest, take_checkpoint
from refloop.checkpoints.stores import object_store_for
from refloop.settings import Settings, parse_s3_url

BUCKET = "refloop-checkpoints"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def credentials(monkeypatch) -> None:
    # moto takes any key; boto3 reads them from the usual environment variables
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def store(endpoint, credentials, request) -> S3ObjectStore:
    settings = Settings(refloop_checkpoint_store=f"s3://{BUCKET}/{request.node.name[:40]}",
                        refloop_checkpoint_s3_endpoint=endpoint,
                        refloop_checkpoint_s3_region="us-east-1",
                        refloop_checkpoint_s3_addressing="path")
    chosen = object_store_for(settings, engine=None)  # type: ignore[arg-type]
    assert isinstance(chosen, S3ObjectStore)
    with contextlib.suppress(chosen.client.exceptions.BucketAlreadyOwnedByYou):
        chosen.client.create_bucket(Bucket=BUCKET)
    return chosen


def on(directory: Path, action, *args):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return action(fd, *args)
    finally:
        os.close(fd)


def bucket_keys(store: S3ObjectStore) -> list[str]:
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)
    return sorted(item["Key"] for item in listed.get("Contents", []))


def test_objects_round_trip_under_the_prefix_once_each(store):
    objects = {content_key(data): data for data in (b"one\n", b"two\n", b"")}
    assert store.missing(objects) == set(objects)
    store.put_many(objects)
    store.put_many(objects)  # a retried call: the same bytes, no second object
    assert store.missing([*objects, content_key(b"absent")]) == {content_key(b"absent")}
    assert store.get_many(objects) == objects
    assert bucket_keys(store) == sorted(f"{store.prefix}{key[:2]}/{key[2:]}"
                                        for key in objects)
    with pytest.raises(KeyError, match="not in the store"):
        store.get_many([content_key(b"absent")])


def test_a_checkpoint_is_restored_from_the_bucket_alone(tmp_path, store, endpoint):
    ws = tmp_path / "host-a"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "mod.py").write_text("value = 1\n")
    (ws / "same.txt").write_text("shared\n")
    (ws / "copy.txt").write_text("shared\n")
    snap = on(ws, take_checkpoint, store)
    assert snap.stats.new_objects == 2  # the shared content once
    again = on(ws, take_checkpoint, store)
    assert again.checkpoint_id == snap.checkpoint_id and again.stats.new_objects == 0
    assert again.stats.new_tree_bytes == 0

    other_host = S3ObjectStore(f"s3://{store.bucket}/{store.prefix}", endpoint_url=endpoint,
                               region="us-east-1", addressing="path")
    empty = tmp_path / "host-b"
    empty.mkdir()
    on(empty, restore_checkpoint, other_host, load_manifest(other_host, snap.checkpoint_id))
    assert (empty / "pkg" / "mod.py").read_text() == "value = 1\n"
    assert (empty / "copy.txt").read_text() == "shared\n"


def test_an_object_changed_in_the_bucket_is_refused(tmp_path, store):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("genuine\n")
    snap = on(ws, take_checkpoint, store)
    key = content_key(b"genuine\n")
    store.client.put_object(Bucket=store.bucket, Key=f"{store.prefix}{key[:2]}/{key[2:]}",
                            Body=b"forged!\n")
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(ValueError, match="does not match its key"):
        on(target, restore_checkpoint, store, load_manifest(store, snap.checkpoint_id))
    assert list(target.iterdir()) == []


def test_a_put_whose_bytes_are_not_its_key_is_refused(store):
    with pytest.raises(ValueError, match="does not hold the content of its key"):
        store.put_many({content_key(b"a"): b"b"})


@pytest.mark.parametrize("url", ["s3://", "http://bucket/x", "s3://b/x", "s3://bucket/a/../b",
                                 "s3://bucket/a//b", "s3://bu_cket/x", "s3://bucket/x?y=1"])
def test_a_store_setting_that_is_not_a_bucket_is_refused(url):
    with pytest.raises(ValueError):
        parse_s3_url(url)
    with pytest.raises(ValueError, match="refloop_checkpoint_store"):
        Settings(refloop_checkpoint_store=url)


def test_unset_means_the_database(tmp_path):
    from sqlalchemy import create_engine

    from refloop.checkpoints.objects import DatabaseObjectStore

    assert parse_s3_url("s3://bucket/a/b/") == ("bucket", "a/b/")
    assert parse_s3_url("s3://bucket") == ("bucket", "")
    engine = create_engine(f"sqlite:///{tmp_path / 'db'}")
    assert isinstance(object_store_for(Settings(refloop_checkpoint_store=""), engine),
                      DatabaseObjectStore)
