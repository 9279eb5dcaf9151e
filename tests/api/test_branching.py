"""`POST /tasks/{id}/rewind` and `/fork` on the real dev server and PostgreSQL: what they
do, and a clear 4xx for an unknown task, a step without a checkpoint, an ended task (told
what is supported), a workspace a fork may not use, and bad input."""

from __future__ import annotations

from pathlib import Path

from tests.api.test_api import new_session, wait_done
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of
from tests.workflow.test_rewind import checkpoints_taken, write


async def test_rewind_and_fork_over_http_and_their_refusals(
        api, client, scripted_llm, workspace, tmp_path: Path):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [write("a.txt", "a\n"), write("b.txt", "b\n"),
                write("c.txt", "c\n", delay_ms=60_000),  # the run is here when rewound
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    session = await new_session(api, workspace, model=model)
    started = await api.post("/agent/interactive/task",
                             json={"session_id": session, "task": "write files"})
    task_id = started.json()["task_id"]
    await checkpoints_taken(client, task_id, 2)

    for body in ({"to_step": 0}, {"to_step": "1"}, {"to_step": 1, "x": 1}, {}):
        bad = await api.post(f"/tasks/{task_id}/rewind", json=body)
        assert bad.status_code == 422, (body, bad.text)
    unknown = await api.post("/tasks/task-nope/rewind", json={"to_step": 1})
    assert unknown.status_code == 404 and "not found" in unknown.json()["detail"]
    beyond = await api.post(f"/tasks/{task_id}/rewind", json={"to_step": 5})
    assert beyond.status_code == 422
    assert "no step 5: this run took checkpoints 1 to 2" in beyond.json()["detail"]

    rewound = await api.post(f"/tasks/{task_id}/rewind", json={"to_step": 1})
    assert rewound.status_code == 200, rewound.text
    assert rewound.json()["step"] == 1 and rewound.json()["rewound_tokens"] > 0
    state = await wait_done(api, task_id)
    assert state["status"] == "completed"
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt"]  # b.txt put back
    assert state["result"]["stats"]["rewound_usage"]["calls"] == 1

    ended = await api.post(f"/tasks/{task_id}/rewind", json={"to_step": 1})
    assert ended.status_code == 409
    said = ended.json()["detail"]
    assert "has ended (completed): only a running task can be rewound" in said
    assert "fork it from that step instead" in said

    # Fork: its refusals, then one that starts
    for body in ({"at_step": 0}, {"at_step": 1, "task": ""}, {"at_step": 1, "extra": 1}):
        assert (await api.post(f"/tasks/{task_id}/fork", json=body)).status_code == 422
    assert (await api.post("/tasks/task-nope/fork", json={"at_step": 1})).status_code == 404
    none = await api.post(f"/tasks/{task_id}/fork", json={"at_step": 9})
    assert none.status_code == 422 and "no step 9" in none.json()["detail"]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("not the fork's")
    busy = await api.post(f"/tasks/{task_id}/fork",
                          json={"at_step": 1, "workspace": str(tmp_path / "busy")})
    assert busy.status_code == 422 and "already holds files" in busy.json()["detail"]
    outside = await api.post(f"/tasks/{task_id}/fork",
                             json={"at_step": 1, "workspace": "/etc/refloop-fork"})
    assert outside.status_code == 422 and "under none of the workspace roots" in \
        outside.json()["detail"]
    assert (tmp_path / "busy" / "mine.txt").read_text() == "not the fork's"

    forked = await api.post(f"/tasks/{task_id}/fork", json={"at_step": 1})
    assert forked.status_code == 202, forked.text
    fork = forked.json()
    assert fork["forked_from"] == task_id and fork["step"] == 1
    assert Path(fork["workspace"]).parent == workspace.parent
    view = (await api.get(f"/tasks/{fork['task_id']}")).json()
    assert view["forked_from"] == {"task_id": task_id, "step": 1}
    original = (await api.get(f"/tasks/{task_id}")).json()
    assert [f["task_id"] for f in original["forks"]] == [fork["task_id"]]
    await api.post(f"/tasks/{fork['task_id']}/cancel")  # its scenario has no more turns
