"""The DuckDB store's dialect: the tables of versions 1 and 4, the names of its column types and the statistics
views, in DuckDB's SQL; the columns the other versions add, and their data migrations, are written once for both
SQL stores in ``_schema_changes``.

``postgres_schema`` holds the same in PostgreSQL's; the store conformance suite
(:mod:`reflect_otel.testing.store_conformance`) holds them to the same tables, columns and view results. A new
column is a new version in ``_schema_changes``, which both build from.
"""

from __future__ import annotations

from reflect_otel.exporters._schema_changes import migrations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "VIEWS"]

# v1: traces and their steps, verdicts, attributions with their replays and LLM calls
_SCHEMA_V1 = """
CREATE TABLE traces (
    trace_id VARCHAR PRIMARY KEY, session_id VARCHAR, agent VARCHAR, framework VARCHAR, collector VARCHAR,
    question VARCHAR, final_answer VARCHAR, step_count INTEGER, warning_count INTEGER,
    start_time TIMESTAMPTZ, end_time TIMESTAMPTZ, ingested_at TIMESTAMPTZ, metadata JSON, trace_json JSON);
CREATE TABLE steps (
    trace_id VARCHAR, step_index INTEGER, span_id VARCHAR, tool_span_id VARCHAR, kind VARCHAR, agent VARCHAR,
    tool_name VARCHAR, tool_args JSON, tool_result VARCHAR, reasoning VARCHAR, is_final_answer BOOLEAN,
    status VARCHAR, prompt_tokens INTEGER, completion_tokens INTEGER, model_name VARCHAR,
    PRIMARY KEY (trace_id, step_index));
CREATE TABLE verdicts (
    trace_id VARCHAR, verifier VARCHAR, is_correct BOOLEAN, label VARCHAR, score DOUBLE, confidence DOUBLE,
    extracted_answer VARCHAR, reasoning VARCHAR, created_at TIMESTAMPTZ, PRIMARY KEY (trace_id, verifier));
CREATE TABLE attributions (
    trace_id VARCHAR, method VARCHAR, status VARCHAR, mode VARCHAR, step_index INTEGER, span_id VARCHAR,
    error_type VARCHAR, confidence DOUBLE, explanation VARCHAR, root_cause VARCHAR, rollback_point INTEGER,
    corrected_answer VARCHAR, rounds INTEGER, reason VARCHAR, llm_calls INTEGER, tokens INTEGER, seconds DOUBLE,
    created_at TIMESTAMPTZ, record_json JSON, PRIMARY KEY (trace_id, method));
CREATE TABLE replays (
    trace_id VARCHAR, method VARCHAR, seq INTEGER, round INTEGER, rollback_point INTEGER, localized_step INTEGER,
    gate_retry INTEGER, sample INTEGER, faithful BOOLEAN, violation_type VARCHAR, flipped BOOLEAN,
    final_answer VARCHAR, error VARCHAR, PRIMARY KEY (trace_id, method, seq));
CREATE TABLE llm_calls (
    trace_id VARCHAR, method VARCHAR, seq INTEGER, stage VARCHAR, model VARCHAR, prompt_tokens INTEGER,
    completion_tokens INTEGER, seconds DOUBLE, attempts INTEGER, ok BOOLEAN, PRIMARY KEY (trace_id, method, seq));
"""


_TYPES = {"text": "VARCHAR", "integer": "INTEGER", "double": "DOUBLE", "boolean": "BOOLEAN"}
"""How this dialect names each column kind of :mod:`~reflect_otel.exporters._schema_changes`."""


# v4: the attribution work list (collect --attribute): runs stored and waiting, running, done or failed
_SCHEMA_V4 = """
CREATE TABLE attribution_jobs (
    trace_id VARCHAR PRIMARY KEY, status VARCHAR, attempts INTEGER, expected_answer VARCHAR, reason VARCHAR,
    updated_at TIMESTAMPTZ)
"""

