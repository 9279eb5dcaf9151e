"""refloop's data converter: the SDK's pydantic converter, with the model call's input and
result written without the optional fields still at their defaults.

A step's model call crosses Temporal twice (its input scheduled, its result completed),
and `"tool_call_id":null,"name":null`, a ledger's zero counters and a fit's zero counts
were a third of those payloads. Loading gives each left-out field back (its default), so
a history written either way replays and reads the same. Only these types, whose fields
are all plain data with plain defaults: a discriminated union's tag or a validator that
reads a field's absence would not survive it. The API and its clients still see every
field: this is the Temporal payload only."""

from __future__ import annotations

from typing import Any

import temporalio.api.common.v1
from pydantic import BaseModel
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)

from refloop.contract.activity_io import ActInput, ActResult

# The payloads of every step of every task.
LEAN_IN_HISTORY: tuple[type[BaseModel], ...] = (ActInput, ActResult)


class LeanJSONPayloadConverter(PydanticJSONPlainPayloadConverter):
    """JSON through pydantic; the types above without their defaults."""

    def to_payload(self, value: Any) -> temporalio.api.common.v1.Payload | None:
        if isinstance(value, LEAN_IN_HISTORY):
            return temporalio.api.common.v1.Payload(
                metadata={"encoding": self.encoding.encode()},
                data=value.__pydantic_serializer__.to_json(value, exclude_defaults=True))
        return super().to_payload(value)


class LeanPayloadConverter(CompositePayloadConverter):
    """The SDK's pydantic payload converter with the JSON step above."""

    def __init__(self) -> None:
        lean = LeanJSONPayloadConverter()
        super().__init__(*(lean if isinstance(step, JSONPlainPayloadConverter) else step
                           for step in DefaultPayloadConverter.default_encoding_payload_converters))


DATA_CONVERTER = DataConverter(payload_converter_class=LeanPayloadConverter)
