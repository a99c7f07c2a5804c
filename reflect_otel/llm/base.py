"""The LLM contract and what every backend shares: JSON parsing and one repair retry."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, Literal, Protocol, TypeVar, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from reflect_otel.errors import LLMError

__all__ = [
    "PROMPT_CHARS_PER_TOKEN",
    "ChatMessage",
    "Check",
    "Completion",
    "LLMBase",
    "LLMOutputError",
    "LLMRequest",
    "LLMUsage",
    "PromptBudget",
    "StructuredLLM",
    "complete_with_repair",
    "degenerate",
    "estimated_tokens",
    "parse_output",
    "prompt_budget",
    "schema_instruction",
]

OutputT = TypeVar("OutputT", bound=BaseModel)
_FROZEN = ConfigDict(frozen=True, extra="forbid")

Check = Callable[[OutputT], "str | None"]
"""A semantic check of a parsed output: None when fine, else the problem, sent back to the model once."""


class ChatMessage(BaseModel):
    model_config = _FROZEN

    role: Literal["system", "developer", "user", "assistant"]
    content: str


class LLMUsage(BaseModel):
    model_config = _FROZEN

    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cached_prompt_tokens: int | None = None
    """Prompt tokens the endpoint served from its prompt cache; None where the endpoint does not say."""

    def __add__(self, other: LLMUsage) -> LLMUsage:
        cached = (
            None
            if self.cached_prompt_tokens is None and other.cached_prompt_tokens is None
            else (self.cached_prompt_tokens or 0) + (other.cached_prompt_tokens or 0)
        )
        return LLMUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            seconds=self.seconds + other.seconds,
            cached_prompt_tokens=cached,
        )


@dataclass(frozen=True, slots=True)
class Completion(Generic[OutputT]):
    """A parsed, validated output with what it cost. ``attempts`` is 2 when the repair retry was needed."""

    value: OutputT
    usage: LLMUsage
    raw: str
    attempts: int


class LLMOutputError(LLMError):
    """The model's output never matched the schema; ``usage`` is what the attempts cost."""

    def __init__(self, message: str, usage: LLMUsage, attempts: int) -> None:
        super().__init__(message)
        self.usage = usage
        self.attempts = attempts


class StructuredLLM(Protocol):
    """A chat model that returns JSON validated into a pydantic model.

    ``complete`` sends ``messages`` asking for JSON matching ``output``'s schema, parses and validates the reply
    (and runs ``check`` on it); on failure it retries once, telling the model what was wrong. ``temperature``
    samples this one call at another temperature than the configured one (proposals are sampled, tests are
    greedy); None keeps the configured one. Returns a
    :class:`Completion`. Raises :class:`LLMError` when the endpoint fails after its retries (429, 5xx, connection
    errors, timeouts) or :class:`LLMOutputError` when the output still does not validate. Must be safe to call
    from several threads.
    """

    @property
    def model_name(self) -> str:
        """The model served, as reported in records, the store and spans."""
        ...

    def complete(
        self,
        messages: Sequence[ChatMessage],
        output: type[OutputT],
        *,
        stage: str,
        check: Check[OutputT] | None = None,
        temperature: float | None = None,
    ) -> Completion[OutputT]: ...


@dataclass(frozen=True, slots=True)
class LLMRequest(Generic[OutputT]):
    """One call of :meth:`StructuredLLM.complete`, its arguments as one value (what wrappers pass on)."""

    messages: Sequence[ChatMessage]
    output: type[OutputT]
    stage: str
    check: Check[OutputT] | None = None
    temperature: float | None = None

    def to(self, llm: StructuredLLM) -> Completion[OutputT]:
        """The same call made of ``llm``."""
        return llm.complete(
            self.messages, self.output, stage=self.stage, check=self.check, temperature=self.temperature
        )


class LLMBase:
    """A :class:`StructuredLLM` that takes each call as one :class:`LLMRequest`: subclasses implement
    :meth:`answer` (the contract is :class:`StructuredLLM`'s)."""

    def complete(
        self,
        messages: Sequence[ChatMessage],
        output: type[OutputT],
        *,
        stage: str,
        check: Check[OutputT] | None = None,
        temperature: float | None = None,
    ) -> Completion[OutputT]:
        return self.answer(LLMRequest(messages, output, stage, check, temperature))

    def answer(self, request: LLMRequest[OutputT]) -> Completion[OutputT]:
        raise NotImplementedError


PROMPT_CHARS_PER_TOKEN = 3.0
"""Characters per token assumed where a backend cannot count tokens: below every ratio measured with Qwen2.5's
tokenizer on the development traces except BIG-Bench-Mistake's arithmetic (2.7 to 4.5 characters a token)."""


