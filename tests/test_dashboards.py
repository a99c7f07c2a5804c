"""The Grafana dashboard, offline: it loads through grafana-foundation-sdk, every panel has a provisioned
datasource, and every metric, span attribute and SQL view it references exists in our code (the views run)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from reflect_otel.exporters.duckdb_store import VIEWS, migrate
from reflect_otel.reading.semconv import ReflectAttributes, ReflectMetrics

DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"


FILES = ("reflect-otel.json", "reflect-otel-postgresql.json")
"""The dashboard over the DuckDB store (through the MotherDuck plugin) and its variant over the PostgreSQL store
(Grafana's built-in PostgreSQL datasource, no plugin); the Prometheus and Tempo panels are the same."""


def _dashboard(name: str = FILES[0]) -> dict:  # type: ignore[type-arg]
    return json.loads((DASHBOARDS / name).read_text())


def _targets(kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [t for f in FILES for p in _dashboard(f)["panels"] for t in p["targets"] if t["datasource"]["type"] == kind]


@pytest.mark.parametrize("name", FILES)
def test_loads_through_the_grafana_foundation_sdk(name: str) -> None:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import prometheus, tempo

    register_default_plugins()
    raw = _dashboard(name)
    model = Dashboard.from_json(raw)
    assert model.title == raw["title"] and model.uid == name.removesuffix(".json")
    assert model.panels is not None and len(model.panels) == len(raw["panels"])
    for panel, source in zip(model.panels, raw["panels"], strict=True):
        assert panel.type_val == source["type"] and panel.targets  # type: ignore[union-attr]
        kind = source["datasource"]["type"]
        if kind == "prometheus":  # the SDK decodes the queries of the datasources it knows into typed models
            assert all(isinstance(t, prometheus.Dataquery) and t.expr for t in panel.targets)  # type: ignore[union-attr]
        elif kind == "tempo":
            assert all(isinstance(t, tempo.TempoQuery) and t.query for t in panel.targets)  # type: ignore[union-attr]
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert [p["title"] for p in again["panels"]] == [p["title"] for p in raw["panels"]]


@pytest.mark.parametrize("name", FILES)
def test_every_panel_has_a_provisioned_datasource(name: str) -> None:
    provisioned = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources.yaml").read_text())["datasources"]
    by_uid = {d["uid"]: d["type"] for d in provisioned}
    assert yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards.yaml").read_text())["providers"]
    for panel in _dashboard(name)["panels"]:
        assert by_uid.get(panel["datasource"]["uid"]) == panel["datasource"]["type"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


def test_prometheus_metrics_exist() -> None:
    exported = {
        value.replace(".", "_") + "_total"
        for name, value in vars(ReflectMetrics).items()
        if not name.startswith("_") and isinstance(value, str)
    }
    used = {m for t in _targets("prometheus") for m in re.findall(r"\breflect_[a-z_]+", t["expr"])}
    assert used and used <= exported, used - exported


def test_traceql_span_attributes_exist() -> None:
    ours = {v for k, v in vars(ReflectAttributes).items() if not k.startswith("_") and isinstance(v, str)}
    used = {a for t in _targets("tempo") for a in re.findall(r"span\.(reflect\.[a-z_.]+)", t["query"])}
    assert used and used <= ours, used - ours


def test_duckdb_panels_query_existing_views_and_run(tmp_path: Path) -> None:
    """Under the provisioned initSql, as Grafana's DuckDB plugin runs it: the panels work and the files do not."""
    provisioned = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources.yaml").read_text())["datasources"]
    (init_sql,) = [d["jsonData"]["initSql"] for d in provisioned if d["type"] == "motherduck-duckdb-datasource"]
    with duckdb.connect(str(tmp_path / "s.duckdb")) as db:
        migrate(db)
        db.execute(init_sql)
        with pytest.raises(duckdb.PermissionException):
            db.execute(f"COPY traces TO '{tmp_path / 'out.csv'}'")
        with pytest.raises(duckdb.Error):
            db.execute("SET enable_external_access = true")
        for target in _targets("motherduck-duckdb-datasource"):
            names = set(re.findall(r"\bFROM\s+([a-z_]+)", target["rawSql"], re.IGNORECASE))
            assert names and names <= set(VIEWS), names - set(VIEWS)
            db.execute(target["rawSql"]).fetchall()  # runs on the real schema


def test_postgresql_panels_query_existing_views_and_run(postgres_server: Any) -> None:
    """The PostgreSQL variant's panels, on a real migrated PostgreSQL store, in a read-only transaction."""
    from reflect_otel.exporters.postgres_store import PG_VIEWS, PostgresStore, connect_read_only_postgres
    from reflect_otel.testing.store_conformance import write_sample

    with PostgresStore(postgres_server.url) as store:
        write_sample(store, twice=False)
    targets = _targets("grafana-postgresql-datasource")
    assert targets and len(targets) == len(_targets("motherduck-duckdb-datasource")) + 1  # and the job queue
    with connect_read_only_postgres(postgres_server.url) as db:
        for target in targets:
            names = set(re.findall(r"\bFROM\s+([a-z_]+)", target["rawSql"], re.IGNORECASE))
            assert names and names <= set(PG_VIEWS), names - set(PG_VIEWS)
            assert target["format"] == "table" and target["rawQuery"]
            assert db.execute(target["rawSql"]).fetchall(), target["rawSql"]  # rows, on the sample
            db.rollback()
