"""The shipped Prometheus alert rules: valid for promtool, unit-tested per alert (firing and quiet),
and written on the metric names, labels and label values the process really exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from qinglong.contracts.execution import RunState
from qinglong.contracts.observe import METRICS, WORKER_STATES, MetricType
from qinglong.host.http.metrics import ATTEMPT_OUTCOMES, ROUND_RESULTS

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "qinglong.rules.yml"
UNIT_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))

#: The alerts the rules must define (one per condition an operator is paged for).
EXPECTED_ALERTS = {
    "QinglongBacklogGrowing",
    "QinglongAdmissionLagHigh",
    "QinglongNoSuccessfulRound",
    "QinglongAttemptsLost",
    "QinglongNoFreeWorkerSlots",
    "QinglongRunsWithoutWorker",
    "QinglongTasksNotSucceeding",
    "QinglongAttemptsFailing",
}

#: Gauges read from the store: every replica of a cluster reports the same value.
STORE_DERIVED = {
    "qinglong_schedules_due", "qinglong_schedule_oldest_due_seconds", "qinglong_schedules_total",
    "qinglong_runs", "qinglong_running", "qinglong_workers", "qinglong_worker_free_slots",
    "qinglong_runs_without_worker", "qinglong_status_verdict", "qinglong_tasks_failing",
    "qinglong_tasks_not_succeeding",
}

#: Label values the process exports, by label name (the HTTP surface pre-creates every round
#: result and attempt outcome, so those series exist from the first scrape).
LABEL_VALUES = {
    "state": {s.value for s in RunState},
    "qinglong_workers.state": set(WORKER_STATES),
    "outcome": set(ATTEMPT_OUTCOMES),
    "result": set(ROUND_RESULTS),
}


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, ("promtool is not installed: the alert rules cannot be checked "
                  "(.ci/install-system-deps installs Debian's prometheus package, which ships it)")
    return path


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_rules_file_passes_promtool_check():
    """A rules file Prometheus refuses to load (bad PromQL, bad template) would leave the operator
    with no alerts at all, silently, after a config reload."""
    result = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_say():
    """An alert that never fires (a wrong label, a window too short for the scrape) or fires on
    a healthy system would page nobody or everybody; promtool replays series through the rules."""
    assert UNIT_TESTS, "no promtool unit tests in deploy/prometheus/tests"
    result = subprocess.run([_promtool(), "test", "rules", *map(str, UNIT_TESTS)], capture_output=True,
                            text=True, timeout=120, cwd=PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS), result.stdout


def test_each_alert_has_a_firing_and_a_quiet_unit_test():
    """An alert tested only for firing may fire all the time; tested only for silence it may never
    fire: each one needs both cases."""
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    assert alerts == EXPECTED_ALERTS
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../qinglong.rules.yml"], path
        for case in doc["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing >= alerts, f"no firing case for {sorted(alerts - firing)}"
    assert quiet >= alerts, f"no quiet case for {sorted(alerts - quiet)}"


def _series_names(name: str, spec_type: MetricType) -> set[str]:
    if spec_type is MetricType.HISTOGRAM:
        return {name + "_bucket", name + "_sum", name + "_count"}
    return {name}


def test_rules_use_only_exported_metric_names_labels_and_values():
    """A rule on a misspelled metric, label or label value matches nothing and never fires:
    the operator would believe a condition is watched that is not."""
    specs = {}
    for spec in METRICS:
        for series in _series_names(spec.name, spec.type):
            specs[series] = spec
    selector = re.compile(r"\b(qinglong_[a-z_]+)(?:\{([^}]*)\})?")
    matcher = re.compile(r'([a-z_]+)\s*(=~|!=|!~|=)\s*"([^"]*)"')
    seen = set()
    for rule in _rules():
        for name, labels in selector.findall(rule["expr"]):
            assert name in specs, f"{rule['alert']}: {name} is not a metric of qinglong.contracts.observe.METRICS"
            seen.add(specs[name].name)
            for label, _, value in matcher.findall(labels):
                assert label in specs[name].labels, f"{rule['alert']}: {name} has no label {label!r}"
                values = LABEL_VALUES.get(f"{specs[name].name}.{label}", LABEL_VALUES.get(label))
                if values is not None:  # a regex matcher: each alternative must be exported
                    for one in value.split("|"):
                        assert one in values, f"{rule['alert']}: {label}={one!r} is never exported"
    assert {"qinglong_schedules_due", "qinglong_admission_lag_seconds", "qinglong_rounds_total",
            "qinglong_attempts_finished_total", "qinglong_worker_free_slots", "qinglong_runs"} <= seen


def test_store_derived_gauges_are_aggregated_with_max_never_summed():
    """Every replica of a cluster reports the same database-derived backlog: a sum() would count
    it once per replica, so scaling out would look like a growing backlog."""
    for rule in _rules():
        expr = rule["expr"]
        used = {name for name in re.findall(r"\bqinglong_[a-z_]+", expr) if name in STORE_DERIVED}
        if used:
            assert "sum" not in expr, f"{rule['alert']} sums {sorted(used)}"
            for name in used:
                for match in re.finditer(rf"\b{name}\b", expr):
                    before = expr[:match.start()]
                    assert re.search(r"max by \([^)]*\) \((?:[a-z_]+\()?$", before), (
                        f"{rule['alert']}: {name} is not under max by (...)")


def test_the_lag_alert_uses_the_status_grace_not_a_threshold_of_its_own():
    """A number written in the rule would page at a lag ``qinglong status`` and the page call
    clear (or stay quiet while they say attention): the rule compares with the grace the process
    exports from the same function the verdict uses."""
    (rule,) = [r for r in _rules() if r.get("alert") == "QinglongAdmissionLagHigh"]
    assert "qinglong_status_grace_seconds" in rule["expr"]
    assert not re.search(r">\s*[0-9]", rule["expr"]), rule["expr"]