def estimated_tokens(text: str) -> int:
    """Tokens ``text`` takes at :data:`PROMPT_CHARS_PER_TOKEN`, rounded up."""
    return math.ceil(len(text) / PROMPT_CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class PromptBudget:
    """The tokens a prompt may take on a model (its context less the reply it may write), and how to count them."""

    tokens: int
    count: Callable[[str], int] = estimated_tokens


def prompt_budget(llm: object) -> PromptBudget | None:
    """``llm``'s budget from its ``config.context_tokens`` (:class:`~reflect_otel.config.LLMConfig`), counted by its
    ``count_tokens`` where it has one (the local backend's own tokenizer), else estimated; None when the backend
    does not say its context. Wrappers (recording, budgets, lazy start) are looked through by their ``inner``."""
    for _ in range(8):  # wrappers nest a few deep at most
        config = getattr(llm, "config", None)
        context = getattr(config, "context_tokens", None)
        if isinstance(context, int):
            count = getattr(llm, "count_tokens", None)
            tokens = max(0, context - int(getattr(config, "max_output_tokens", 0)))
            return PromptBudget(tokens, count if callable(count) else estimated_tokens)
        llm = getattr(llm, "inner", None)
        if llm is None:
            return None
    return None


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_output(text: str, output: type[OutputT]) -> OutputT:
    """``text`` as ``output``: tolerates a code fence or prose around one JSON object. Raises ValueError."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body, strict=False)  # models put raw newlines inside strings
    except ValueError:
        start, end = body.find("{"), body.rfind("}")
        if start < 0 or end <= start:
            raise ValueError("the reply holds no JSON object") from None
        try:
            data = json.loads(body[start : end + 1], strict=False)
        except ValueError as error:
            raise ValueError(f"the reply is not valid JSON ({error})") from None
    try:
        return output.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in error.errors()[:5])
        raise ValueError(problems) from None


def schema_instruction(output: type[BaseModel]) -> str:
    """The sentence every request ends with: the JSON schema the reply must match."""
    return "Reply with only a JSON object matching this JSON schema:\n" + json.dumps(
        output.model_json_schema(), separators=(",", ":")
    )


def _normalised(text: str) -> str:
    return " ".join(text.lower().strip().strip("<>\"'.:;,").replace("_", " ").split())


def _schema_texts(output: type[BaseModel]) -> frozenset[str]:
    """Every title, description, reference and property name in ``output``'s JSON schema, normalised."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("title", "description", "$ref") and isinstance(value, str):
                    found.add(_normalised(value))
                if key == "properties" and isinstance(value, dict):
                    found.update(_normalised(name) for name in value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(output.model_json_schema())
    found.discard("")
    return frozenset(found)


def _texts(value: object, path: str) -> list[tuple[str, str]]:
    if isinstance(value, BaseModel):
        return [
            t
            for name, info in type(value).model_fields.items()
            if get_origin(info.annotation) is not Literal  # a fixed choice, not free text
            for t in _texts(getattr(value, name), f"{path}.{name}" if path else name)
        ]
    if isinstance(value, list | tuple):
        return [t for i, item in enumerate(value) for t in _texts(item, f"{path}.{i}")]
    if isinstance(value, str) and not isinstance(value, Enum):
        return [(path, value)]
    return []


def degenerate(value: BaseModel, output: type[BaseModel]) -> str | None:
    """The problem with a reply that echoes the request instead of answering it (a text field whose value is one
    of the schema's own titles, descriptions, references or field names, as small models do), else None."""
    echoes = _schema_texts(output)
    for path, text in _texts(value, ""):
        if text.strip() and _normalised(text) in echoes:
            return f"{path} is {text[:80]!r}, which repeats the schema instead of answering; write the actual {path}"
    return None


def complete_with_repair(
    send: Callable[[list[ChatMessage]], tuple[str, LLMUsage]],
    messages: Sequence[ChatMessage],
    output: type[OutputT],
    check: Check[OutputT] | None = None,
) -> Completion[OutputT]:
    """Send, parse, check; on a problem, one retry that shows the model its reply and the problem."""
    conversation = list(messages)
    total = LLMUsage()
    problem = ""
    for attempt in (1, 2):
        text, usage = send(conversation)
        total = total + usage
        try:
            value = parse_output(text, output)
        except ValueError as error:
            problem = str(error)
        else:
            found = degenerate(value, output) or (check(value) if check is not None else None)
            if found is None:
                return Completion(value=value, usage=total, raw=text, attempts=attempt)
            problem = found
        conversation += [
            ChatMessage(role="assistant", content=text[:4000]),
            ChatMessage(
                role="user",
                content=f"That reply was not valid: {problem}. Reply again with only a JSON object matching the schema.",
            ),
        ]
    raise LLMOutputError(
        f"{output.__name__}: the reply did not match the schema after one repair attempt ({problem})", total, 2
    )
