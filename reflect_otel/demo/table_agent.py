"""The table-QA demo agent: a LangGraph ReAct graph whose tools query a WikiTableQuestions table in DuckDB.

The model is any OpenAI-compatible endpoint behind a :class:`~reflect_otel.llm.StructuredLLM` (the local llama.cpp
server included): :class:`StructuredToolChatModel` asks it for one JSON decision per turn, constrained to the
tools' schema, and returns it as a LangChain tool call, so the OpenInference LangChain instrumentation records
ordinary LLM and TOOL spans. Install with ``pip install 'reflect-otel[langgraph]'``.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reflect_otel import _values
from reflect_otel.demo.table_tools import TableWorkspace
from reflect_otel.demo.wtq import WTQQuestion
from reflect_otel.errors import MissingDependencyError, ReplayError
from reflect_otel.llm.base import ChatMessage, Completion, OutputT, StructuredLLM, schema_instruction
from reflect_otel.record import Stage
from reflect_otel.replay import SAMPLING_TEMPERATURE
from reflect_otel.trace import StructuredTrace

try:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.messages.ai import UsageMetadata
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import StructuredTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.errors import GraphRecursionError
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
except ImportError as error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("langgraph", "langgraph") from error

__all__ = ["FinalDecision", "StructuredToolChatModel", "TableDecision", "TableQAAgent"]

_FROZEN = ConfigDict(frozen=True)
Op = Literal["=", "!=", "contains", "starts_with", ">", ">=", "<", "<="]


class Describe(BaseModel):
    model_config = _FROZEN
    tool: Literal["describe"]
    table: str


class FilterRows(BaseModel):
    model_config = _FROZEN
    tool: Literal["filter_rows"]
    table: str
    column: str
    op: Op
    value: str


class SortRows(BaseModel):
    model_config = _FROZEN
    tool: Literal["sort_rows"]
    table: str
    column: str
    descending: bool
    limit: int | None


class GroupAggregate(BaseModel):
    model_config = _FROZEN
    tool: Literal["group_aggregate"]
    table: str
    group_by: str
    aggregate: Literal["count", "sum", "avg", "min", "max"]
    column: str | None


class SelectColumns(BaseModel):
    model_config = _FROZEN
    tool: Literal["select_columns"]
    table: str
    columns: list[str]


class CountRows(BaseModel):
    model_config = _FROZEN
    tool: Literal["count_rows"]
    table: str


class Lookup(BaseModel):
    model_config = _FROZEN
    tool: Literal["lookup"]
    table: str
    column: str
    row: int


class FinalAnswer(BaseModel):
    model_config = _FROZEN
    tool: Literal["final_answer"]
    answer: str


Action = Annotated[
    Describe | FilterRows | SortRows | GroupAggregate | SelectColumns | CountRows | Lookup | FinalAnswer,
    Field(discriminator="tool"),
]


class TableDecision(BaseModel):
    """One turn of the agent: why, then one action."""

    model_config = _FROZEN
    thought: str = Field(max_length=200, description="one short sentence")
    action: Action


class FinalDecision(BaseModel):
    """The last turn the step budget allows: why, then the answer (no more tools)."""

    model_config = _FROZEN
    thought: str = Field(max_length=200, description="one short sentence")
    action: FinalAnswer


_SYSTEM = """You answer a question about a table by calling one tool per turn.
The table is t0. Each tool that derives a table names it (t1, t2, ...) in its result; use those names.
Tools:
- describe(table): rows, columns and first rows
- filter_rows(table, column, op, value): op is one of = != contains starts_with > >= < <= (> and < compare numbers)
- sort_rows(table, column, descending, limit): sorted rows; limit null for all
- group_aggregate(table, group_by, aggregate, column): aggregate is count, sum, avg, min or max
- select_columns(table, columns)
- count_rows(table)
- lookup(table, column, row): the cell in that row (1-based)
- final_answer(answer): the answer alone, as short as possible (a value, a name, or several separated by commas)
The table:
{table}"""


def _render(messages: list[BaseMessage]) -> list[ChatMessage]:
    """LangChain messages as plain chat turns for any endpoint (no native tool-calling needed)."""
    rendered = []
    for message in messages:
        text = message.content if isinstance(message.content, str) else str(message.content)
        if isinstance(message, SystemMessage):
            rendered.append(ChatMessage(role="system", content=text))
        elif isinstance(message, HumanMessage):
            rendered.append(ChatMessage(role="user", content=text))
        elif isinstance(message, AIMessage):
            calls = "; ".join(f"{c['name']}({c['args']})" for c in message.tool_calls)
            rendered.append(ChatMessage(role="assistant", content=f"{text}\nAction: {calls}" if calls else text))
        elif isinstance(message, ToolMessage):
            rendered.append(ChatMessage(role="user", content=f"Result of {message.name}:\n{text}"))
    return rendered


def _repeats(action: BaseModel, done: list[tuple[str, dict[str, Any]]]) -> bool:
    """True for a tool call identical (tool and arguments) to one already made."""
    if isinstance(action, FinalAnswer):
        return False
    return (getattr(action, "tool", ""), action.model_dump(exclude={"tool"})) in done


class StructuredToolChatModel(BaseChatModel):
    """A LangChain chat model that gets one JSON decision per turn from a :class:`StructuredLLM`.

    The decision schema sits in the system message, so every turn only appends to the previous prompt (a prompt
    cache reuses all of it). An identical tool call (same tool, same arguments) is sent back once with the reason;
    after ``max_steps`` tool calls the model must give its final answer, so a run ends with an answer to judge."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: Any
    system_prompt: str
    max_steps: int = 8

    @property
    def _llm_type(self) -> str:
        return "reflect-structured"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": getattr(self.llm, "model_name", "unknown")}

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """The decision schema already lists the tools; binding them still passes their definitions with every
        call, so the instrumentation records them on the LLM span as any tool-calling model's would."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools])

    def _decide(
        self, conversation: list[ChatMessage], final: bool, temperature: float | None = None
    ) -> Completion[TableDecision | FinalDecision]:
        output: type[TableDecision | FinalDecision] = FinalDecision if final else TableDecision
        return self._ask(conversation, output, temperature)

    def _ask(
        self, conversation: list[ChatMessage], output: type[OutputT], temperature: float | None
    ) -> Completion[OutputT]:
        system = ChatMessage(role="system", content=f"{self.system_prompt}\n\n{schema_instruction(output)}")
        llm: StructuredLLM = self.llm
        return llm.complete([system, *conversation], output, stage=Stage.AGENT, temperature=temperature)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        conversation = _render(messages)
        done = [(c["name"], c["args"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
        final = len(done) >= self.max_steps
        sampled = kwargs.get("temperature")  # a proposal's first decision (see TableQAAgent)
        temperature = float(sampled) if isinstance(sampled, int | float) else None
        asked = self._decide(conversation, final, temperature)
        usage = asked.usage  # every call this turn made: the run's token counts are the agent's cost
        decision = asked.value
        action = decision.action
        if _repeats(action, done):
            repeat = f"{action.tool}({action.model_dump(exclude={'tool'})})"
            conversation = [
                *conversation,
                ChatMessage(role="assistant", content=f"{decision.thought}\nAction: {repeat}"),
                ChatMessage(
                    role="user",
                    content=f"You already called {repeat}; its result is above. Do not repeat a call: use that "
                    "result, call another tool, or give the final answer.",
                ),
            ]
            asked = self._decide(conversation, final, temperature)
            usage += asked.usage
            decision = asked.value
            action = decision.action
            if _repeats(action, done):
                asked = self._decide(conversation, True, temperature)  # repeating again: it must answer now
                usage += asked.usage
                decision = asked.value
                action = decision.action
        # LangChain's usage field, which the OpenInference instrumentation records as the LLM span's token counts
        tokens = UsageMetadata(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
        )
        if isinstance(action, FinalAnswer):
            message = AIMessage(content=action.answer, usage_metadata=tokens)
        else:
            args = action.model_dump(exclude={"tool"})
            message = AIMessage(
                content=decision.thought,
                tool_calls=[{"name": action.tool, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}"}],
                usage_metadata=tokens,
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


_LINE_CHARS = 200


def _difference(result: str, recorded: str) -> str | None:
    """Where ``result`` departs from the ``recorded`` one, as its first differing line, or None when they are the
    same text: the whole text, since a row out of place anywhere changes what a later call on the table reads (only
    the part kept, when the trace cut the recorded one short). Nothing recorded is nothing to check."""
    if not recorded:
        return None
    kept, cut = _values.untruncated(recorded)
    if cut and result.startswith(kept):
        if len(result) == len(kept) + cut:
            return None
        return f"{len(result)} characters now, {len(kept) + cut} in the run (its record cut after {len(kept)})"
    if result == kept:
        return None
    now_lines, run_lines = result.splitlines(), kept.splitlines()
    number = next(
        (n for n, (a, b) in enumerate(zip(now_lines, run_lines, strict=False)) if a != b),
        min(len(now_lines), len(run_lines)),
    )
    if number >= max(len(now_lines), len(run_lines)):
        return f"the same lines, ending in {result[-20:]!r} now, {kept[-20:]!r} in the run"

    def line(lines: list[str]) -> str:
        return repr(lines[number][:_LINE_CHARS]) if number < len(lines) else "nothing"

    return f"line {number + 1} is {line(now_lines)} now, {line(run_lines)} in the run"


class TableQAAgent:
    """One question, its table and its graph. ``graph`` is compiled with an in-memory checkpointer, so its runs
    can be forked for replay (``LangGraphReplayAdapter(agent.graph, ...)``: the agent asks for temperature 0,
    except for a proposal's decision, sampled at the temperature its config carries under
    :data:`~reflect_otel.replay.SAMPLING_TEMPERATURE`; pass ``deterministic=True`` only when its model repeats itself
    at 0, as the embedded local server does and a remote API does not)."""

    def __init__(self, question: WTQQuestion, llm: StructuredLLM, *, max_steps: int = 8) -> None:
        self.question = question
        self.workspace = TableWorkspace(question.table)
        self.max_steps = max_steps
        ws = self.workspace
        tools = [
            StructuredTool.from_function(ws.describe),
            StructuredTool.from_function(ws.filter_rows),
            StructuredTool.from_function(ws.sort_rows),
            StructuredTool.from_function(ws.group_aggregate),
            StructuredTool.from_function(ws.select_columns),
            StructuredTool.from_function(ws.count_rows),
            StructuredTool.from_function(ws.lookup),
        ]
        self.tools = {tool.name: tool for tool in tools}
        self.table_context = f"The table the agent was given (t0):\n{ws.describe('t0')}"
        """What the agent sees of its table, for the auditor (``observe(context=...)``)."""
        model = StructuredToolChatModel(
            llm=llm, system_prompt=_SYSTEM.format(table=ws.describe("t0")), max_steps=max_steps
        )
        graph = StateGraph(MessagesState)
        bound = model.bind_tools(tools)

        def decide(state: MessagesState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
            # a replay adapter's proposal asks for a sampled decision; runs and replays decide greedily
            sampled = (config.get("configurable") or {}).get(SAMPLING_TEMPERATURE)
            model = bound.bind(temperature=float(sampled)) if isinstance(sampled, int | float) else bound
            return {"messages": [model.invoke(state["messages"])]}

        graph.add_node("agent", decide)
        graph.add_node("tools", ToolNode(tools))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        self.graph = graph.compile(checkpointer=InMemorySaver())

    def restore(self, trace: StructuredTrace) -> None:
        """Bring this agent's workspace to where ``trace``'s run left it (:meth:`rewind` past its last step)."""
        self.rewind(trace, len(trace.steps))

    def rewind(self, trace: StructuredTrace, rollback_point: int) -> None:
        """Bring this agent's workspace to where ``trace``'s run was after step ``rollback_point``, so that a replay
        from there reads the table names its run read: back to the question's table, then the tool calls of the
        kept steps re-run in order (the tools are read-only and deterministic), each checked against the result
        recorded. The replay adapter calls it before every replay (``LangGraphReplayAdapter(restore_state=...)``).
        Raises :class:`ReplayError` naming the first call that does not give it."""
        self.workspace.reset()
        for step in trace.steps[:rollback_point]:
            tool = self.tools.get(step.tool_name or "")
            if tool is None:
                continue
            try:
                result = str(tool.invoke(dict(step.tool_args)))
            except Exception as error:  # the recorded arguments are data: a bad one is a mismatch, not a crash
                result = f"error: {error}"
            difference = _difference(result, step.tool_result or "")
            if difference:
                raise ReplayError(
                    f"step {step.index}: {step.tool_name} gives another result now than the run recorded ({difference})"
                    "; the run's tables cannot be restored"
                )

    @property
    def recursion_limit(self) -> int:
        return 2 * self.max_steps + 2

    def answer(self, thread_id: str | None = None) -> str:
        """Run the agent; its final message is the answer (after ``max_steps`` calls the model must give one), or ""
        when the graph did not finish.
        Raises if the model endpoint fails."""
        config: Any = {
            "configurable": {"thread_id": thread_id or uuid.uuid4().hex},
            "recursion_limit": self.recursion_limit,
        }
        try:
            state = self.graph.invoke({"messages": [HumanMessage(self.question.question)]}, config)
        except GraphRecursionError:
            return ""
        content = state["messages"][-1].content
        return content if isinstance(content, str) else str(content)
