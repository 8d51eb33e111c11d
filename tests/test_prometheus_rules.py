"""deploy/prometheus's rules: valid for promtool, each alert's scenarios pass `promtool test
rules`, each alert names real Plumb series, follows the mixin conventions and has its
runbook section in docs/operations.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from config.celery_app import app as celery_app
from observability import metrics
from tests.promql import PLUMB_SERIES, github_anchor, label_matchers, selected_names

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "plumb.rules.yml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.test.yml"))
OPERATIONS = ROOT / "docs" / "operations.md"
RUNBOOK_URL = "https://github.com/plumb-audits/plumb/blob/main/docs/operations.md#"
SEVERITIES = {"critical", "warning", "info"}


def rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def alerts() -> list[dict]:
    return [rule for rule in rules() if "alert" in rule]


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing on CI: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (Debian: apt-get install prometheus; .ci/run does)")
    return found


def run(promtool: str, *args: str) -> None:
    done = subprocess.run(
        [promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_accepts_the_rules(promtool):
    run(promtool, "check", "rules", str(RULES))


def test_promtool_accepts_the_compose_prometheus_config_and_the_rules_it_loads(promtool):
    run(promtool, "check", "config", str(PROMETHEUS / "prometheus.yml"))


@pytest.mark.parametrize("scenarios", RULE_TESTS, ids=lambda path: path.name)
def test_each_alert_fires_in_its_scenarios_and_stays_quiet_in_the_others(promtool, scenarios):
    # One file per time scale: 90 days hourly, days a minute apart, hours 15 s apart.
    run(promtool, "test", "rules", str(scenarios))


def test_every_alert_has_a_scenario_that_fires_it():
    fired = set()
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                if case.get("exp_alerts"):
                    fired.add(case["alertname"])
    assert {alert["alert"] for alert in alerts()} <= fired


def test_every_alert_follows_the_mixin_conventions():
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names))
    for alert in alerts():
        assert re.fullmatch(r"Plumb[A-Z]\w+", alert["alert"]), alert["alert"]
        assert alert["labels"]["severity"] in SEVERITIES, alert["alert"]
        annotations = alert["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), alert["alert"]


def test_the_rules_read_only_series_plumb_exports():
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    for rule in rules():
        for name in selected_names(rule["expr"]):
            assert name in PLUMB_SERIES | recorded | {"up"}, (rule.get("alert"), name)


def test_the_rules_match_label_values_plumb_records():
    # A misspelt task or reason would select nothing, and the alert would never fire.
    celery_app.loader.import_default_modules()
    known = {
        "task": set(celery_app.tasks),
        "reason": set(metrics.RETRY_REASONS),
        "state": set(metrics.BREAKER_STATES),
        "to_state": set(metrics.BREAKER_STATES),
        "key_class": set(metrics.KEY_CLASSES),
        "queue": set(settings.QUEUE_VISIBILITY_TIMEOUTS),
        "job": {"plumb"},
    }
    for rule in rules():
        for label, operator, value in label_matchers(rule["expr"]):
            if operator == "=":
                assert value in known[label], (rule.get("alert"), label, value)
            else:
                assert any(re.fullmatch(value, v) for v in known[label]), (rule.get("alert"), value)


def test_every_alert_links_to_its_own_runbook_section():
    headings = re.findall(r"^#{2,4} (.+)$", OPERATIONS.read_text(), flags=re.MULTILINE)
    anchors = {github_anchor(heading) for heading in headings}
    for alert in alerts():
        url = alert["annotations"]["runbook_url"]
        assert url == RUNBOOK_URL + alert["alert"].lower(), url
        assert url.removeprefix(RUNBOOK_URL) in anchors, f"no section {alert['alert']}"
