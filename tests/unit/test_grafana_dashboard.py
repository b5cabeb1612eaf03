"""deploy/grafana/gpu-bridge-dashboard.json: valid JSON with the panels an operator needs, and
every PromQL expression in it parses. promtool 2.42 has no parse-only command, so each
expression (Grafana variables replaced by sample values) becomes a recording rule in a temp
rules file that `promtool check rules` must accept."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpu-bridge-dashboard.json"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1d", "$pool": ".*", "$model": ".*"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    out = []
    for p in dashboard()["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def expressions() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels() for t in p.get("targets", [])]


def substitute(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def test_shape() -> None:
    d = dashboard()
    assert d["uid"] == "gpu-bridge" and d["title"]
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "pool", "model"} <= names
    for p in panels():
        if p["type"] != "row":
            assert p["targets"], p["title"]
            assert p["datasource"]["uid"] == "${datasource}", p["title"]


def test_covers_what_the_issue_asks() -> None:
    text = json.dumps(dashboard())
    for needle in (
        "gpu_bridge_pool_serving_ready_replicas",  # Ready capacity
        "gpu_bridge_pool_demand_replicas",  # load
        'phase=\\"lent\\"',  # lent nodes
        "vllm:num_requests_waiting",  # vLLM load
        "gpu_bridge_reclaim_duration_seconds_bucket",  # reclaim latency
        "gpu_bridge_preempted_jobs_total",  # preemptions
        "gpu_bridge_lost_gpu_hours_total",  # lost GPU-hours
    ):
        assert needle in text, needle


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")
def test_every_expression_parses(tmp_path: Path) -> None:
    exprs = expressions()
    assert len(exprs) > 20
    rules = [{"record": f"dashboard:expr_{i}", "expr": substitute(e)} for i, (_, e) in enumerate(exprs)]
    path = tmp_path / "dashboard-exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    r = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules)} rules found" in r.stdout


def test_parse_check_catches_a_broken_expression(tmp_path: Path) -> None:
    """The method above really parses: a broken expression fails it."""
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool not installed")
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [{"record": "x:y", "expr": "sum(rate(foo[5m])"}]}]}))
    r = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0
