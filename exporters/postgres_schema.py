"""The PostgreSQL store's dialect: the tables of versions 1 and 4, the names of its column types and the
statistics views, in PostgreSQL's SQL; the columns the other versions add, and their data migrations, are written
once for both SQL stores in ``_schema_changes``.

The same versions, tables, columns and views as ``duckdb_schema``, written for this server: ``TEXT``, ``DOUBLE
PRECISION`` and ``JSONB`` columns, one ``ALTER TABLE`` per table and version, ``GROUP BY`` by position, and rates
rounded as ``numeric`` (PostgreSQL has no ``round(double precision, int)``) then returned as ``float8``. The store
conformance suite (:mod:`reflect_otel.testing.store_conformance`) holds both to the same tables, columns and view
results on the same records.

Stores made before these were written out took DuckDB's DDL with its types replaced (``VARCHAR`` where this writes
``TEXT``, the same type to PostgreSQL but for its name); their migrations are not run again.
"""

from __future__ import annotations

from reflect_otel.exporters._schema_changes import migrations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "VIEWS"]

# v1: traces and their steps, verdicts, attributions with their replays and LLM calls
_SCHEMA_V1 = """
CREATE TABLE traces (
    trace_id TEXT PRIMARY KEY, session_id TEXT, agent TEXT, framework TEXT, collector TEXT, question TEXT,
    final_answer TEXT, step_count INTEGER, warning_count INTEGER, start_time TIMESTAMPTZ, end_time TIMESTAMPTZ,
    ingested_at TIMESTAMPTZ, metadata JSONB, trace_json JSONB);
CREATE TABLE steps (
    trace_id TEXT, step_index INTEGER, span_id TEXT, tool_span_id TEXT, kind TEXT, agent TEXT, tool_name TEXT,
    tool_args JSONB, tool_result TEXT, reasoning TEXT, is_final_answer BOOLEAN, status TEXT, prompt_tokens INTEGER,
    completion_tokens INTEGER, model_name TEXT, PRIMARY KEY (trace_id, step_index));
CREATE TABLE verdicts (
    trace_id TEXT, verifier TEXT, is_correct BOOLEAN, label TEXT, score DOUBLE PRECISION,
    confidence DOUBLE PRECISION, extracted_answer TEXT, reasoning TEXT, created_at TIMESTAMPTZ,
    PRIMARY KEY (trace_id, verifier));
CREATE TABLE attributions (
    trace_id TEXT, method TEXT, status TEXT, mode TEXT, step_index INTEGER, span_id TEXT, error_type TEXT,
    confidence DOUBLE PRECISION, explanation TEXT, root_cause TEXT, rollback_point INTEGER, corrected_answer TEXT,
    rounds INTEGER, reason TEXT, llm_calls INTEGER, tokens INTEGER, seconds DOUBLE PRECISION, created_at TIMESTAMPTZ,
    record_json JSONB, PRIMARY KEY (trace_id, method));
CREATE TABLE replays (
    trace_id TEXT, method TEXT, seq INTEGER, round INTEGER, rollback_point INTEGER, localized_step INTEGER,
    gate_retry INTEGER, sample INTEGER, faithful BOOLEAN, violation_type TEXT, flipped BOOLEAN, final_answer TEXT,
    error TEXT, PRIMARY KEY (trace_id, method, seq));
CREATE TABLE llm_calls (
    trace_id TEXT, method TEXT, seq INTEGER, stage TEXT, model TEXT, prompt_tokens INTEGER, completion_tokens INTEGER,
    seconds DOUBLE PRECISION, attempts INTEGER, ok BOOLEAN, PRIMARY KEY (trace_id, method, seq));
"""

_TYPES = {"text": "TEXT", "integer": "INTEGER", "double": "DOUBLE PRECISION", "boolean": "BOOLEAN"}
"""How this dialect names each column kind of :mod:`~reflect_otel.exporters._schema_changes`."""


# v4: the attribution work list (collect --attribute): runs stored and waiting, running, done or failed
_SCHEMA_V4 = """
CREATE TABLE attribution_jobs (
    trace_id TEXT PRIMARY KEY, status TEXT, attempts INTEGER, expected_answer TEXT, reason TEXT,
    updated_at TIMESTAMPTZ)
"""

