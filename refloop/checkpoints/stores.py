"""The checkpoint store a process uses, chosen by REFLOOP_CHECKPOINT_STORE: the shared
database by default, an S3-compatible bucket when the setting names one. Every host of a
fleet must name the same store: a checkpoint is restored wherever the task goes."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from refloop.checkpoints.objects import DatabaseObjectStore, ObjectStore
from refloop.settings import Settings


def object_store_for(settings: Settings, engine: Engine) -> ObjectStore:
    url = settings.refloop_checkpoint_store
    if not url:
        return DatabaseObjectStore(engine)
    from refloop.checkpoints.s3 import S3ObjectStore  # boto3 only when a bucket is named

    return S3ObjectStore(url, endpoint_url=settings.refloop_checkpoint_s3_endpoint,
                         region=settings.refloop_checkpoint_s3_region,
                         addressing=settings.refloop_checkpoint_s3_addressing)

