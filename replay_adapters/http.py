"""Replay of an agent in another process or language, over a small HTTP protocol.

Request: ``POST <url>`` with ``Content-Type: application/json``::

    {"protocol": "reflect-otel.replay.v1", "trace": <StructuredTrace JSON>, "rollback_point": 3,
     "injection": "IMPORTANT - CORRECTION CONTEXT: ...", "injection_role": "system"}

The agent keeps steps 1..rollback_point of ``trace`` (without re-running their tools), adds ``injection`` to its
context as a message of ``injection_role``, continues, and answers ``200`` with either

* ``{"trace": <StructuredTrace JSON of the whole replayed run>, "prefix_verified": true, "final_answer": "..."}``, or
* ``{"otlp": <OTLP/JSON ExportTraceServiceRequest holding the continuation's spans>, "prefix_verified": true,
  "final_answer": "..."}`` (reflect-otel assembles the spans and stitches them after the kept steps),

plus an optional ``"adapter_info": {string: string}``. Any other status, with ``{"error": "..."}``, is a failed
replay. ``prefix_verified`` is the agent's word that its first new model call received exactly the prefix plus
the injection. :func:`replay_handler` serves this protocol for a Python agent with any other adapter.

Version 2 (``"protocol": "reflect-otel.replay.v2"``) adds an optional ``"action"``: ``{"tool_name": "...",
"arguments": {...}}`` (or ``{"text": "..."}`` for a chain of thought), which the agent executes for real as step
``rollback_point + 1`` before continuing (the replay contract's action intervention). The adapter sends version 1
for guidance, so agents that serve only version 1 keep working; :func:`replay_handler` serves both.

Version 3 (``"protocol": "reflect-otel.replay.v3"``) adds proposals: a request with ``"propose": {"samples": n,
"temperature": t}`` asks the agent what it would do at the rollback point (with the injection) without doing it,
and is answered ``{"proposals": [{"action": {...}, "is_final_answer": false}, ...]}``
(:class:`~reflect_otel.replay.ProposesSteps`). The adapter sends it only when its endpoint says ``propose = true``;
a response may also say ``"deterministic": true`` of the agent, which the endpoint's ``deterministic`` setting
states for reflect-otel. A request with ``"resample": {"samples": n, "temperature": t}`` (and ``rollback_point`` 0)
asks for n new runs of the agent on the run's input, sampled (:class:`~reflect_otel.replay.SamplesRuns`), and is
answered ``{"runs": [<an answer as to a replay>, ...]}``; sent only when the endpoint says ``resample = true``.
A request with ``"corrections": {"context": "..."}`` (and ``rollback_point`` 0) asks for the corrections of the
agent's own evidence rules over the run (rules that read that agent's tools, carried by its adapter:
:class:`~reflect_otel.replay.HasCorrectionRules`), and is answered ``{"corrections": [<Correction JSON>, ...]}``:
the rules run beside the agent, which knows what it was given, and the collector tries their corrections as it
tries its own; sent only when the endpoint says ``corrections = true``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import httpx
from pydantic import ValidationError

from reflect_otel.attribution.corrections import Rule, agent_corrections
from reflect_otel.collectors.otlp import decode_json_document
from reflect_otel.errors import InputError, ReplayError
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.record import Correction, InterventionKind
from reflect_otel.replay import (
    InjectionRole,
    ProposedStep,
    ReplayAdapter,
    ReplayRequest,
    ReplayResult,
    agent_rules,
    check_rollback_point,
    is_deterministic,
    proposer,
    replay_with,
    resampler,
)
from reflect_otel.replay_adapters._base import with_options
from reflect_otel.replay_adapters._stitch import stitch
from reflect_otel.trace import Step, StepAction, StructuredTrace

__all__ = [
    "MAX_CORRECTIONS",
    "PROTOCOL",
    "PROTOCOL_V2",
    "PROTOCOL_V3",
    "HTTPReplayAdapter",
    "HTTPReplayOptions",
    "replay_handler",
]

PROTOCOL = "reflect-otel.replay.v1"
PROTOCOL_V2 = "reflect-otel.replay.v2"
PROTOCOL_V3 = "reflect-otel.replay.v3"
_MAX_PROPOSALS = 20
MAX_CORRECTIONS = 200
"""The most corrections an endpoint may send for one run; an answer with more is refused."""
_MAX_CONTEXT_CHARS = 100_000
_CACHED_RUNS = 16


@dataclass(frozen=True)
class HTTPReplayOptions:
    """How :class:`HTTPReplayAdapter` talks to its endpoint, and what the endpoint says it serves: ``deterministic``
    replays, ``proposes`` (protocol v3 proposals), ``resamples`` (v3 resampled runs), ``corrects`` (v3 corrections of
    the agent's own rules). Responses over ``max_response_bytes`` are refused."""

    timeout_s: float = 300.0
    headers: Mapping[str, str] | None = None
    max_response_bytes: int = 64 * 1024 * 1024
    deterministic: bool = False
    proposes: bool = False
    resamples: bool = False
    corrects: bool = False


class HTTPReplayOptionKeywords(TypedDict, total=False):
    """:class:`HTTPReplayOptions`' fields as constructor keywords, so a type checker names a misspelt one."""

    timeout_s: float
    headers: Mapping[str, str] | None
    max_response_bytes: int
    deterministic: bool
    proposes: bool
    resamples: bool
    corrects: bool


class HTTPReplayAdapter:
    """POSTs replay requests to ``url`` (with ``client`` when given), as ``options`` say
    (:class:`HTTPReplayOptions`; keywords name single options and take precedence). With ``corrects``, the agent's
    own correction rules run at the endpoint: :attr:`correction_rules` is one rule that asks for them (once per run
    and context, the answer kept for the run's other steps)."""

    def __init__(
        self,
        url: str,
        *,
        client: httpx.Client | None = None,
        options: HTTPReplayOptions | None = None,
        **option: Unpack[HTTPReplayOptionKeywords],
    ) -> None:
        chosen = with_options(options or HTTPReplayOptions(), option)
        self.url = url
        self.max_response_bytes = chosen.max_response_bytes
        self.deterministic = chosen.deterministic
        self.proposes = chosen.proposes
        self.resamples = chosen.resamples
        self.corrects = chosen.corrects
        self._client = client or httpx.Client(timeout=chosen.timeout_s, headers=dict(chosen.headers or {}))
        self._served_rules = _ServedRules(self)

    @property
    def correction_rules(self) -> tuple[Rule, ...]:
        """The agent's own rules, run at the endpoint (:class:`~reflect_otel.replay.HasCorrectionRules`); none
        unless the endpoint says ``corrections = true``."""
        return (self._served_rules,) if self.corrects else ()

    def served_corrections(self, trace: StructuredTrace, *, context: str = "") -> tuple[Correction, ...]:
        """The corrections the agent's own rules make over ``trace``, as the endpoint sends them, checked: at most
        :data:`MAX_CORRECTIONS`, each an ``evidence:`` correction of a tool call of ``trace``, with that call as
        its original and nothing tried yet. Raises :class:`ReplayError` naming what is wrong."""
        asked = _about_the_run(trace, corrections={"context": context[:_MAX_CONTEXT_CHARS]})
        raw = self._answer(asked).get("corrections")
        if not isinstance(raw, list) or len(raw) > MAX_CORRECTIONS:
            raise ReplayError(
                f"replay endpoint {self.url} answered a corrections request without a 'corrections' list of at "
                f"most {MAX_CORRECTIONS}"
            )
        return tuple(self._checked(trace, item) for item in raw)

    def _checked(self, trace: StructuredTrace, item: object) -> Correction:
        try:
            correction = Correction.model_validate(item)
        except ValidationError as error:
            raise ReplayError(
                f"replay endpoint {self.url} sent an invalid correction: {error.errors()[0]['msg']}"
            ) from None
        steps = trace.steps
        step = steps[correction.step_index - 1] if correction.step_index <= len(steps) else None
        if not correction.source.startswith("evidence:") or step is None or not step.tool_name:
            raise ReplayError(
                f"replay endpoint {self.url} sent a correction that is not an evidence rule's correction of one of "
                f"the run's tool calls (source {correction.source!r}, step {correction.step_index})"
            )
        if correction.kind is InterventionKind.ACTION and correction.replacement is None:
            raise ReplayError(f"replay endpoint {self.url} sent an action correction without a replacement")
        original = StepAction.of_step(step) if correction.kind is InterventionKind.ACTION else correction.original
        return correction.model_copy(update={"original": original, "refused": None, "flipped": False, "replays": 0})

    def replay(self, request: ReplayRequest) -> ReplayResult:
        check_rollback_point(request.trace, request.rollback_point)
        body = _asking(request, PROTOCOL if request.action is None else PROTOCOL_V2)
        if request.action is not None:
            body["action"] = request.action.model_dump(mode="json")
        return self._result(request.trace, request.rollback_point, self._answer(body))

    def propose(self, request: ReplayRequest, *, samples: int = 1) -> tuple[ProposedStep, ...]:
        check_rollback_point(request.trace, request.rollback_point)
        body = _asking(request, PROTOCOL_V3) | {
            "propose": {"samples": samples, "temperature": request.proposal_temperature}
        }
        payload = self._answer(body)
        raw = payload.get("proposals")
        if not isinstance(raw, list) or len(raw) > _MAX_PROPOSALS:
            raise ReplayError(f"replay endpoint {self.url} answered a proposal request without a 'proposals' list")
        try:
            return tuple(ProposedStep.model_validate(item) for item in raw)
        except ValidationError as error:
            raise ReplayError(
                f"replay endpoint {self.url} sent an invalid proposal: {error.errors()[0]['msg']}"
            ) from None

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
        """The endpoint's resamples of the request's run (the protocol's runs start from the run's input)."""
        trace = request.trace
        asked = _about_the_run(trace, resample={"samples": samples, "temperature": request.proposal_temperature})
        runs = self._answer(asked).get("runs")
        if not isinstance(runs, list) or not runs or len(runs) > _MAX_PROPOSALS:
            raise ReplayError(f"replay endpoint {self.url} answered a resample request without a 'runs' list")
        return tuple(self._result(trace, 0, run) for run in runs if isinstance(run, dict))

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        status, content = self._post(body)
        try:
            payload = json.loads(content)
        except ValueError:
            raise ReplayError(f"replay endpoint {self.url} answered {status} with a body that is not JSON") from None
        if status != 200 or not isinstance(payload, dict):
            message = payload.get("error") if isinstance(payload, dict) else None
            shown = message or content[:300].decode("utf-8", "replace")
            raise ReplayError(f"replay endpoint {self.url} answered {status}: {shown}")
        return payload

    def _post(self, body: dict[str, Any]) -> tuple[int, bytes]:
        """The response's status and body, read as a stream that stops at ``max_response_bytes`` (decoded size, so
        a compressed body cannot expand past it either)."""
        limit = self.max_response_bytes
        over = f"replay endpoint {self.url} answered more than {limit} bytes; refused (raise max_response_bytes)"
        try:
            with self._client.stream("POST", self.url, json=body) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise ReplayError(over)
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise ReplayError(over)
                    chunks.append(chunk)
                return response.status_code, b"".join(chunks)
        except httpx.HTTPError as error:
            raise ReplayError(f"replay endpoint {self.url} unreachable: {error}") from None

    def _result(self, trace: StructuredTrace, rollback_point: int, payload: dict[str, Any]) -> ReplayResult:
        info = payload.get("adapter_info") or {}
        adapter_info = {"adapter": "http", "url": self.url} | {str(k): str(v) for k, v in dict(info).items()}
        final = payload.get("final_answer")
        if "trace" in payload:
            try:
                replayed = StructuredTrace.model_validate(payload["trace"])
            except ValidationError as error:
                raise ReplayError(f"the replay endpoint sent an invalid trace: {error.errors()[0]['msg']}") from None
            if replayed.steps[:rollback_point] != trace.steps[:rollback_point]:
                raise ReplayError(f"the replay endpoint did not keep steps 1..{rollback_point} unchanged")
        elif "otlp" in payload:
            try:
                batch = decode_json_document(payload["otlp"])
                continuation = assemble_trace(batch.spans, collector="replay")
            except InputError as error:
                raise ReplayError(f"the replay endpoint sent unusable spans: {error}") from None
            replayed = stitch(
                trace,
                rollback_point,
                continuation.steps,
                trace_id=continuation.trace_id,
                final_answer=str(final) if final is not None else continuation.final_answer,
            )
        else:
            raise ReplayError("the replay endpoint's answer has neither 'trace' nor 'otlp'")
        if len(replayed.steps) <= rollback_point:
            raise ReplayError("the replay endpoint sent no continuation")
        return ReplayResult(
            trace=replayed,
            rollback_point=rollback_point,
            final_answer=str(final) if final is not None else replayed.final_answer,
            prefix_verified=payload.get("prefix_verified") is True,
            adapter_info=adapter_info,
        )


def _asking(request: ReplayRequest, protocol: str) -> dict[str, Any]:
    """The body's fields every protocol request has, from ``request``."""
    return {
        "protocol": protocol,
        "trace": request.trace.model_dump(mode="json"),
        "rollback_point": request.rollback_point,
        "injection": request.injection,
        "injection_role": request.injection_role.value,
    }


def _about_the_run(trace: StructuredTrace, **ask: dict[str, Any]) -> dict[str, Any]:
    """A v3 request about the whole run (``resample``, ``corrections``): no rollback point, nothing injected."""
    return _asking(ReplayRequest(trace=trace), PROTOCOL_V3) | ask


def _request_of(trace: StructuredTrace, body: dict[str, Any], temperature: float | None = None) -> ReplayRequest:
    """The :class:`ReplayRequest` a protocol body asks for (the caller has checked its protocol)."""
    action = StepAction.model_validate(body["action"]) if body.get("action") is not None else None
    return ReplayRequest(
        trace=trace,
        rollback_point=int(body["rollback_point"]),
        injection=str(body.get("injection", "")),
        injection_role=InjectionRole(body.get("injection_role", "system")),
        action=action,
        temperature=temperature,
    )


class _ServedRules:
    """The one rule :attr:`HTTPReplayAdapter.correction_rules` gives: the corrections of ``step`` among those the
    endpoint sends for the run, asked once per run and context (the last few runs' kept)."""

    def __init__(self, adapter: HTTPReplayAdapter) -> None:
        self.adapter = adapter
        self.__qualname__ = f"rules served at {adapter.url}"  # how a failure is logged
        self._runs: OrderedDict[tuple[str, int, str], tuple[Correction, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, trace: StructuredTrace, step: Step, context: str) -> list[Correction]:
        key = (trace.trace_id, len(trace.steps), context)
        with self._lock:
            found = self._runs.get(key)
        if found is None:
            found = self.adapter.served_corrections(trace, context=context)
            with self._lock:
                self._runs[key] = found
                while len(self._runs) > _CACHED_RUNS:
                    self._runs.popitem(last=False)
        return [c for c in found if c.step_index == step.index]


def replay_handler(adapter: ReplayAdapter, body: bytes) -> tuple[int, bytes]:
    """Serve one protocol request with ``adapter``: (status, JSON body). For the agent's side of the wire."""
    try:
        request = json.loads(body)
        if not isinstance(request, dict) or request.get("protocol") not in (PROTOCOL, PROTOCOL_V2, PROTOCOL_V3):
            raise ValueError(f"expected a {PROTOCOL}, {PROTOCOL_V2} or {PROTOCOL_V3} request")
        if "action" in request and request["protocol"] == PROTOCOL:
            raise ValueError(f"an action needs {PROTOCOL_V2} or later")
        trace = StructuredTrace.model_validate(request["trace"])
        if request.get("propose") is not None:
            return _serve_proposals(adapter, trace, request)
        if request.get("resample") is not None:
            return _serve_resamples(adapter, trace, request)
        if request.get("corrections") is not None:
            return _serve_corrections(adapter, trace, request)
        result = replay_with(adapter, _request_of(trace, request))
    except (ValueError, KeyError, TypeError, ValidationError) as error:
        return 400, json.dumps({"error": f"bad replay request: {error}"}).encode()
    except ReplayError as error:
        return 422, json.dumps({"error": str(error)}).encode()
    return 200, json.dumps(_result_body(adapter, trace, result)).encode()


def _result_body(adapter: ReplayAdapter, trace: StructuredTrace, result: ReplayResult) -> dict[str, Any]:
    return {
        "trace": result.trace.model_dump(mode="json"),
        "final_answer": result.final_answer,
        "prefix_verified": result.prefix_verified,
        "adapter_info": result.adapter_info,
        "deterministic": is_deterministic(adapter, trace),
    }


def _serve_resamples(adapter: ReplayAdapter, trace: StructuredTrace, request: dict[str, Any]) -> tuple[int, bytes]:
    if request.get("protocol") != PROTOCOL_V3:
        raise ValueError(f"a resample request needs {PROTOCOL_V3}")
    source = resampler(adapter)
    if source is None:
        return 422, json.dumps({"error": "this agent's replay adapter cannot resample runs"}).encode()
    samples, options = _sampled(request, "resample")
    try:
        asked = ReplayRequest.resampling(trace, float(options.get("temperature", 0.7)))
        runs = source.resample(asked, samples=samples)
    except ReplayError as error:
        return 422, json.dumps({"error": str(error)}).encode()
    return 200, json.dumps({"runs": [_result_body(adapter, trace, run) for run in runs]}).encode()


def _serve_corrections(adapter: ReplayAdapter, trace: StructuredTrace, request: dict[str, Any]) -> tuple[int, bytes]:
    if request.get("protocol") != PROTOCOL_V3:
        raise ValueError(f"a corrections request needs {PROTOCOL_V3}")
    rules = agent_rules(adapter)
    if not rules:
        return 422, json.dumps({"error": "this agent's replay adapter brings no correction rules"}).encode()
    options = request["corrections"]
    if not isinstance(options, dict):
        raise ValueError("'corrections' must be an object")
    context = str(options.get("context") or "")[:_MAX_CONTEXT_CHARS]
    found = agent_corrections(trace, rules, context=context)[:MAX_CORRECTIONS]
    return 200, json.dumps({"corrections": [c.model_dump(mode="json") for c in found]}).encode()


def _sampled(request: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
    """How many samples a v3 ``key`` request (``resample``, ``propose``) asks for, checked, and its options."""
    options = request[key]
    if not isinstance(options, dict):
        raise ValueError(f"'{key}' must be an object")
    samples = int(options.get("samples", 1))
    if not 1 <= samples <= _MAX_PROPOSALS:
        raise ValueError(f"'{key}.samples' must be from 1 to {_MAX_PROPOSALS}")
    return samples, options


def _serve_proposals(adapter: ReplayAdapter, trace: StructuredTrace, request: dict[str, Any]) -> tuple[int, bytes]:
    if request.get("protocol") != PROTOCOL_V3:
        raise ValueError(f"a proposal request needs {PROTOCOL_V3}")
    source = proposer(adapter)
    if source is None:
        return 422, json.dumps({"error": "this agent's replay adapter cannot propose steps"}).encode()
    samples, options = _sampled(request, "propose")
    try:
        asked = _request_of(trace, request | {"action": None}, float(options.get("temperature", 0.0)))
        proposals = source.propose(asked, samples=samples)
    except ReplayError as error:
        return 422, json.dumps({"error": str(error)}).encode()
    return 200, json.dumps({"proposals": [p.model_dump(mode="json") for p in proposals]}).encode()
