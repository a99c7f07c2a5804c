"""OTLP trace payloads (protobuf and JSON) to :class:`SpanRecord` s, rejecting bad spans one by one.

Invalid spans (bad ids) are rejected individually so a batch can succeed partially, as OTLP's
``partial_success`` allows; a body that cannot be decoded at all raises :class:`InputError`.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from reflect_otel._values import utf8_text
from reflect_otel.errors import InputError
from reflect_otel.reading.spans import (
    MAX_EVENTS_PER_SPAN,
    AttributeValue,
    SpanEvent,
    SpanRecord,
    is_span_id,
    is_trace_id,
    service_name,
)

__all__ = ["BatchTooLargeError", "DecodedBatch", "decode_json", "decode_protobuf", "decode_request"]


class BatchTooLargeError(InputError):
    """A request carries more spans than the receiver takes in one request."""


def _check_count(count: int, max_spans: int | None) -> None:
    if max_spans is not None and count > max_spans:
        raise BatchTooLargeError(
            f"the request carries {count} spans, over the limit of {max_spans} per request; export in smaller batches"
        )


_STATUS = {0: "unset", 1: "ok", 2: "error"}
_JSON_STATUS = {"STATUS_CODE_UNSET": "unset", "STATUS_CODE_OK": "ok", "STATUS_CODE_ERROR": "error"}
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200
_MAX_ERRORS_KEPT = 5


@dataclass(slots=True)
class DecodedBatch:
    """The valid spans of one request, and how many were rejected and why (first few reasons)."""

    spans: list[SpanRecord] = field(default_factory=list)
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        if len(self.errors) < _MAX_ERRORS_KEPT:
            self.errors.append(reason)

    @property
    def error_message(self) -> str:
        return "; ".join(self.errors)


# -- protobuf ---------------------------------------------------------------------------------------------------
def _any_value(value: AnyValue) -> AttributeValue | None:
    which = value.WhichOneof("value")
    if which in ("array_value", "kvlist_value"):
        return _structured(_plain_any(value))
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, which) if which else None


def _plain_any(value: AnyValue) -> object:
    """A protobuf ``AnyValue`` as plain Python: lists and dicts for arrays and key-value lists."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_plain_any(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _plain_any(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, which) if which else None


def _structured(value: object) -> AttributeValue | None:
    """An array or key-value list as an attribute: an array of plain values as it is (empty values left out); one
    holding maps or arrays (GenAI messages as structured values), and a key-value list, as their JSON text."""
    if isinstance(value, list) and not any(isinstance(v, list | dict) for v in value):
        return [v for v in value if isinstance(v, str | bool | int | float)]  # type: ignore[return-value]
    return json.dumps(value, default=str)


def decode_request(request: ExportTraceServiceRequest) -> DecodedBatch:
    """Spans of a decoded protobuf request."""
    batch = DecodedBatch()
    for resource_spans in request.resource_spans:
        service = service_name(_proto_attributes(resource_spans.resource.attributes))
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name or None
            for span in scope_spans.spans:
                trace_id, span_id = span.trace_id.hex(), span.span_id.hex()
                if not is_trace_id(trace_id) or not is_span_id(span_id):
                    batch.reject(f"span {span.name!r} has an invalid trace or span id")
                    continue
                parent = span.parent_span_id.hex() or None
                if parent is not None and not is_span_id(parent):
                    batch.reject(f"span {span_id} has an invalid parent span id")
                    continue
                attributes = _proto_attributes(span.attributes)
                events = tuple(
                    SpanEvent(event.name, _proto_attributes(event.attributes))
                    for event in span.events[:MAX_EVENTS_PER_SPAN]
                )
                batch.spans.append(
                    SpanRecord(
                        trace_id=trace_id,
                        span_id=span_id,
                        parent_id=parent,
                        parent_is_remote=bool(span.flags & _HAS_IS_REMOTE and span.flags & _IS_REMOTE),
                        name=span.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano or None,
                        attributes=attributes,
                        status=_STATUS.get(span.status.code, "unset"),
                        status_message=span.status.message or None,
                        dropped_attributes=span.dropped_attributes_count,
                        scope=scope,
                        events=events,
                        service=service,
                    )
                )
    return batch


