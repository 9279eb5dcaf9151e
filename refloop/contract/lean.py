"""Models whose payloads leave out what loading gives back: the optional fields still at
their defaults. For the inputs and results that cross Temporal at every step (a tool
call's), where `"allow_network":false,"keywords":[],"error":null` is most of a payload."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class LeanModel(BaseModel):
    @model_serializer(mode="wrap")
    def _without_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        fields = type(self).model_fields
        return {key: value for key, value in data.items()
                if key not in fields or fields[key].is_required()
                or value != fields[key].get_default(call_default_factory=True)}
