"""The output shape of "a call of one of the agent's tools": a pydantic model per tool, built from its recorded JSON
schema, joined in a union discriminated by the tool's name.

The union's JSON schema is what the endpoint constrains decoding to (a grammar on llama.cpp, structured output
elsewhere), so a call naming a tool the agent does not have cannot be generated, and pydantic rejects one that
an unconstrained endpoint writes anyway. Argument schemas are untrusted trace content: the subset that decoding
grammars and pydantic share is kept (objects of string, integer, number, boolean, arrays of those, enums,
nullable types), bounded in size; anything else becomes an open JSON value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model

from reflect_otel.trace import ToolDefinition

__all__ = ["MAX_CALL_TOOLS", "call_union"]

MAX_CALL_TOOLS = 32
"""Tools offered to the auditor; a larger union makes a grammar slow to build and a schema long to read."""
_MAX_PROPERTIES = 24
_MAX_ENUM = 64
_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}
_IDENTIFIER = re.compile(r"[^0-9a-zA-Z_]")


def _python_type(schema: object, depth: int = 0) -> Any:
    """The annotation for one property schema (see the module docstring for the subset)."""
    if not isinstance(schema, Mapping) or depth > 2:
        return Any
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and len(enum) <= _MAX_ENUM and all(isinstance(v, str | int) for v in enum):
        return Literal[tuple(enum)]
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]
        kinds = [k for k in kind if k != "null"]
        inner = _python_type({**schema, "type": kinds[0]}, depth) if len(kinds) == 1 else Any
        return inner | None if "null" in kind and inner is not Any else inner
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            kept = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")]
            if len(kept) == 1:
                inner = _python_type(kept[0], depth + 1)
                return inner | None if len(kept) < len(options) and inner is not Any else inner
            return Any
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        return list[_python_type(schema.get("items"), depth + 1)]  # type: ignore[misc]
    return Any


def _untitled(schema: dict[str, Any]) -> None:
    """No generated titles: they lengthen every prompt, and a value equal to one reads as an echo of the schema."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)


def _arguments_model(tool: ToolDefinition, position: int) -> type[BaseModel]:
    schema = tool.parameters
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    required_names = {str(r) for r in required} if isinstance(required, list) else set()
    fields: dict[str, Any] = {}
    for raw_name, property_schema in list(properties.items())[:_MAX_PROPERTIES]:
        name = str(raw_name)
        attribute = f"f{len(fields)}_{_IDENTIFIER.sub('_', name)[:40]}"
        annotation = _python_type(property_schema)
        described = property_schema.get("description") if isinstance(property_schema, Mapping) else None
        description = described[:200] if isinstance(described, str) else None
        if name in required_names:
            fields[attribute] = (annotation, Field(alias=name, description=description))
        else:
            fields[attribute] = (annotation | None, Field(default=None, alias=name, description=description))
    open_schema = not properties and tool.parameters.get("additionalProperties") is not False
    config = ConfigDict(
        frozen=True,
        populate_by_name=True,
        extra="allow" if open_schema else "forbid",
        json_schema_extra=_untitled,
    )
    model: type[BaseModel] = create_model(f"Arguments{position}", __config__=config, **fields)
    return model


def _call_model(tool: ToolDefinition, position: int) -> type[BaseModel]:
    name: Any = Literal[tool.name]  # a type built at run time: one tool's name, the union's tag
    model: type[BaseModel] = create_model(
        f"Call{position}",
        __config__=ConfigDict(frozen=True, json_schema_extra=_untitled),
        tool=(name, Field(description=tool.description[:200] or None)),
        arguments=(_arguments_model(tool, position), ...),
    )
    return model


def call_union(tools: Sequence[ToolDefinition]) -> Any:
    """The annotation of one call of one of ``tools`` (at most :data:`MAX_CALL_TOOLS`): ``{"tool": <name>,
    "arguments": {...}}``. Raises ValueError when ``tools`` is empty."""
    models = [_call_model(tool, position) for position, tool in enumerate(tools[:MAX_CALL_TOOLS])]
    if not models:
        raise ValueError("a call needs at least one tool")
    if len(models) == 1:
        return models[0]
    return Annotated[Union[tuple(models)], Field(discriminator="tool")]  # noqa: UP007  # a runtime tuple of models


def arguments_of(call: BaseModel) -> dict[str, Any]:
    """A validated call's arguments by their schema names, without those the model left out (None)."""
    arguments = getattr(call, "arguments", None)
    if not isinstance(arguments, BaseModel):
        return {}
    dumped = arguments.model_dump(by_alias=True)
    return {name: value for name, value in dumped.items() if value is not None}
