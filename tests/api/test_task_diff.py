"""`GET /tasks/{id}/diff`: a task's changes between its own checkpoints, and a clean 404 or
422 (never a 500) for hostile input: another task's checkpoint, a bogus or unknown id, a
path for an id, content gone from the store, a stored object that is no checkpoint."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import httpx
import pytest

from refloop.api.main import create_app
from refloop.checkpoints.objects import DatabaseObjectStore, content_key
from refloop.checkpoints.snapshot import take_checkpoint
from refloop.contract.task import RecordTaskInput
from refloop.store.db import TaskCheckpointRecord


def checkpoint(objects: DatabaseObjectStore, directory: Path, files: dict[str, bytes]) -> str:
    for name, data in files.items():
        (directory / name).write_bytes(data)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return take_checkpoint(fd, objects).checkpoint_id
    finally:
        os.close(fd)


def record(store, task_id: str, taken: list[str], **input_fields) -> None:
    store.record_task(RecordTaskInput(task_id=task_id, workflow_id=task_id, status="completed",
                                      input={"task": "t", "workspace": "/w", **input_fields}))
    for n, checkpoint_id in enumerate(taken):
        store.record_checkpoint(TaskCheckpointRecord(task_id=task_id, call_id=f"{task_id}.r.{n}.0",
                                                     checkpoint_id=checkpoint_id))


@pytest.fixture
async def http(settings):
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        client.app = app  # type: ignore[attr-defined]
        yield client


async def test_a_tasks_diffs_and_hostile_ids(http, tmp_path: Path):
    store = http.app.state.store
    objects = DatabaseObjectStore(store.engine)
    ws, other_ws = tmp_path / "a", tmp_path / "b"
    ws.mkdir()
    other_ws.mkdir()
    first = checkpoint(objects, ws, {"report.md": b"# Report\n"})
    second = checkpoint(objects, ws, {"report.md": b"# Report\n\nBody.\n", "logo.bin": b"\x00\x01"})
    theirs = checkpoint(objects, other_ws, {"secret.txt": b"not yours\n"})
    mine, other, fork = (f"task-{uuid.uuid4().hex[:12]}" for _ in range(3))
    record(store, mine, [first, second])
    record(store, other, [theirs])
    record(store, fork, [second], fork={"task_id": mine, "step": 1, "checkpoint_id": first})

    whole = await http.get(f"/tasks/{mine}/diff")
    assert whole.status_code == 200, whole.text
    body = whole.json()
    assert body["base"] is None and body["checkpoint"] == second and body["changed"] == 2
    files = {f["path"]: f for f in body["files"]}
    assert files["report.md"]["change"] == "added" and files["report.md"]["added_lines"] == 3
    assert "+# Report" in files["report.md"]["diff"]
    assert files["logo.bin"]["diff"] is None and files["logo.bin"]["note"] == "binary file"

    one = (await http.get(f"/tasks/{mine}/diff", params={"checkpoint": second})).json()
    assert one["base"] == first and [f["path"] for f in one["files"]] == ["logo.bin", "report.md"]
    modified = one["files"][1]
    assert modified["change"] == "modified" and modified["diff"].endswith("+\n+Body.")
    assert (modified["added_lines"], modified["removed_lines"]) == (2, 0)
    since = (await http.get(f"/tasks/{mine}/diff",
                            params={"checkpoint": first, "since_start": "true"})).json()
    assert since["base"] is None and since["changed"] == 1

    # A fork's changes start from the checkpoint it was forked at
    forked = (await http.get(f"/tasks/{fork}/diff")).json()
    assert forked["base"] == first and forked["changed"] == 2

    # Another task's checkpoint, as the one to show or as the base: not this task's
    for params in ({"checkpoint": theirs}, {"base": theirs}, {"checkpoint": second,
                                                              "base": theirs}):
        refused = await http.get(f"/tasks/{mine}/diff", params=params)
        assert refused.status_code == 404, (params, refused.text)
        assert "not found" in refused.json()["detail"]
    assert (await http.get(f"/tasks/{other}/diff", params={"checkpoint": first})).status_code \
        == 404
    # Bogus ids: refused by their form, before any lookup
    for bogus in ("../../etc/passwd", "zz", first.upper(), first + "0", "", "%00" + first[3:],
                  first[:-1] + "\u0660"):
        refused = await http.get(f"/tasks/{mine}/diff", params={"checkpoint": bogus})
        assert refused.status_code == 422, (bogus, refused.text)
    # A well-formed id no task took, and tasks that are not there or not agent tasks
    assert (await http.get(f"/tasks/{mine}/diff", params={"checkpoint": "0" * 64})
            ).status_code == 404
    for path in ("/tasks/task-none/diff", "/tasks/..%2F..%2Fetc/diff", "/tasks/%00/diff"):
        answer = await http.get(path)
        assert answer.status_code in (404, 422), (path, answer.text)
    store.record_task(RecordTaskInput(task_id=f"cr-{mine}", workflow_id=f"cr-{mine}",
                                      kind="code_review", status="completed"))
    assert (await http.get(f"/tasks/cr-{mine}/diff")).status_code == 404


async def test_content_gone_or_not_a_checkpoint_is_told_not_a_500(http):
    store = http.app.state.store
    objects = DatabaseObjectStore(store.engine)
    not_a_tree = b'{"hello": "world"}'
    objects.put_many({content_key(not_a_tree): not_a_tree})
    gone, odd = f"task-{uuid.uuid4().hex[:12]}", f"task-{uuid.uuid4().hex[:12]}"
    record(store, gone, [uuid.uuid4().hex * 2])  # listed, never stored
    record(store, odd, [content_key(not_a_tree)])

    missing = await http.get(f"/tasks/{gone}/diff")
    assert missing.status_code == 404 and "not found" in missing.json()["detail"]
    unreadable = await http.get(f"/tasks/{odd}/diff")
    assert unreadable.status_code == 409
    assert "cannot be read" in unreadable.json()["detail"]
    empty = f"task-{uuid.uuid4().hex[:12]}"
    record(store, empty, [])
    nothing = await http.get(f"/tasks/{empty}/diff")
    assert nothing.status_code == 404 and "changed nothing yet" in nothing.json()["detail"]