MIGRATIONS: list[str] = migrations(_SCHEMA_V1, _SCHEMA_V4, _TYPES, one_statement_per_table=True)
"""Each schema version's DDL: the versions of ``duckdb_schema.MIGRATIONS``, in PostgreSQL's SQL."""
SCHEMA_VERSION = len(MIGRATIONS)


def _rate(numerator: str, denominator: str, digits: int = 4) -> str:
    return f"round(({numerator})::numeric / nullif({denominator}, 0), {digits})::float8"


VIEWS: dict[str, str] = {
    "failure_stats": f"""
        SELECT CAST(date_trunc('day', coalesce(t.start_time, t.ingested_at)) AS DATE) AS day, t.agent,
               count(*) AS traces,
               count(*) FILTER (WHERE v.is_correct IS NOT NULL) AS judged,
               count(*) FILTER (WHERE v.is_correct = false) AS failed,
               count(*) FILTER (WHERE v.is_correct = false OR v.label = 'HIGH_ERROR_SIGNAL') AS flagged,
               {_rate("count(*) FILTER (WHERE v.is_correct = false)", "count(*) FILTER (WHERE v.is_correct IS NOT NULL)")}
                   AS failure_rate,
               {_rate("count(*) FILTER (WHERE v.is_correct = false OR v.label = 'HIGH_ERROR_SIGNAL')", "count(*)")}
                   AS flag_rate
        FROM traces t LEFT JOIN (SELECT trace_id, bool_and(is_correct) AS is_correct, max(label) AS label
                                 FROM verdicts GROUP BY trace_id) v USING (trace_id)
        GROUP BY 1, 2 ORDER BY day DESC, agent""",
    "error_types": f"""
        SELECT coalesce(error_type, CASE WHEN step_index IS NULL THEN 'no_step' ELSE 'unclassified' END) AS error_type,
               count(*) AS attributions,
               {_rate("count(*)", "sum(count(*)) OVER ()")} AS share
        FROM attributions WHERE status <> 'skipped' GROUP BY 1 ORDER BY attributions DESC""",
    "decisive_step_position": f"""
        SELECT a.trace_id, a.method, a.step_index, t.step_count,
               {_rate("a.step_index", "t.step_count")} AS relative_position
        FROM attributions a JOIN traces t USING (trace_id) WHERE a.step_index IS NOT NULL""",
    "verified_share": f"""
        SELECT method, count(*) AS attributions,
               count(*) FILTER (WHERE status = 'verified') AS verified,
               count(*) FILTER (WHERE status = 'not_attributable') AS not_attributable,
               count(*) FILTER (WHERE status = 'unverified') AS unverified,
               {_rate("count(*) FILTER (WHERE status = 'verified')", "count(*) FILTER (WHERE status <> 'skipped')")}
                   AS verified_share
        FROM attributions GROUP BY 1 ORDER BY method""",
    "flip_rate_by_offset": f"""
        SELECT localized_step - (rollback_point + 1) AS rollback_offset, coalesce(arm, 'intervention') AS arm,
               count(*) AS replays, count(*) FILTER (WHERE flipped) AS flips,
               {_rate("count(*) FILTER (WHERE flipped)", "count(*)")} AS flip_rate
        FROM replays WHERE error IS NULL AND localized_step IS NOT NULL GROUP BY 1, 2 ORDER BY rollback_offset, arm""",
    "replay_fidelity": f"""
        SELECT t.trace_json -> 'source' ->> 'service' AS service, t.agent,
               count(*) AS controls, count(*) FILTER (WHERE r.reproduced) AS reproduced,
               count(*) FILTER (WHERE r.flipped) AS flipped,
               {_rate("count(*) FILTER (WHERE r.reproduced)", "count(*)")} AS fidelity
        FROM replays r JOIN traces t USING (trace_id)
        WHERE r.arm = 'control' AND r.error IS NULL GROUP BY 1, 2 ORDER BY service, agent""",
    "replay_sensitivity": f"""
        SELECT t.trace_json -> 'source' ->> 'service' AS service, t.agent,
               count(*) AS points, count(*) FILTER (WHERE r.flipped) AS sensitive,
               {_rate("count(*) FILTER (WHERE r.flipped)", "count(*)")} AS sensitive_share
        FROM replays r JOIN traces t USING (trace_id)
        WHERE r.arm = 'sensitivity' AND r.error IS NULL AND r.sample = 0 GROUP BY 1, 2 ORDER BY service, agent""",
    "verified_claims": """
        SELECT method, count(*) FILTER (WHERE status = 'verified') AS verified,
               count(*) FILTER (WHERE claim = 'localized') AS localized,
               count(*) FILTER (WHERE status = 'verified' AND claim = 'decisive') AS decisive_only,
               count(*) FILTER (WHERE obstacle = 'sensitive') AS sensitive,
               count(*) FILTER (WHERE obstacle = 'control_flipped') AS control_flipped,
               count(*) FILTER (WHERE obstacle = 'no_change_of_effect') AS no_change_of_effect
        FROM attributions GROUP BY 1 ORDER BY method""",
    "cost_per_trace": """
        SELECT a.trace_id, a.method, a.llm_calls, a.tokens, c.cached_prompt_tokens, a.seconds
        FROM attributions a LEFT JOIN (SELECT trace_id, method, sum(cached_prompt_tokens) AS cached_prompt_tokens
                                       FROM llm_calls GROUP BY 1, 2) c USING (trace_id, method)
        ORDER BY a.tokens DESC""",
    "cost_per_stage": f"""
        SELECT stage, count(*) AS calls, sum(attempts) AS requests, sum(prompt_tokens) AS prompt_tokens,
               sum(cached_prompt_tokens) AS cached_prompt_tokens,
               {_rate("sum(cached_prompt_tokens)", "sum(prompt_tokens) FILTER (WHERE cached_prompt_tokens IS NOT NULL)")}
                   AS cached_share,
               sum(completion_tokens) AS completion_tokens, round(sum(seconds)::numeric, 3)::float8 AS seconds,
               round(avg(prompt_tokens + completion_tokens)::numeric, 1)::float8 AS tokens_per_call
        FROM llm_calls GROUP BY 1 ORDER BY calls DESC""",
    "attribution_queue": """
        SELECT status, count(*) AS runs, sum(attempts) AS attempts
        FROM attribution_jobs GROUP BY 1 ORDER BY status""",
    "verified_by_source": """
        SELECT method, verified_by_source AS source, verified_by_kind AS kind, count(*) AS verified
        FROM attributions WHERE status = 'verified' GROUP BY 1, 2, 3 ORDER BY method, verified DESC""",
    "failure_patterns": f"""
        SELECT method, agent, step_kind, tool_name, argument_shape, error_type, evidence_rule,
               count(*) AS attributions, count(*) FILTER (WHERE status = 'verified') AS verified,
               {_rate("count(*) FILTER (WHERE status = 'verified')", "count(*)")} AS verified_share,
               min(seen) AS first_seen, max(seen) AS last_seen,
               (array_agg(trace_id ORDER BY status = 'verified' DESC, seen DESC, trace_id))[1] AS example_trace
        FROM (SELECT a.method, t.agent, a.trace_id, a.status, s.kind AS step_kind, s.tool_name,
                     coalesce((SELECT string_agg(k, ',' ORDER BY k COLLATE "C")
                               FROM jsonb_object_keys(CASE WHEN jsonb_typeof(s.tool_args) = 'object'
                                                           THEN s.tool_args ELSE '{{}}'::jsonb END) k), '')
                         AS argument_shape,
                     coalesce(a.error_type, 'unclassified') AS error_type,
                     (SELECT min(substr(c ->> 'source', 10))
                      FROM jsonb_array_elements(CASE WHEN jsonb_typeof(a.record_json -> 'corrections') = 'array'
                                                     THEN a.record_json -> 'corrections' ELSE '[]'::jsonb END) c
                      WHERE starts_with(c ->> 'source', 'evidence:')
                        AND (c ->> 'step_index')::int = a.step_index) AS evidence_rule,
                     coalesce(t.start_time, t.ingested_at) AS seen
              FROM attributions a JOIN steps s USING (trace_id, step_index) JOIN traces t USING (trace_id)
              WHERE a.status <> 'skipped') p
        GROUP BY 1, 2, 3, 4, 5, 6, 7
        ORDER BY method, attributions DESC, verified DESC, agent, step_kind, tool_name, argument_shape, error_type,
                 evidence_rule""",
}
"""The statistics views: ``duckdb_schema.VIEWS``' names, columns and rows, in PostgreSQL's SQL."""