def _proto_attributes(pairs: Iterable[Any]) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    for kv in pairs:
        converted = _any_value(kv.value)
        if converted is not None:
            attributes[kv.key] = converted
    return attributes


def decode_protobuf(body: bytes, *, max_spans: int | None = None) -> DecodedBatch:
    """Decode an ``ExportTraceServiceRequest`` in protobuf encoding; :class:`BatchTooLargeError` over
    ``max_spans`` spans (counted before any is converted)."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError, RecursionError) as error:
        raise InputError(f"body is not a valid OTLP protobuf ExportTraceServiceRequest ({error})") from None
    _check_count(sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans), max_spans)
    return decode_request(request)


# -- JSON -------------------------------------------------------------------------------------------------------
def _get(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    return obj[camel] if camel in obj else obj.get(snake)


_INT64 = (-(2**63), 2**63 - 1)
_MAX_NESTING = 64


def _text(value: object) -> str:
    """A string as stored (see :func:`reflect_otel._values.utf8_text`)."""
    return utf8_text(str(value))


def _json_value(value: object) -> AttributeValue | None:
    if not isinstance(value, Mapping):
        return None
    if "stringValue" in value or "string_value" in value:
        return _text(_get(value, "stringValue", "string_value"))
    if "boolValue" in value or "bool_value" in value:
        return bool(_get(value, "boolValue", "bool_value"))
    if "intValue" in value or "int_value" in value:
        return _json_int(_get(value, "intValue", "int_value"))  # int64 is a JSON string in OTLP/JSON
    if "doubleValue" in value or "double_value" in value:
        try:
            number = float(_get(value, "doubleValue", "double_value"))
        except (TypeError, ValueError, OverflowError):
            return None
        return number if math.isfinite(number) else str(number)  # "inf", "nan": kept, as text a store can hold
    if any(key in value for key in ("arrayValue", "array_value", "kvlistValue", "kvlist_value")):
        return _structured(_plain_json(value, 0))
    if "bytesValue" in value or "bytes_value" in value:
        return _text(_get(value, "bytesValue", "bytes_value"))
    return None


def _plain_json(value: object, depth: int) -> object:
    """An OTLP/JSON ``AnyValue`` as plain Python (arrays and key-value lists nested at most 64 deep)."""
    if not isinstance(value, Mapping) or depth > _MAX_NESTING:
        return None
    if "arrayValue" in value or "array_value" in value:
        array = _get(value, "arrayValue", "array_value")
        values = array.get("values", []) if isinstance(array, Mapping) else []
        return [_plain_json(v, depth + 1) for v in values] if isinstance(values, list) else []
    if "kvlistValue" in value or "kvlist_value" in value:
        kvlist = _get(value, "kvlistValue", "kvlist_value")
        pairs = kvlist.get("values", []) if isinstance(kvlist, Mapping) else []
        if not isinstance(pairs, list):
            return {}
        return {str(kv.get("key")): _plain_json(kv.get("value"), depth + 1) for kv in pairs if isinstance(kv, Mapping)}
    return _json_value(value)


def _json_int(value: object) -> int | None:
    """An OTLP (u)int64 field; None when absent, not a number, infinite or out of the 64-bit range."""
    try:
        number = int(value) if value not in (None, "") else None  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(float("inf")) from a JSON Infinity
        return None
    return number if number is None or _INT64[0] <= number <= _INT64[1] else None


def _json_status(status: object) -> tuple[str, str | None]:
    if not isinstance(status, Mapping):
        return "unset", None
    code = status.get("code", 0)
    text = _JSON_STATUS.get(code, "unset") if isinstance(code, str) else _STATUS.get(_json_int(code) or 0, "unset")
    message = status.get("message")
    return text, _text(message) if message else None


def _list(obj: Mapping[str, Any], *keys: str) -> Iterable[Mapping[str, Any]]:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return [v for v in value if isinstance(v, Mapping)]
    return []


def decode_json_document(document: object) -> DecodedBatch:
    """Spans of an already-parsed OTLP/JSON ``ExportTraceServiceRequest`` (ids in hex, as OTLP/JSON requires)."""
    if not isinstance(document, Mapping) or not any(k in document for k in ("resourceSpans", "resource_spans")):
        raise InputError("JSON body is not an OTLP ExportTraceServiceRequest (no 'resourceSpans')")
    batch = DecodedBatch()
    for resource_spans in _list(document, "resourceSpans", "resource_spans"):
        resource = resource_spans.get("resource")
        service = service_name(_json_attributes(resource) if isinstance(resource, Mapping) else None)
        for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans", "instrumentationLibrarySpans"):
            scope_obj = scope_spans.get("scope") or scope_spans.get("instrumentationLibrary") or {}
            scope = _text(scope_obj.get("name") or "") or None if isinstance(scope_obj, Mapping) else None
            for span in _list(scope_spans, "spans"):
                trace_id = str(_get(span, "traceId", "trace_id") or "").lower()
                span_id = str(_get(span, "spanId", "span_id") or "").lower()
                name = _text(span.get("name", ""))
                if not is_trace_id(trace_id) or not is_span_id(span_id):
                    batch.reject(f"span {name!r} has an invalid trace or span id (OTLP/JSON ids are hex)")
                    continue
                parent = str(_get(span, "parentSpanId", "parent_span_id") or "").lower() or None
                if parent is not None and not is_span_id(parent):
                    batch.reject(f"span {span_id} has an invalid parent span id")
                    continue
                start = _json_int(_get(span, "startTimeUnixNano", "start_time_unix_nano"))
                if start is None or start < 0:
                    batch.reject(f"span {span_id} has no valid startTimeUnixNano (a 64-bit count of ns since 1970)")
                    continue
                end = _json_int(_get(span, "endTimeUnixNano", "end_time_unix_nano"))
                attributes = _json_attributes(span)
                events = tuple(
                    SpanEvent(_text(event.get("name", "")), _json_attributes(event))
                    for event in list(_list(span, "events"))[:MAX_EVENTS_PER_SPAN]
                )
                status, message = _json_status(span.get("status"))
                flags = _json_int(span.get("flags")) or 0
                batch.spans.append(
                    SpanRecord(
                        trace_id=trace_id,
                        span_id=span_id,
                        parent_id=parent,
                        parent_is_remote=bool(flags & _HAS_IS_REMOTE and flags & _IS_REMOTE),
                        name=name,
                        start_ns=start,
                        end_ns=end if end is not None and end >= start else None,
                        attributes=attributes,
                        status=status,
                        status_message=message,
                        dropped_attributes=_json_int(_get(span, "droppedAttributesCount", "dropped_attributes_count"))
                        or 0,
                        scope=scope,
                        events=events,
                        service=service,
                    )
                )
    return batch


def _json_attributes(obj: Mapping[str, Any]) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    for kv in _list(obj, "attributes"):
        converted = _json_value(kv.get("value"))
        if converted is not None and isinstance(kv.get("key"), str):
            attributes[_text(kv["key"])] = converted
    return attributes


def decode_json(body: bytes, *, max_spans: int | None = None) -> DecodedBatch:
    """Decode an OTLP/JSON body; invalid UTF-8 is replaced rather than rejected; :class:`BatchTooLargeError` over
    ``max_spans`` spans (counted before any is converted)."""
    try:
        document = json.loads(body.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as error:
        raise InputError(f"body is not valid JSON ({error})") from None
    if isinstance(document, Mapping):
        _check_count(
            sum(
                len(list(_list(scope, "spans")))
                for resource in _list(document, "resourceSpans", "resource_spans")
                for scope in _list(resource, "scopeSpans", "scope_spans", "instrumentationLibrarySpans")
            ),
            max_spans,
        )
    return decode_json_document(document)
