"""deploy/grafana's dashboard: templated on its data source, every query valid PromQL over
series Plumb exports, and every plot of /dashboard/ in it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from observability.dashboard import ROWS
from tests.promql import PLUMB_SERIES, selected_names

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "plumb.json"
RULES = ROOT / "deploy" / "prometheus" / "plumb.rules.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# What Grafana puts in place of its variables before a query leaves it.
VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$task": ".*", "$key_class": ".*"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def plots(dashboard: dict) -> list[dict]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def recorded_series() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def test_it_is_templated_on_a_datasource_variable_not_an_import_placeholder(dashboard):
    assert "__inputs" not in dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, variable in variables.items():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, name
    assert "${DS_" not in DASHBOARD.read_text()


def test_every_panel_and_query_reads_the_chosen_datasource(dashboard):
    assert plots(dashboard)
    for panel in plots(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_every_query_is_promql_over_series_plumb_exports(dashboard):
    known = PLUMB_SERIES | recorded_series()
    queries = [(p["title"], t["expr"]) for p in plots(dashboard) for t in p["targets"]]
    queries += [
        (v["name"], v["definition"]) for v in dashboard["templating"]["list"] if "definition" in v
    ]
    for title, query in queries:
        for variable, value in VARIABLES.items():
            query = query.replace(variable, value)
        assert "$" not in query, (title, query)
        names = list(selected_names(_promql(query)))
        assert names, (title, query)
        assert set(names) <= known, (title, set(names) - known)


def _promql(query: str) -> str:
    # A variable's label_values(metric, label) is Grafana's, not PromQL: its metric is.
    found = re.fullmatch(r"label_values\((.+), \w+\)", query)
    return found.group(1) if found else query


def test_it_has_every_plot_of_the_built_in_dashboard(dashboard):
    titles = {panel["title"] for panel in plots(dashboard)}
    assert {title for _, title, _ in ROWS} <= titles


def test_it_breaks_down_by_task_and_by_host_class(dashboard):
    grouped = {
        label
        for panel in plots(dashboard)
        for target in panel["targets"]
        for label in re.findall(r"by \(([\w, ]+)\)", target["expr"])
    }
    assert any("task" in labels for labels in grouped)
    assert any("key_class" in labels for labels in grouped)


def test_the_panels_the_runbook_names_exist(dashboard):
    titles = {panel["title"] for panel in plots(dashboard)}
    alerts = OPERATIONS.read_text().split("\n## Alerts\n", 1)[1]
    named = []
    for listing in re.findall(r'Grafana ((?:"[^"]+"(?:,\s+|\s+and\s+)?)+)', alerts):
        named += [" ".join(title.split()) for title in re.findall(r'"([^"]+)"', listing)]
    assert len(named) >= 10
    assert set(named) <= titles, set(named) - titles
