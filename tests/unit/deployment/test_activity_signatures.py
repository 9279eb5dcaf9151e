"""Every activity takes and returns what its `ActivityCall` sends and expects: workflows call
activities by name, so nothing else ties the two together."""

from __future__ import annotations

from temporalio import activity

from refloop.contract import activity_calls
from refloop.contract.activity_io import ClassifyIntentInput, SummarizeInput, SummarizeResult
from refloop.settings import Settings
from refloop.worker.plugin import activities_for, signature_mismatches


def test_every_registered_activity_matches_its_call(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path}/refloop.db",
                        refloop_data_dir=str(tmp_path))
    activities, close = activities_for(settings)
    assert signature_mismatches(activities) == []
    names = {activity._Definition.must_from_callable(fn).name for fn in activities}
    assert set(activity_calls.every_call()) <= names  # every call has its activity


def test_an_activity_that_takes_another_input_is_caught():
    @activity.defn(name=activity_calls.SUMMARIZE.name)
    async def summarize(inp: ClassifyIntentInput) -> SummarizeResult:
        raise NotImplementedError

    @activity.defn(name=activity_calls.SUMMARIZE.name)
    async def summarize_to_nothing(inp: SummarizeInput) -> None:
        raise NotImplementedError

    found = signature_mismatches([summarize, summarize_to_nothing])
    assert len(found) == 2 and all(f.startswith("refloop.llm.summarize:") for f in found)
    assert "ClassifyIntentInput" in found[0] and "NoneType" in found[1]
