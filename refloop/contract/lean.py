"""Models whose payloads leave out what loading gives back: the optional fields still at
their defaults. For the inputs and results that cross Temporal at every step (a tool
call's), where `"allow_network":false,"keywords":[],"error":null` is most of a payload."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


@cache
def _defaults(model: type[BaseModel]) -> dict[str, Any]:
    """The optional fields of a model and their defaults, worked out once per class (a
    default factory's signature is inspected at every `get_default`)."""
    return {name: field.get_default(call_default_factory=True)
            for name, field in model.model_fields.items() if not field.is_required()}


_UNSET = object()


class LeanModel(BaseModel):
    @model_serializer(mode="wrap")
    def _without_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        defaults = _defaults(type(self))
        return {key: value for key, value in data.items()
                if defaults.get(key, _UNSET) != value}