MIGRATIONS: list[str] = migrations(_SCHEMA_V1, _SCHEMA_V4, _TYPES, one_statement_per_table=False)
"""Each schema version's DDL (``postgres_schema.MIGRATIONS`` holds the same versions in PostgreSQL's SQL)."""
SCHEMA_VERSION = len(MIGRATIONS)


VIEWS: dict[str, str] = {
    "failure_stats": """
        SELECT CAST(date_trunc('day', coalesce(t.start_time, t.ingested_at)) AS DATE) AS day, t.agent,
               count(*) AS traces,
               count(*) FILTER (WHERE v.is_correct IS NOT NULL) AS judged,
               count(*) FILTER (WHERE v.is_correct = false) AS failed,
               count(*) FILTER (WHERE v.is_correct = false OR v.label = 'HIGH_ERROR_SIGNAL') AS flagged,
               round(count(*) FILTER (WHERE v.is_correct = false)
                     / nullif(count(*) FILTER (WHERE v.is_correct IS NOT NULL), 0), 4) AS failure_rate,
               round(count(*) FILTER (WHERE v.is_correct = false OR v.label = 'HIGH_ERROR_SIGNAL') / count(*), 4)
                   AS flag_rate
        FROM traces t LEFT JOIN (SELECT trace_id, bool_and(is_correct) AS is_correct, max(label) AS label
                                 FROM verdicts GROUP BY trace_id) v USING (trace_id)
        GROUP BY ALL ORDER BY day DESC, agent""",
    "error_types": """
        SELECT coalesce(error_type, CASE WHEN step_index IS NULL THEN 'no_step' ELSE 'unclassified' END) AS error_type,
               count(*) AS attributions,
               round(count(*) / sum(count(*)) OVER (), 4) AS share
        FROM attributions WHERE status <> 'skipped' GROUP BY ALL ORDER BY attributions DESC""",
    "decisive_step_position": """
        SELECT a.trace_id, a.method, a.step_index, t.step_count,
               round(a.step_index / nullif(t.step_count, 0), 4) AS relative_position
        FROM attributions a JOIN traces t USING (trace_id) WHERE a.step_index IS NOT NULL""",
    "verified_share": """
        SELECT method, count(*) AS attributions,
               count(*) FILTER (WHERE status = 'verified') AS verified,
               count(*) FILTER (WHERE status = 'not_attributable') AS not_attributable,
               count(*) FILTER (WHERE status = 'unverified') AS unverified,
               round(count(*) FILTER (WHERE status = 'verified') / nullif(count(*) FILTER (WHERE status <> 'skipped'), 0), 4)
                   AS verified_share
        FROM attributions GROUP BY ALL ORDER BY method""",
    "flip_rate_by_offset": """
        SELECT localized_step - (rollback_point + 1) AS rollback_offset, coalesce(arm, 'intervention') AS arm,
               count(*) AS replays, count(*) FILTER (WHERE flipped) AS flips,
               round(count(*) FILTER (WHERE flipped) / count(*), 4) AS flip_rate
        FROM replays WHERE error IS NULL AND localized_step IS NOT NULL GROUP BY ALL ORDER BY rollback_offset, arm""",
    "replay_fidelity": """
        SELECT json_extract_string(t.trace_json, '$.source.service') AS service, t.agent,
               count(*) AS controls, count(*) FILTER (WHERE r.reproduced) AS reproduced,
               count(*) FILTER (WHERE r.flipped) AS flipped,
               round(count(*) FILTER (WHERE r.reproduced) / count(*), 4) AS fidelity
        FROM replays r JOIN traces t USING (trace_id)
        WHERE r.arm = 'control' AND r.error IS NULL GROUP BY ALL ORDER BY service, agent""",
    "replay_sensitivity": """
        SELECT json_extract_string(t.trace_json, '$.source.service') AS service, t.agent,
               count(*) AS points, count(*) FILTER (WHERE r.flipped) AS sensitive,
               round(count(*) FILTER (WHERE r.flipped) / count(*), 4) AS sensitive_share
        FROM replays r JOIN traces t USING (trace_id)
        WHERE r.arm = 'sensitivity' AND r.error IS NULL AND r.sample = 0 GROUP BY ALL ORDER BY service, agent""",
    "verified_claims": """
        SELECT method, count(*) FILTER (WHERE status = 'verified') AS verified,
               count(*) FILTER (WHERE claim = 'localized') AS localized,
               count(*) FILTER (WHERE status = 'verified' AND claim = 'decisive') AS decisive_only,
               count(*) FILTER (WHERE obstacle = 'sensitive') AS sensitive,
               count(*) FILTER (WHERE obstacle = 'control_flipped') AS control_flipped,
               count(*) FILTER (WHERE obstacle = 'no_change_of_effect') AS no_change_of_effect
        FROM attributions GROUP BY ALL ORDER BY method""",
    "cost_per_trace": """
        SELECT a.trace_id, a.method, a.llm_calls, a.tokens, c.cached_prompt_tokens, a.seconds
        FROM attributions a LEFT JOIN (SELECT trace_id, method, sum(cached_prompt_tokens) AS cached_prompt_tokens
                                       FROM llm_calls GROUP BY ALL) c USING (trace_id, method)
        ORDER BY a.tokens DESC""",
    "cost_per_stage": """
        SELECT stage, count(*) AS calls, sum(attempts) AS requests, sum(prompt_tokens) AS prompt_tokens,
               sum(cached_prompt_tokens) AS cached_prompt_tokens,
               round(sum(cached_prompt_tokens) / nullif(sum(prompt_tokens) FILTER (WHERE cached_prompt_tokens IS NOT NULL), 0), 4)
                   AS cached_share,
               sum(completion_tokens) AS completion_tokens, round(sum(seconds), 3) AS seconds,
               round(avg(prompt_tokens + completion_tokens), 1) AS tokens_per_call
        FROM llm_calls GROUP BY ALL ORDER BY calls DESC""",
    "attribution_queue": """
        SELECT status, count(*) AS runs, sum(attempts) AS attempts
        FROM attribution_jobs GROUP BY ALL ORDER BY status""",
    "verified_by_source": """
        SELECT method, verified_by_source AS source, verified_by_kind AS kind, count(*) AS verified
        FROM attributions WHERE status = 'verified' GROUP BY ALL ORDER BY method, verified DESC""",
    # what failed, across runs: the localized step's role (its kind), tool and argument names, the error type and
    # the evidence rule that fired at that step, per method and agent; the example is a verified run where one is
    "failure_patterns": """
        SELECT method, agent, step_kind, tool_name, argument_shape, error_type, evidence_rule,
               count(*) AS attributions, count(*) FILTER (WHERE status = 'verified') AS verified,
               round(count(*) FILTER (WHERE status = 'verified') / count(*), 4) AS verified_share,
               min(seen) AS first_seen, max(seen) AS last_seen,
               (array_agg(trace_id ORDER BY status = 'verified' DESC, seen DESC, trace_id))[1] AS example_trace
        FROM (SELECT a.method, t.agent, a.trace_id, a.status, s.kind AS step_kind, s.tool_name,
                     array_to_string(list_sort(json_keys(s.tool_args)), ',') AS argument_shape,
                     coalesce(a.error_type, 'unclassified') AS error_type,
                     (SELECT min(substr(c ->> '$.source', 10))
                      FROM (SELECT unnest(CAST(json_extract(a.record_json, '$.corrections') AS JSON[])) AS c)
                      WHERE starts_with(c ->> '$.source', 'evidence:')
                        AND CAST(c ->> '$.step_index' AS INTEGER) = a.step_index) AS evidence_rule,
                     coalesce(t.start_time, t.ingested_at) AS seen
              FROM attributions a JOIN steps s USING (trace_id, step_index) JOIN traces t USING (trace_id)
              WHERE a.status <> 'skipped') p
        GROUP BY ALL
        ORDER BY method, attributions DESC, verified DESC, agent, step_kind, tool_name, argument_shape, error_type,
                 evidence_rule""",
}
