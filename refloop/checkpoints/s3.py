"""Checkpoint objects in an S3-compatible bucket (AWS S3, MinIO, Ceph, R2, ...): the
`ObjectStore` interface over HEAD, PUT and GET.

Keys are content keys, so an object is written once and never changed: `missing` asks with
HEAD (many at once), `put_many` writes only what the caller found missing, and whatever a
retried call writes again is the same bytes. The layout is the directory store's,
`<prefix>/ab/cdef...`, so a directory store can be copied into a bucket as it is. Every
object read is checked against its key: a bucket is shared, and a changed object must not
be restored.

boto3 is the `s3` extra (`pip install 'refloop[s3]'`); it is imported only when this store is
configured.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from refloop.checkpoints.objects import content_key
from refloop.settings import parse_s3_url

# Requests in flight at once (HEAD, PUT, GET), per store.
CONCURRENCY = 16
_HEX = frozenset("0123456789abcdef")
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}


def _object_key(prefix: str, key: str) -> str:
    if len(key) != 64 or not _HEX.issuperset(key):
        raise ValueError(f"not an object key: {key!r}")
    return f"{prefix}{key[:2]}/{key[2:]}"


def _not_found(err: Exception) -> bool:
    response = getattr(err, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")) in _NOT_FOUND


class S3ObjectStore:
    def __init__(self, url: str, *, endpoint_url: str | None = None,
                 region: str | None = None, addressing: str = "auto",
                 client: Any = None) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region,
                                  config=Config(
                                      s3={"addressing_style": addressing},
                                      max_pool_connections=CONCURRENCY,
                                      retries={"mode": "standard", "max_attempts": 3},
                                      # checksums only where S3 requires them: many
                                      # S3-compatible servers refuse the newer defaults
                                      request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))
        self.client = client
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _map(self, action, items: list) -> list:
        if len(items) <= 1:
            return [action(item) for item in items]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="s3-store")
        return list(self._pool.map(action, items))

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=_object_key(self.prefix, key))
        except Exception as err:  # botocore's ClientError: a 404 answers the question
            if _not_found(err):
                return False
            raise
        return True

    def missing(self, keys: Iterable[str]) -> set[str]:
        wanted = sorted(set(keys))
        return {key for key, found in zip(wanted, self._map(self._exists, wanted),
                                          strict=True) if not found}

    def _put(self, item: tuple[str, bytes]) -> None:
        key, data = item
        if content_key(data) != key:
            raise ValueError(f"object {key} does not hold the content of its key")
        self.client.put_object(Bucket=self.bucket, Key=_object_key(self.prefix, key),
                               Body=data, ContentType="application/octet-stream")

    def put_many(self, objects: dict[str, bytes]) -> None:
        """Every object, the last one after all the others are stored (a checkpoint's
        root tree comes last: a stored root always has what it names)."""
        items = list(objects.items())
        if not items:
            return
        self._map(self._put, items[:-1])
        self._put(items[-1])

    def _get(self, key: str) -> bytes:
        try:
            answer = self.client.get_object(Bucket=self.bucket,
                                            Key=_object_key(self.prefix, key))
        except Exception as err:
            if _not_found(err):
                raise KeyError(f"checkpoint object {key} is not in the store") from None
            raise
        data = answer["Body"].read()
        if content_key(data) != key:
            raise ValueError(f"checkpoint object {key} in the bucket does not match its key")
        return data

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        wanted = sorted(set(keys))
        return dict(zip(wanted, self._map(self._get, wanted), strict=True))
