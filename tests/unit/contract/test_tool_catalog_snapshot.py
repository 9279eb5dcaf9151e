"""The tool catalogue a run keeps: compact in history, the same tools when read back."""

from __future__ import annotations

import dataclasses

from refloop.contract.activity_io import ToolCatalogSnapshot
from refloop.contract.tool_catalog import TOOLS
from refloop.contract.tool_properties import ToolActivityOptions, ToolProperties


def test_the_snapshot_reads_back_the_same_tools_from_a_compact_form():
    snapshot = ToolCatalogSnapshot(tools={n: d.properties for n, d in TOOLS.items()})
    text = snapshot.model_dump_json()
    assert len(text) < 2_000  # every tool's kind defaults left out
    assert ToolCatalogSnapshot.model_validate_json(text).tools == snapshot.tools


def test_properties_unlike_their_kinds_defaults_are_kept():
    odd = ToolProperties(kind="read", expects_output=False, approval=frozenset({"auto"}),
                         activity=ToolActivityOptions(max_attempts=7))
    text = ToolCatalogSnapshot(tools={"odd": odd}).model_dump_json()
    back = ToolCatalogSnapshot.model_validate_json(text).tools["odd"]
    assert back == odd and back.activity.max_attempts == 7
    assert dataclasses.replace(back, approval=None) != odd  # approval was kept, not derived
