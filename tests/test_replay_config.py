"""The replay endpoints file: only its URLs are ever called, credentials come from variables it names, and a bad
file fails naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.errors import ConfigError
from reflect_otel.llm.factory import NoModel
from reflect_otel.replay_adapters.http import HTTPReplayAdapter
from reflect_otel.replay_adapters.remote import load_replay_endpoints
from reflect_otel.testing import make_trace
from reflect_otel.trace import StructuredTrace, TraceSource

GOOD = """
[[endpoint]]
service = "table-agent"
agent = "table_qa"
url = "http://10.0.0.7:8900/replay"
timeout_s = 60
headers = { "X-Team" = "search" }
headers_from_env = { "Authorization" = "AGENT_TOKEN" }

[[endpoint]]
service = "table-agent"
url = "https://replay.example/any-agent"
"""


def _trace(service: str | None, agent: str | None, *, content: str = "ok") -> StructuredTrace:
    trace = make_trace("q", [{"tool": "fetch", "args": {"url": content}, "result": content}], final_answer="a")
    return trace.model_copy(update={"source": TraceSource(service=service), "agent": agent})


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "replay.toml"
    path.write_text(text)
    return path


def test_the_first_matching_endpoint_serves_a_trace_and_only_configured_urls_are_used(tmp_path: Path) -> None:
    endpoints = load_replay_endpoints(_file(tmp_path, GOOD), {"AGENT_TOKEN": "Bearer s3cret"})
    named = endpoints(_trace("table-agent", "table_qa"), NoModel())
    other_agent = endpoints(_trace("table-agent", "planner"), NoModel())
    assert isinstance(named, HTTPReplayAdapter) and named.url == "http://10.0.0.7:8900/replay"
    assert named._client.headers["Authorization"] == "Bearer s3cret" and named._client.headers["X-Team"] == "search"
    assert isinstance(other_agent, HTTPReplayAdapter) and other_agent.url == "https://replay.example/any-agent"
    # a trace naming an address in its content, or of a service the file does not name, gets no endpoint
    assert endpoints(_trace("other", None, content="http://169.254.169.254/replay"), NoModel()) is None
    assert endpoints(_trace(None, "table_qa"), NoModel()) is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (GOOD, "set AGENT_TOKEN"),
        ('[[endpoint]]\nservice = "a"\nurl = "file:///etc/passwd"\n', "not an http:// or https:// URL"),
        ('[[endpoint]]\nservice = "a"\nurl = "http://u:p@h/replay"\n', "put credentials in headers_from_env"),
        ('[[endpoint]]\nservice = "a"\nurl = "http://h/r"\nretries = 3\n', "endpoint 1: retries"),
        ('[[endpoint]]\nurl = "http://h/r"\n', "endpoint 1: service"),
        ('[[endpoints]]\nservice = "a"\n', "use [[endpoint]] entries"),
        ("", "no [[endpoint]] entries"),
        ("[[endpoint]\n", "not valid TOML"),
    ],
)
def test_a_bad_file_fails_naming_the_fix(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        load_replay_endpoints(_file(tmp_path, text), {})


def test_a_missing_or_huge_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_replay_endpoints(tmp_path / "absent.toml")
    huge = tmp_path / "huge.toml"
    huge.write_text("# " + "x" * (1 << 20))
    with pytest.raises(ConfigError, match="larger than"):
        load_replay_endpoints(huge)


def test_a_runs_service_and_expected_answer_come_from_its_resource_and_root_span() -> None:
    from reflect_otel.collectors.otlp import decode_json_document
    from reflect_otel.reading.assembly import assemble_trace
    from reflect_otel.testing.otlp_bodies import json_request, json_span

    trace_id = "ab" * 16
    root = json_span(trace_id, "01" * 8, None, "AGENT", 1, input__value="q?", reflect__expected_answer="Paris")
    tool = json_span(trace_id, "02" * 8, "01" * 8, "TOOL", 2, tool__name="fetch", output__value="x")
    body = json_request(root, tool)
    body["resourceSpans"][0]["resource"] = {  # type: ignore[index]
        "attributes": [{"key": "service.name", "value": {"stringValue": "table-agent"}}]
    }
    trace = assemble_trace(decode_json_document(body).spans)
    assert trace.source.service == "table-agent"
    assert trace.metadata["expected_answer"] == "Paris"
    unnamed = assemble_trace(decode_json_document(json_request(tool | {"parentSpanId": ""})).spans)
    assert unnamed.source.service is None and "expected_answer" not in unnamed.metadata
