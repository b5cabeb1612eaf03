"""The lab's fake dcgm-exporter: what Prometheus scrapes from it (one ``DCGM_FI_DEV_FB_FREE``
series per node x GPU, labelled as dcgm-exporter does) and its knob to hold memory on a node,
which refuses bad input naming the field. Parsed back with the adapter's own parser."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.adapters.prom.gpu import FB_FREE, FB_USED, parse_gpu_free
from gpu_bridge_lab.sandbox.dcgm import FB_BASE_USED_MIB, FB_TOTAL_MIB, FakeDcgm

NODES = ("gpu-node-01", "gpu-node-02")


@pytest.fixture
def dcgm() -> Iterator[FakeDcgm]:
    d = FakeDcgm(NODES).start()
    yield d
    d.stop()


def put(d: FakeDcgm, body: object) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{d.address}/faults", data=json.dumps(body).encode(), method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(d: FakeDcgm) -> dict[str, float | None]:
    """/metrics as Prometheus would store it, read back as the adapter's instant answer."""
    with urllib.request.urlopen(f"http://{d.address}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    result = [{"metric": {**s.labels, "bridge_q": q}, "value": [100.0, str(s.value if q == "value" else 99.0)]}
              for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == FB_FREE for q in ("value", "ts")]
    assert {r["metric"]["Hostname"] for r in result} == set(NODES) and len(result) == 2 * len(NODES) * 4
    return parse_gpu_free(result, nodes=NODES, node_label="Hostname", gpus=4, now=100.0, staleness_s=30)[0]


def test_it_serves_each_node_s_gpus_and_holds_memory_when_told(dcgm: FakeDcgm) -> None:
    free = float(FB_TOTAL_MIB - FB_BASE_USED_MIB)
    assert scrape(dcgm) == {n: free for n in NODES}
    assert put(dcgm, {"held": {"gpu-node-01": 70000}})[0] == 200
    assert scrape(dcgm) == {"gpu-node-01": free - 70000, "gpu-node-02": free}
    assert put(dcgm, {"held": {}})[0] == 200
    assert scrape(dcgm) == {n: free for n in NODES}


def test_used_memory_is_exported_too_and_free_plus_used_is_the_gpu_s_total(dcgm: FakeDcgm) -> None:
    dcgm.hold({"gpu-node-01": 70000})
    fams = {f.name: f for f in text_string_to_metric_families(dcgm.metrics())}
    free = {(s.labels["Hostname"], s.labels["gpu"]): s.value for s in fams[FB_FREE].samples}
    used = {(s.labels["Hostname"], s.labels["gpu"]): s.value for s in fams[FB_USED].samples}
    assert set(free) == set(used) and len(used) == 8 and fams[FB_USED].type == "gauge"
    assert all(free[k] + used[k] == FB_TOTAL_MIB for k in free)
    assert used[("gpu-node-01", "0")] == FB_BASE_USED_MIB + 70000 and used[("gpu-node-02", "3")] == FB_BASE_USED_MIB


@pytest.mark.parametrize(("body", "why"), [
    ({"held": {"gpu-node-09": 1}}, "held: unknown node 'gpu-node-09'"),
    ({"held": {"gpu-node-01": -1}}, "held[gpu-node-01]: expected MiB between 0"),
    ({"held": {"gpu-node-01": "lots"}}, "held[gpu-node-01]: expected MiB"),
    ({"held": [1]}, "held: expected an object"),
])
def test_bad_faults_are_refused_naming_the_field(dcgm: FakeDcgm, body: object, why: str) -> None:
    code, text = put(dcgm, body)
    assert code == 400 and why in text
    assert dcgm.held == {}
