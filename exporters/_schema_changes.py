"""The schema versions both SQL stores share, written once: the columns each version adds, by table, in kinds that
each dialect names its own way (:func:`added_columns`), and the data migrations whose SQL both engines take as it is.
``duckdb_schema`` and ``postgres_schema`` build their migrations from them; version 1's tables and version 4's stay
written out in each dialect."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "COUNT_REQUESTS_V8",
    "MOVE_CONFIDENCE_V5",
    "V2",
    "V3",
    "V5",
    "V6",
    "V7",
    "V8",
    "V9",
    "Added",
    "added_columns",
    "migrations",
]

Added = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
"""(table, ((column, kind), ...)) for each table a version adds columns to; a kind is ``text``, ``integer``,
``double`` or ``boolean``."""

# v2: prompt tokens the endpoint served from its cache, per call (NULL where the endpoint does not say)
V2: Added = (("llm_calls", (("cached_prompt_tokens", "integer"),)),)

# v3: what proved an attribution (the verifying correction's source and kind), and the correction each replay tested
V3: Added = (
    ("attributions", (("verified_by_source", "text"), ("verified_by_kind", "text"))),
    (
        "replays",
        (
            ("correction_source", "text"),
            ("correction_kind", "text"),
            ("replaced_step", "integer"),
            ("original_call", "text"),
            ("replacement_call", "text"),
        ),
    ),
)

# v5: confidence is measured or NULL; what earlier versions stored there was the auditor's self-report
V5: Added = (("attributions", (("auditor_confidence", "double"), ("confidence_samples", "integer"))),)
MOVE_CONFIDENCE_V5 = "UPDATE attributions SET auditor_confidence = confidence, confidence = NULL"


def _arm(name: str) -> tuple[tuple[str, str], ...]:
    """An effect arm's columns: its replays, flips and Wilson interval."""
    return tuple(
        (f"effect_{name}_{part}", kind)
        for part, kind in (("replays", "integer"), ("flips", "integer"), ("low", "double"), ("high", "double"))
    )


# v6: controlled verification: the effect's two arms (flips, replays, Wilson interval), replay fidelity, and each
# replay's arm and whether it changed the step (a control: whether it reproduced the run)
V6: Added = (
    (
        "attributions",
        (
            ("effect_step", "integer"),
            *_arm("intervention"),
            *_arm("control"),
            ("effect_p_value", "double"),
            ("fidelity_controls", "integer"),
            ("fidelity_reproduced", "integer"),
        ),
    ),
    ("replays", (("arm", "text"), ("changed_step", "boolean"), ("reproduced", "boolean"))),
)

# v7: what a verdict without an expected answer rests on, its measured precision (Wilson interval, runs), and the
# consistency check's resamples (how many finished, how many reproduced the answer)
V7: Added = (
    (
        "verdicts",
        (
            ("basis", "text"),
            ("confidence_low", "double"),
            ("confidence_high", "double"),
            ("confidence_runs", "integer"),
            ("resamples", "integer"),
            ("resamples_agreeing", "integer"),
        ),
    ),
)

# v8: model requests counted once each: an attribution's llm_calls is its model requests (a stage call whose reply
# needed the repair retry made two; earlier versions counted the call once), agent_calls the agent's among them
# (its replays' and proposals' requests, where recorded)
V8: Added = (("attributions", (("agent_calls", "integer"),)),)
COUNT_REQUESTS_V8 = """
UPDATE attributions SET llm_calls = (
    SELECT sum(c.attempts) FROM llm_calls c WHERE c.trace_id = attributions.trace_id AND c.method = attributions.method)
WHERE EXISTS (SELECT 1 FROM llm_calls c WHERE c.trace_id = attributions.trace_id AND c.method = attributions.method);
UPDATE attributions SET agent_calls = coalesce((
    SELECT sum(c.attempts) FROM llm_calls c
    WHERE c.trace_id = attributions.trace_id AND c.method = attributions.method AND c.stage = 'agent_replay'), 0)
"""

# v9: the sensitivity arm (the step changed in text, not in effect, from the same prefix), what a verified record
# claims (localized or decisive) and its localization test, why a not-attributable record's flip was not credited,
# and what each replay changed at its step (its effect, the answer turn, a later call moved earlier, ...)
V9: Added = (
    (
        "attributions",
        (
            *_arm("sensitivity"),
            ("claim", "text"),
            ("localization_test", "text"),
            ("obstacle", "text"),
        ),
    ),
    ("replays", (("change", "text"),)),
)


def added_columns(added: Added, types: Mapping[str, str], *, one_statement_per_table: bool) -> str:
    """``added`` as ``ALTER TABLE`` statements (``;``-separated) with ``types`` naming each kind: one statement per
    column, or per table (PostgreSQL adds a table's columns in one)."""
    statements = []
    for table, columns in added:
        adds = [f"ADD COLUMN {column} {types[kind]}" for column, kind in columns]
        if one_statement_per_table:
            statements.append(f"ALTER TABLE {table} {', '.join(adds)}")
        else:
            statements += [f"ALTER TABLE {table} {add}" for add in adds]
    return ";\n".join(statements)


def migrations(v1: str, v4: str, types: Mapping[str, str], *, one_statement_per_table: bool) -> list[str]:
    """Every version's DDL in one dialect: its own ``v1`` and ``v4`` (tables made whole), the added columns named
    by ``types`` (see :func:`added_columns`), and the data migrations."""

    def added(columns: Added) -> str:
        return added_columns(columns, types, one_statement_per_table=one_statement_per_table)

    return [
        v1,
        added(V2),
        added(V3),
        v4,
        added(V5) + ";\n" + MOVE_CONFIDENCE_V5,
        added(V6),
        added(V7),
        added(V8) + ";\n" + COUNT_REQUESTS_V8,
        added(V9),
    ]
