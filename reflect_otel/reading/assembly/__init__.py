"""Spans in, :class:`StructuredTrace` out: a pure function, the same for every collector.

Assembly is a chain of small passes, each a module with one job, each reading frozen values and returning new
ones (like the OTel SDK's span processors, but over a whole trace):

1. :mod:`.tree`: the spans de-duplicated, read through :func:`reflect_otel.reading.genai.as_openinference` (so every rule
   holds for both conventions), parented and walked from the root, once (:class:`~.tree.SpanTree`).
2. :mod:`.messages`: each LLM span's messages, read once; :mod:`.duplicates`: two instrumentations of one model
   call (the same output, one span within the other's time) are one call, the outer one.
3. :mod:`.actions`: the walk as model calls (:mod:`.model_calls`) and tool runs (:mod:`.tool_runs`), in order.
   LLM and TOOL spans are found by ``openinference.span.kind`` only: names and depth lie (LangGraph marks a node
   AGENT because it is called "agent"). An LLM span inside another LLM span is part of the outer call.
4. :mod:`.matching`: each tool call in a model's reply is one step (its text the reasoning, its arguments from the
   model's call: a LangChain TOOL span's ``input.value`` is lossy for one-argument tools), and each tool run or
   tool message answers one call (:class:`~.matching.CallMatcher`); a reply with no tool call is a step (code
   agents act through text).
5. :mod:`.steps`: a trace of one model reply and nothing else is a chain of thought, one step per line; an agent's
   answer handed back by a call (its last step, carrying its output, or a tool its definitions mark as output) is a
   message, not a lookup; the final answer is marked by how the run ends (a last model turn without a tool call, a
   last call carrying the run's answer or handing an agent's back, a last call whose result is the run's answer: a
   run stopped at a tool, as the OpenAI Agents SDK's ``tool_use_behavior`` does, see
   :attr:`~.question.RunEnd.stops_at_tools`; when only an agent span gave the answer, the end of that agent), never
   by a tool's name. Then :mod:`.tools`, :mod:`.question` (question and answer),
   :mod:`.framework` and :mod:`.diagnostics` (the warnings, each naming its fix).

Every text passes through a :class:`~.scrub.Scrubber` (cut to :class:`AssemblyLimits`, secrets replaced); each
pass counts the secrets it replaced and reports them in its result.
"""

from __future__ import annotations

from collections.abc import Iterable

from reflect_otel.reading.redaction import Redactor, default_redactor
from reflect_otel.reading.semconv import LangGraphMetadataKeys, SpanAttributes
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.trace import ReplayMetadata, Step, StructuredTrace, TraceWarning

from .actions import Actions, read_actions
from .context import span_metadata
from .diagnostics import ATTRIBUTE_LIMIT_FIX, Findings, trace_warnings
from .duplicates import second_records
from .framework import trace_source
from .matching import Matched, match_calls
from .messages import read_conversations
from .question import RunEnd, run_end, run_texts
from .scrub import AssemblyLimits, TextRules
from .steps import mark_final_answer, mark_handed_back, split_chain_of_thought
from .tools import AgentTools, agent_tools
from .tree import AGENT, SpanTree

__all__ = ["ATTRIBUTE_LIMIT_FIX", "AssemblyLimits", "assemble_trace"]


def assemble_trace(
    spans: Iterable[SpanRecord],
    *,
    collector: str = "unknown",
    limits: AssemblyLimits | None = None,
    warnings: Iterable[TraceWarning] = (),
    redactor: Redactor | None = None,
) -> StructuredTrace:
    """Rebuild one trace from its spans (any order, duplicates and missing parents tolerated).

    ``warnings`` from the collector (dropped spans, a root that never ended) are carried onto the trace. Every
    text is redacted by ``redactor`` (default: :func:`~reflect_otel.reading.redaction.default_redactor`).
    Raises :class:`InputError` when ``spans`` is empty or mixes traces.
    """
    rules = TextRules(limits or AssemblyLimits(), redactor or default_redactor())
    tree = SpanTree.of(spans)
    conversations = read_conversations(tree)
    actions = read_actions(tree, conversations, second_records(tree, conversations), rules)
    matched = match_calls(actions.actions, rules)
    ending = run_end(tree, rules)
    tools = agent_tools(actions.model_calls, rules)
    steps = _steps(actions, matched, ending, tools)
    user_text = next((call.user_text for call in actions.model_calls if call.user_text), "")
    texts = run_texts(tree, steps, user_text, rules, answer_is_result=ending.stops_at_tools)
    found = Findings(
        tree=tree,
        actions=actions,
        steps=steps,
        question=texts.question,
        secrets=actions.secrets + matched.secrets + tools.secrets + texts.secrets,
        redactor=rules.redactor,
    )
    root = tree.root
    metadata = span_metadata(root) or actions.first_metadata
    thread = metadata.get(LangGraphMetadataKeys.THREAD_ID)
    ends = [s.end_ns for s in tree.spans.values() if s.end_ns is not None]
    return StructuredTrace(
        trace_id=root.trace_id,
        session_id=_session(tree),
        agent=_agent(tree),
        root_span_id=root.span_id,
        question=texts.question,
        final_answer=texts.answer,
        steps=steps,
        source=trace_source(tree, metadata, collector=collector),
        replay=ReplayMetadata(thread_id=str(thread) if thread else None),
        warnings=trace_warnings(warnings, found),
        start_time_ns=min(s.start_ns for s in tree.spans.values()),
        end_time_ns=max(ends) if ends else None,
        metadata=texts.metadata,
        tools=tools.tools,
    )


def _steps(actions: Actions, matched: Matched, ending: RunEnd, tools: AgentTools) -> tuple[Step, ...]:
    """The steps, numbered from 1: a lone model reply split into its chain of thought, an agent's answer handed
    back marked as a message, and the final answer marked by how the run ended."""
    drafts = matched.drafts
    if len(actions.model_calls) == 1 and not actions.tool_runs:
        drafts = split_chain_of_thought(drafts)
    drafts = mark_handed_back(drafts, ending.agent_outputs, tools.output_tools)
    marked = mark_final_answer(
        drafts,
        ending.outputs,
        until_ns=ending.answered_at_ns,
        output_tools=tools.output_tools,
        stops_at_tools=ending.stops_at_tools,
    )
    return tuple(draft.step(index) for index, draft in enumerate(marked, start=1))


def _session(tree: SpanTree) -> str | None:
    session = tree.root.attributes.get(SpanAttributes.SESSION_ID) or next(
        (
            p.span.attributes[SpanAttributes.SESSION_ID]
            for p in tree.order
            if SpanAttributes.SESSION_ID in p.span.attributes
        ),
        None,
    )
    return str(session) if session else None


def _agent(tree: SpanTree) -> str | None:
    """The agent that ran: the root's when it is an AGENT span, else the first AGENT span's."""
    root = tree.root
    agent = root if root.attributes.get(SpanAttributes.OPENINFERENCE_SPAN_KIND) == AGENT else tree.first_agent
    return str(agent.attributes.get(SpanAttributes.AGENT_NAME) or agent.name) if agent else None
