"""deploy/prometheus/gpu-bridge-rules.yml: `promtool check rules` accepts it and
`promtool test rules` passes its unit tests (gpu-bridge-rules.test.yml); every alert has a
test, a severity and a summary."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "gpu-bridge-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "gpu-bridge-rules.test.yml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def alerts() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


@needs_promtool
def test_promtool_check_rules() -> None:
    r = promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in r.stdout


@needs_promtool
def test_promtool_test_rules() -> None:
    r = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_is_unit_tested() -> None:
    tested = set(re.findall(r"alertname:\s*(\w+)", RULE_TESTS.read_text()))
    names = {a["alert"] for a in alerts()}
    assert names - tested == set(), f"alerts without a promtool test: {sorted(names - tested)}"


def test_the_issue_alerts_exist() -> None:
    names = {a["alert"] for a in alerts()}
    assert {
        "GpuBridgeServingBelowMinimum",  # serving under min_serving
        "GpuBridgeReclaimSlow",  # reclaim slower than its budget
        "GpuBridgeReclaimStuck",
        "GpuBridgeDown",  # daemon down
        "GpuBridgeNoLeader",  # not leader anywhere
        "GpuBridgeTwoLeaders",
        "GpuBridgeTicksStale",  # metrics stale
        "GpuBridgeLoadSignalsStale",
        "GpuBridgeAdapterErrors",
    } <= names


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_has_severity_and_text(alert: dict) -> None:
    assert alert["labels"]["severity"] in ("critical", "warning")
    assert alert["annotations"]["summary"] and alert["annotations"]["description"]
