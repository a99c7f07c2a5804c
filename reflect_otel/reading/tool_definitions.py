"""The agent's tools, read from what its instrumentation recorded, bounded like every other span value.

Read, in order, from an LLM span: OpenInference ``llm.tools.N.tool.json_schema`` (the OTel GenAI
``gen_ai.tool.definitions`` is translated to it in :mod:`reflect_otel.reading.genai`), then the ``tools`` of the recorded
model request (``input.value``). Every shape these conventions and SDKs write is read by shape, never by framework
name: ``{"type": "function", "function": {"name", "description", "parameters"}}`` (OpenAI chat),
``{"type": "function", "name", "description", "parameters"}`` (OpenAI Responses, GenAI), ``{"name",
"description", "input_schema"}`` (Anthropic). When a trace recorded none, :func:`available_tools` falls back on the
tools seen called, with a schema read from the arguments they were called with.

Some frameworks mark in their definitions the tools that end the run with their arguments as its output (the
run's answer, not a lookup): pydantic-ai's output tools (``kind: "output"``, listed under ``output_tools`` of its
``model_request_parameters``). :func:`read_output_tools` reads that mark by shape, from any definition recorded.
OpenAI's Agents SDK (``StopAtTools``) and smolagents (``final_answer``) record no such mark: their answer steps are
found by how the run ends (:mod:`reflect_otel.reading.assembly.steps`; for the Agents SDK,
:attr:`reflect_otel.reading.assembly.question.RunEnd.stops_at_tools`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from reflect_otel import _values
from reflect_otel.reading.semconv import PydanticAIAttributes, SpanAttributes, ToolAttributes
from reflect_otel.trace import Step, StepKind, StructuredTrace, ToolDefinition

__all__ = [
    "MAX_SCHEMA_BYTES",
    "MAX_TOOLS",
    "available_tools",
    "read_output_tools",
    "read_tool_definitions",
    "tool_definition",
    "tools_seen",
]

MAX_TOOLS = 64
"""Tools kept per trace; more are dropped (a trace warning is not worth it: the first 64 are the agent's)."""
MAX_SCHEMA_BYTES = 16 * 1024
"""A tool whose argument schema is larger than this as JSON keeps an empty (open) schema."""
MAX_DESCRIPTION_CHARS = 1000
_TOOLS_PREFIX = SpanAttributes.LLM_TOOLS + "."
_JSON_SCHEMA_SUFFIX = "." + ToolAttributes.TOOL_JSON_SCHEMA


def _object(value: object) -> Mapping[str, Any] | None:
    parsed = _values.parse_json(value) if isinstance(value, str) else value
    return parsed if isinstance(parsed, Mapping) else None


def tool_definition(value: object) -> ToolDefinition | None:
    """One tool definition in any of the shapes above (a dict or its JSON text); None when it names no tool."""
    raw = _object(value)
    if raw is None:
        return None
    body = _object(raw.get("function")) or raw
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    parameters = next(
        (
            p
            for key in ("parameters", "input_schema", "inputSchema", "parameters_json_schema")
            if (p := _object(body.get(key)))
        ),
        None,
    )
    schema: dict[str, Any] = dict(parameters) if parameters is not None else {}
    if len(json.dumps(schema, ensure_ascii=False, default=str).encode()) > MAX_SCHEMA_BYTES:
        schema = {}
    description = body.get("description")
    return ToolDefinition(
        name=name.strip()[:200],
        description=_values.truncate(description, MAX_DESCRIPTION_CHARS) if isinstance(description, str) else "",
        parameters=schema,
    )


def read_tool_definitions(attributes: Mapping[str, Any]) -> list[ToolDefinition]:
    """The tools one LLM span recorded (see the module's docstring), first definition of each name kept."""
    found: list[object] = []
    indexed = []
    for key, value in attributes.items():
        if key.startswith(_TOOLS_PREFIX) and key.endswith(_JSON_SCHEMA_SUFFIX):
            index = key[len(_TOOLS_PREFIX) : -len(_JSON_SCHEMA_SUFFIX)]
            if index.isdigit():
                indexed.append((int(index), value))
    found += [value for _, value in sorted(indexed)]
    request = _object(attributes.get(SpanAttributes.INPUT_VALUE))
    listed = request.get("tools") if request is not None else None
    if isinstance(listed, list):
        found += listed
    return list(_unique(d for d in map(tool_definition, found) if d is not None))


_OUTPUT_KIND = "output"


def read_output_tools(attributes: Mapping[str, Any]) -> frozenset[str]:
    """The tools one LLM span's definitions mark as output tools (``"kind": "output"``), wherever they were
    recorded: the request parameters pydantic-ai writes, the ``tools`` of a recorded request, or an indexed
    OpenInference definition. At most :data:`MAX_TOOLS` names; empty when none is marked. A recorded text that
    does not say ``output`` is not parsed (a model request can be large)."""
    found: list[object] = [
        value
        for key, value in attributes.items()
        if key.startswith(_TOOLS_PREFIX) and key.endswith(_JSON_SCHEMA_SUFFIX) and _may_mark(value)
    ]
    for key in (PydanticAIAttributes.MODEL_REQUEST_PARAMETERS, SpanAttributes.INPUT_VALUE):
        value = attributes.get(key)
        request = _object(value) if _may_mark(value) else None
        if request is not None:
            found += [item for name in _LISTS if isinstance(listed := request.get(name), list) for item in listed]
    names: set[str] = set()
    for value in found:
        raw = _object(value)
        if raw is None or raw.get("kind") != _OUTPUT_KIND:
            continue
        name = (_object(raw.get("function")) or raw).get("name")
        if isinstance(name, str) and name.strip() and len(names) < MAX_TOOLS:
            names.add(name.strip()[:200])
    return frozenset(names)


_LISTS = ("tools", "function_tools", "output_tools")
"""Where a request lists its tool definitions."""


def _may_mark(value: object) -> bool:
    return not isinstance(value, str) or _OUTPUT_KIND in value


def _unique(definitions: Iterable[ToolDefinition]) -> Iterable[ToolDefinition]:
    names: set[str] = set()
    for definition in definitions:
        if definition.name not in names and len(names) < MAX_TOOLS:
            names.add(definition.name)
            yield definition


_JSON_TYPE_OF = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def tools_seen(steps: Iterable[Step]) -> tuple[ToolDefinition, ...]:
    """The tools called on the trace (not those that gave an answer), each with a schema whose properties are the arguments it was seen with
    (typed by their values), none required; ``recorded`` False."""
    properties: dict[str, dict[str, dict[str, str]]] = {}
    for step in steps:
        if not step.tool_name or step.kind in (StepKind.FINAL_ANSWER, StepKind.MESSAGE):  # answers, not lookups
            continue
        seen = properties.setdefault(step.tool_name, {})
        for name, value in step.tool_args.items():
            kind = _JSON_TYPE_OF.get(type(value))
            seen.setdefault(str(name), {"type": kind} if kind else {})
    return tuple(
        ToolDefinition(name=name, parameters={"type": "object", "properties": props}, recorded=False)
        for name, props in list(properties.items())[:MAX_TOOLS]
    )


def available_tools(trace: StructuredTrace) -> tuple[ToolDefinition, ...]:
    """The tools the agent had: as recorded, else as seen called."""
    return trace.tools or tools_seen(trace.steps)
