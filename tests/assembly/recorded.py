"""The spans of the recorded runs in ``golden/`` (real instrumentations), for the tests of each pass."""

from __future__ import annotations

import json
from pathlib import Path

from reflect_otel.collectors.otlp import decode_json_document
from reflect_otel.reading.assembly.scrub import AssemblyLimits, TextRules
from reflect_otel.reading.redaction import default_redactor
from reflect_otel.reading.spans import SpanRecord

GOLDEN = Path(__file__).parent / "golden"

LANGGRAPH_OBSERVED = "langgraph-observe-observe-in-an-instrumented-langgraph-app-gives-one-step-per-decision"
"""LangChain's ChatOpenAI spans and the OpenAI client's spans beside them: each model call recorded twice."""
LANGGRAPH_REACT = "instrumented-agents-langgraph-react-agent-assembles-exact-steps"
AUTOGEN = "autogen-autogen-assistant-agent-openinference"
"""AutoGen's model span with the OpenAI client's span nested in it."""
AUTOGEN_ALONE = "autogen-autogen-assistant-agent-openinference-alone"
LITELLM = "litellm-litellm-tool-loop-openai"
"""No tool spans: the results reach the model as tool messages only."""
HANDOFF = "openai-agents-a-handoff-is-one-step"
LLAMAINDEX_FUNCTION = "llamaindex-llamaindex-function-agent"
LLAMAINDEX_REACT = "llamaindex-llamaindex-react-agent"
SMOLAGENTS_CODE = "smolagents-code-agent"
SMOLAGENTS_TOOLS = "smolagents-tool-calling-agent"
OPENAI_TOOL_LOOP = "instrumented-agents-openai-tool-loop-assembles-exact-steps"
ADK_ALONE = "google-adk-adk-instrumentor-alone-says-the-model-calls-are-missing"
ADK_WITHOUT_CONTENT = "google-adk-adk-native-genai-spans-without-content-name-the-variable"


def recorded_spans(name: str) -> list[SpanRecord]:
    batch = decode_json_document(json.loads((GOLDEN / f"{name}.otlp.json").read_text(encoding="utf-8")))
    assert not batch.rejected
    return batch.spans


def rules() -> TextRules:
    return TextRules(AssemblyLimits(), default_redactor())
