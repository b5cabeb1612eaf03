"""The free-GPU check's query against a real Prometheus (/usr/bin/prometheus, the sandbox's scrape
configuration, 1 s interval) scraping the lab's fake dcgm-exporter (``gpu_bridge_lab.sandbox.dcgm``):
``PromAdapter.gpu_free`` answers each node asked for with its lowest free MiB in one query,
follows memory held through the fake's knob, and is unknown for a node with fewer series
than GPUs or when the node label is not the exporter's."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_prom_adapter import RunningPrometheus

from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.types import PromPool
from gpu_bridge_lab.sandbox.cluster import prometheus as sandbox_prom
from gpu_bridge_lab.sandbox.dcgm import FB_BASE_USED_MIB, FB_TOTAL_MIB, FakeDcgm

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs /usr/bin/prometheus")]

NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
FREE = float(FB_TOTAL_MIB - FB_BASE_USED_MIB)
POOL = PromPool("default", "m")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FakeDcgm]]:
    tmp: Path = tmp_path_factory.mktemp("prom-gpu")
    dcgm = FakeDcgm(NODES, gpus=4).start()
    prom = RunningPrometheus(tmp, [], config=sandbox_prom.render_config([dcgm.scrape_target()], interval_s=1.0))
    try:
        prom.wait_until(lambda: sandbox_prom.scraped_once(prom.url, ["dcgm"], ["dcgm"]), timeout=60)
        yield prom.url, dcgm
    finally:
        prom.stop()
        dcgm.stop()


def test_one_query_gives_each_asked_node_its_lowest_free_gpu_and_follows_held_memory(world: tuple[str, FakeDcgm]) -> None:
    url, dcgm = world
    adapter = PromAdapter(url, timeout_s=5, staleness_s=30)
    assert adapter.gpu_free(POOL, ["gpu-node-01", "gpu-node-02"], node_label="Hostname", gpus=4) == {
        "gpu-node-01": FREE, "gpu-node-02": FREE}
    assert adapter.calls() == {"query": 1} and adapter.failures() == {}
    dcgm.hold({"gpu-node-01": 70_000})
    deadline = time.time() + 20
    while (got := adapter.gpu_free(POOL, ["gpu-node-01"], node_label="Hostname", gpus=4)) != {"gpu-node-01": FREE - 70_000}:
        assert time.time() < deadline, got
        time.sleep(0.5)
    dcgm.hold({})


def test_fewer_series_than_gpus_or_another_node_label_is_unknown(world: tuple[str, FakeDcgm]) -> None:
    url, _ = world
    adapter = PromAdapter(url, timeout_s=5, staleness_s=30)
    assert adapter.gpu_free(POOL, ["gpu-node-03"], node_label="Hostname", gpus=8) == {"gpu-node-03": None}
    assert adapter.gpu_free(POOL, ["gpu-node-03"], node_label="node", gpus=4) == {"gpu-node-03": None}
    assert adapter.gpu_free(POOL, ["gpu-node-09"], node_label="Hostname", gpus=4) == {"gpu-node-09": None}
