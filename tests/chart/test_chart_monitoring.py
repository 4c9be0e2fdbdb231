"""The chart's alert rules and Grafana dashboard, checked with Prometheus's own promtool.

The rules are tested as the chart renders them: `promtool check rules` on the rendered groups and
`promtool test rules` (tests/chart/prometheus/alerts.test.yaml) firing each alert on the series it
names, and not firing below its threshold or for a finished job. Every query of the dashboard must
parse as PromQL (promtool checks it as a recording rule) and name only series the operator or the
trainer exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import prometheus_client
import rtj_operator.metrics  # noqa: F401 - registers the operator's collectors in the default registry
import yaml
from chart_support import CHART, NAMESPACE, objects_of, one, render
from rtj_trainer.runtime import metrics as trainer_metrics

PROMTOOL = Path(sys.prefix) / "bin" / "promtool"
ALERT_TESTS = Path(__file__).parent / "prometheus" / "alerts.test.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
MONITORING = {"alerts": {"prometheusRule": {"enabled": True}, "alertLabels": {"team": "ml-platform"}}}
# Grafana's variables, as a query would see them once Grafana filled them in.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$namespace": ".*", "$job": ".*"}
# PromQL's words that look like series names: functions, aggregations, keywords.
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring", "unless", "and", "or",
    "rate", "increase", "time", "absent", "histogram_quantile", "le", "bool", "offset",
}  # fmt: skip


def _promtool(*args: str, cwd: Path) -> str:
    assert PROMTOOL.exists(), f"{PROMTOOL} is missing: `make setup` installs it"
    result = subprocess.run([str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _exported_series() -> set[str]:
    """Every series name a scrape of the operator or a trainer can return."""
    names = {"up"}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    for family in prometheus_client.REGISTRY.collect():
        if family.name.startswith("rtj_"):
            base = family.name.removesuffix("_total") if family.type == "counter" else family.name
            names |= {base + suffix for suffix in suffixes.get(family.type, ("",))}
    names |= {name for name, _, _ in trainer_metrics.SERIES}
    return names


def _series_named(expr: str) -> set[str]:
    """The series names a PromQL expression selects: its identifiers outside strings, label
    matchers, range selectors, groupings and numbers, less PromQL's own words."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    for part in (r"\{[^}]*\}", r"\[[^\]]*\]", r"\b(by|without|on|ignoring)\s*\([^)]*\)"):
        bare = re.sub(part, "", bare)
    identifiers = set(re.findall(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", bare))
    return identifiers - PROMQL_WORDS


def _rendered_rules() -> dict[str, Any]:
    rule = one(render(MONITORING), "PrometheusRule")
    assert rule["metadata"]["namespace"] == NAMESPACE
    return {"groups": rule["spec"]["groups"]}


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            match = re.fullmatch(r"label_values\((.*), \w+\)", query["query"])
            assert match, query
            queries.append(match.group(1))
    return queries


def _filled_in(query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    assert "$" not in query, f"a Grafana variable the test does not know: {query}"
    return query


def test_nothing_of_it_is_rendered_by_default() -> None:
    objects = render(None)
    assert objects_of(objects, "PrometheusRule") == []
    assert not [c for c in objects_of(objects, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]


def test_the_rendered_alert_rules_pass_promtool_and_fire_as_their_unit_tests_say(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rendered_rules()))
    shutil.copy(ALERT_TESTS, tmp_path / "alerts.test.yaml")
    assert "SUCCESS: 8 rules found" in _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert "SUCCESS" in _promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)


def test_every_alert_is_unit_tested_and_names_series_that_exist() -> None:
    rules = [rule for group in _rendered_rules()["groups"] for rule in group["rules"]]
    tested = {case["alertname"] for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for case in test["alert_rule_test"]}  # fmt: skip
    assert {rule["alert"] for rule in rules} == tested
    exported = _exported_series()
    for rule in rules:
        assert _series_named(rule["expr"]) <= exported, (
            rule["alert"],
            _series_named(rule["expr"]) - exported,
        )
        assert rule["labels"]["team"] == "ml-platform" and rule["labels"]["severity"] in {
            "info",
            "warning",
            "critical",
        }


def test_thresholds_come_from_the_values() -> None:
    values = {"alerts": {"prometheusRule": {"enabled": True}, "stalledFor": "15m", "failureBudgetRatio": 0.5}}
    rules = {
        rule["alert"]: rule
        for group in one(render(values), "PrometheusRule")["spec"]["groups"]
        for rule in group["rules"]
    }
    assert rules["RTJJobStalled"]["for"] == "15m"
    assert ">= 0.5 and" in rules["RTJJobFailureBudgetNearlySpent"]["expr"]


def test_every_dashboard_query_is_promql_naming_series_that_exist(tmp_path: Path) -> None:
    queries = _dashboard_queries()
    exported = _exported_series()
    for query in queries:
        named = _series_named(_filled_in(query))
        assert named and named <= exported, (query, named - exported)
    rules = [{"record": f"dashboard:query_{i}", "expr": _filled_in(q)} for i, q in enumerate(queries)]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    assert f"SUCCESS: {len(rules)} rules found" in _promtool("check", "rules", "queries.yaml", cwd=tmp_path)


def test_the_dashboard_is_shipped_in_a_configmap_for_grafanas_sidecar() -> None:
    (config_map,) = [
        c
        for c in objects_of(render({"dashboard": {"enabled": True}}), "ConfigMap")
        if c["metadata"]["name"].endswith("-dashboard")
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = config_map["data"].values()
    assert json.loads(text) == json.loads(DASHBOARD.read_text())


def test_the_service_monitor_keeps_the_jobs_namespace_label() -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True}}}
    (endpoint,) = one(render(values), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
