"""The Grafana dashboard, offline: it loads through grafana-foundation-sdk, every panel has a provisioned
datasource, and every metric, span attribute and SQL view it references exists in our code (the views run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from reflect_otel.exporters.duckdb_store import VIEWS, migrate
from reflect_otel.semconv import ReflectAttributes, ReflectMetrics

DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"


def _dashboard() -> dict:  # type: ignore[type-arg]
    return json.loads((DASHBOARDS / "reflect-otel.json").read_text())


def _targets(kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [t for p in _dashboard()["panels"] for t in p["targets"] if t["datasource"]["type"] == kind]


def test_loads_through_the_grafana_foundation_sdk() -> None:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import prometheus, tempo

    register_default_plugins()
    raw = _dashboard()
    model = Dashboard.from_json(raw)
    assert model.title == raw["title"] and model.uid == "reflect-otel"
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


def test_every_panel_has_a_provisioned_datasource() -> None:
    provisioned = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources.yaml").read_text())["datasources"]
    by_uid = {d["uid"]: d["type"] for d in provisioned}
    assert yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards.yaml").read_text())["providers"]
    for panel in _dashboard()["panels"]:
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
