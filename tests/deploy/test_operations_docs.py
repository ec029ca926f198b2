"""docs/operations.md against what ships: every metric, every alert with what to do, the status
exit codes, and the deployment files it points to."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from qinglong.contracts.observe import METRICS, Verdict

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "operations.md").read_text()
RULES = yaml.safe_load((REPO / "deploy" / "prometheus" / "qinglong.rules.yml").read_text())


def _section(heading: str) -> str:
    start = DOC.index(heading)
    following = re.search(r"^#{2,3} ", DOC[start + len(heading):], re.M)
    return DOC[start:start + len(heading) + (following.start() if following else len(DOC))]


def test_every_metric_is_in_the_table_with_its_type_labels_and_aggregation():
    """A metric missing from the docs, or listed with the wrong labels, leaves the operator
    guessing how to query it, and summing a store-derived gauge over replicas multiplies it."""
    rows = {}
    for line in _section("## Metrics").splitlines():
        match = re.match(r"\| `(qinglong_[a-z_]+)` \|([^|]+)\|([^|]*)\|([^|]+)\|", line)
        if match:
            rows[match.group(1)] = (line, match.group(2).strip(), match.group(3).strip(), match.group(4).strip())
    assert set(rows) == {spec.name for spec in METRICS}
    for spec in METRICS:
        line, kind, labels, source = rows[spec.name]
        assert kind.startswith(spec.type.value), (spec.name, kind)
        assert re.findall(r"`([a-z_]+)`", labels) == list(spec.labels), (spec.name, labels)
        if source == "store":
            assert line.rstrip().endswith("| `max` |"), f"{spec.name} is store-derived: aggregate with max"
    assert "never `sum`" in DOC


def test_every_alert_has_a_section_saying_what_to_do_with_its_severity():
    """An alert that pages with no runbook, or a runbook naming another severity than the rule,
    costs the person on call the time the docs should have saved."""
    rules = [rule for group in RULES["groups"] for rule in group["rules"]]
    for rule in rules:
        section = _section(f"### {rule['alert']}")
        assert section.split("\n", 2)[2].startswith(f"*{rule['labels']['severity']}"), rule["alert"]
        assert "What to do" in section, rule["alert"]
        assert f'"{rule["alert"]}" in docs/operations.md' in " ".join(rule["annotations"]["description"].split())
    assert len(re.findall(r"^### Qinglong", DOC, re.M)) == len(rules)


def test_status_exit_codes_match_the_verdicts():
    """Scripts and monitors branch on `qinglong status`'s exit code: a documented code that is
    not the real one makes them page on a draining backlog, or never."""
    table = _section("## `qinglong status`")
    for verdict in Verdict:
        assert re.search(rf"^\| `{int(verdict)}` \| {verdict.name.lower()} \|", table, re.M), verdict


def test_every_deployment_file_the_doc_names_exists():
    """A runbook pointing at a file that is not shipped sends the operator looking for it."""
    named = set(re.findall(r"`(deploy/[A-Za-z0-9_./-]+)`", DOC))
    assert {"deploy/prometheus/qinglong.rules.yml", "deploy/systemd/qinglong.service",
            "deploy/kubernetes/"} <= named
    for path in named:
        assert (REPO / path).exists(), path
    for name in re.findall(r"^- `([a-z-]+\.(?:yaml|toml))`", _section("### Kubernetes"), re.M):
        assert (REPO / "deploy" / "kubernetes" / name).exists(), name
