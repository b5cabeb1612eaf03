"""The free-GPU check's query against a real Prometheus (/usr/bin/prometheus, the sandbox's scrape
configuration, 1 s interval) scraping the lab's fake dcgm-exporter (``gpu_bridge_lab.sandbox.dcgm``):
``PromAdapter.gpu_free`` answers each node asked for with its lowest free MiB in one query,
follows memory held through the fake's knob, and is unknown for a node with fewer series
than GPUs or when the node label is not the exporter's. With ``wake_gpu_free_mib: auto`` (``pods``)
the same one query reads the lab vLLM simulator's ``vllm:cache_config_info`` (its
``gpu_memory_utilization`` label) and the fake's ``DCGM_FI_DEV_FB_USED``: each node's margin
beyond the engine's need, unknown for a pod without the series."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_prom_adapter import RunningPrometheus

from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.types import PromPool
from bridge.trace import Trace
from gpu_bridge_lab.sandbox.cluster import prometheus as sandbox_prom
from gpu_bridge_lab.sandbox.dcgm import FB_BASE_USED_MIB, FB_TOTAL_MIB, FakeDcgm
from gpu_bridge_lab.sandbox.vllm.server import SimServer
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs /usr/bin/prometheus")]

NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
FREE = float(FB_TOTAL_MIB - FB_BASE_USED_MIB)
POOL = PromPool("default", "m")
UTIL = SleepParams().gpu_memory_utilization  # what the simulated engine exports (0.9)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FakeDcgm]]:
    tmp: Path = tmp_path_factory.mktemp("prom-gpu")
    dcgm = FakeDcgm(NODES, gpus=4).start()
    sim = Simulation(Trace((0.0, 600.0), (1.0, 1.0), (1.0, 1.0), 600.0, "flat"), ["m"], seed=1)
    sim.add_replica("m-0", "m", "gpu-node-02", warmup_s=0.0)  # its metrics (no sleep mode: no DCGM series of its own)
    server = SimServer(sim, "127.0.0.1", 0, tick_s=0.05).start()
    vllm = sandbox_prom.ScrapeTarget("vllm", (f"127.0.0.1:{server.port}",), labels={"namespace": "serving", "cluster": "a"})
    prom = RunningPrometheus(tmp, [], config=sandbox_prom.render_config([dcgm.scrape_target(), vllm], interval_s=1.0))
    try:
        prom.wait_until(lambda: sandbox_prom.scraped_once(prom.url, ["dcgm", "vllm"], ["dcgm", "vllm"]), timeout=60)
        yield prom.url, dcgm
    finally:
        prom.stop()
        dcgm.stop()
        server.stop()


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


def test_auto_reads_the_engine_s_share_and_each_gpu_s_total_in_the_same_one_query(world: tuple[str, FakeDcgm]) -> None:
    url, dcgm = world
    adapter = PromAdapter(url, timeout_s=5, staleness_s=30)
    pods = {"gpu-node-02": "m-0"}
    got = adapter.gpu_free(POOL, ["gpu-node-02"], node_label="Hostname", gpus=4, pods=pods)
    assert got == {"gpu-node-02": pytest.approx(FREE - UTIL * FB_TOTAL_MIB)}  # 7,655 MiB beyond the need
    assert adapter.calls() == {"query": 1} and adapter.failures() == {}
    dcgm.hold({"gpu-node-02": 10_000})  # a stuck job: FB_FREE down, FB_USED up, the total the same
    deadline = time.time() + 20
    while (got := adapter.gpu_free(POOL, ["gpu-node-02"], node_label="Hostname", gpus=4, pods=pods)) != {
            "gpu-node-02": pytest.approx(FREE - 10_000 - UTIL * FB_TOTAL_MIB)}:
        assert time.time() < deadline, got
        time.sleep(0.5)
    dcgm.hold({})
    in_ns = PromPool("default", "m", namespace="serving")
    assert adapter.gpu_free(in_ns, ["gpu-node-02"], node_label="Hostname", gpus=4, pods=pods)["gpu-node-02"] is not None
    other_ns = PromPool("default", "m", namespace="other")  # the pod's series is not in that namespace: unknown
    assert adapter.gpu_free(other_ns, ["gpu-node-02"], node_label="Hostname", gpus=4, pods=pods) == {"gpu-node-02": None}
    # the pool's prometheus_matchers select the info gauge too (it is scraped with the same target labels)
    same = PromPool("default", "m", namespace="serving", matchers={"cluster": "a"})
    assert adapter.gpu_free(same, ["gpu-node-02"], node_label="Hostname", gpus=4, pods=pods)["gpu-node-02"] is not None
    other = PromPool("default", "m", namespace="serving", matchers={"cluster": "b"})
    assert adapter.gpu_free(other, ["gpu-node-02"], node_label="Hostname", gpus=4, pods=pods) == {"gpu-node-02": None}
    assert adapter.gpu_free(POOL, ["gpu-node-03"], node_label="Hostname", gpus=4, pods={"gpu-node-03": "m-9"}) == {
        "gpu-node-03": None}
