"""A small fake of NVIDIA's dcgm-exporter for the sandbox: ``GET /metrics`` serves
``DCGM_FI_DEV_FB_FREE`` and ``DCGM_FI_DEV_FB_USED`` (gauges, MiB: dcgm-exporter's default memory
counters; ``DCGM_FI_DEV_FB_RESERVED`` is not a default, so not here) for each node x ``gpus`` GPUs,
labelled as dcgm-exporter labels them (``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``),
so the daemon's free-GPU check before a warm wake (``pools[].wake_gpu_free_mib``, a number or
``auto``) reads what it would on a site.

The lab's knob: ``PUT /faults {"held": {"gpu-node-01": 70000}}`` holds that many MiB on each
GPU of a node (a research job stuck in ``Kill task failed``); ``{"held": {}}`` releases all.
``GET /faults`` shows them. Run it in-process (``FakeDcgm(...).start()``) or
``python -m gpu_bridge_lab.sandbox.dcgm --port 9400 --nodes 4``.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpu_bridge_lab.sandbox.cluster.prometheus import ScrapeTarget
from gpu_bridge_lab.sandbox.cluster.slurm import node_names

FB_TOTAL_MIB = 81_559  # an H100 80GB HBM3
FB_BASE_USED_MIB = 500  # what a sleeping engine (or the driver) keeps on each GPU
MODEL = "NVIDIA H100 80GB HBM3"


class FakeDcgm:
    """One exporter for every sandbox node (a real site runs one per node)."""

    def __init__(self, nodes: Sequence[str], *, gpus: int = 4, host: str = "127.0.0.1", port: int = 0) -> None:
        self.nodes, self.gpus = tuple(nodes), gpus
        self.held: dict[str, float] = {}  # node -> MiB held on each of its GPUs
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def scrape_target(self) -> ScrapeTarget:
        """Its scrape job for the sandbox's Prometheus (``serving_sandbox(dcgm=...)``)."""
        return ScrapeTarget("dcgm", (self.address,))

    def hold(self, held: dict[str, float]) -> None:
        """Hold MiB on each GPU of the nodes named (replacing what was held); bad input raises."""
        for node, mib in held.items():
            if node not in self.nodes:
                raise ValueError(f"held: unknown node {node!r}")
            if isinstance(mib, bool) or not isinstance(mib, (int, float)) or not 0 <= mib <= FB_TOTAL_MIB:
                raise ValueError(f"held[{node}]: expected MiB between 0 and {FB_TOTAL_MIB}, got {mib!r}")
        with self._lock:
            self.held = {n: float(m) for n, m in held.items()}

    def metrics(self) -> str:
        """The exposition text of one scrape."""
        with self._lock:
            held = dict(self.held)
        lines: list[str] = []
        for name, what in (("DCGM_FI_DEV_FB_FREE", "free"), ("DCGM_FI_DEV_FB_USED", "used")):
            lines += [f"# HELP {name} Framebuffer memory {what} (in MiB).", f"# TYPE {name} gauge"]
            for i, node in enumerate(self.nodes):
                used = min(float(FB_TOTAL_MIB), FB_BASE_USED_MIB + held.get(node, 0.0))
                for gpu in range(self.gpus):
                    labels = (f'gpu="{gpu}",UUID="GPU-{i:04x}{gpu:04x}-0000-0000-0000-000000000000",device="nvidia{gpu}",'
                              f'modelName="{MODEL}",Hostname="{node}"')
                    lines.append(f"{name}{{{labels}}} {(FB_TOTAL_MIB - used) if what == 'free' else used:g}")
        return "\n".join(lines) + "\n"

    def start(self) -> FakeDcgm:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-dcgm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(200, fake.metrics(), "text/plain; version=0.0.4")
                elif self.path == "/faults":
                    with fake._lock:
                        self._send(200, json.dumps({"held": fake.held}), "application/json")
                else:
                    self._send(404, "not found\n", "text/plain")

            def do_PUT(self) -> None:
                if self.path != "/faults":
                    self._send(404, "not found\n", "text/plain")
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                    held = body.get("held") if isinstance(body, dict) else None
                    if not isinstance(held, dict):
                        raise ValueError(f"held: expected an object node -> MiB, got {held!r}")
                    fake.hold(held)
                except ValueError as exc:  # json.JSONDecodeError is one
                    self._send(400, f"{exc}\n", "text/plain")
                    return
                self._send(200, json.dumps({"held": fake.held}), "application/json")

            def _send(self, code: int, text: str, ctype: str) -> None:
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # quiet: Prometheus scrapes often
                pass

        return Handler


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=9400)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--nodes", type=int, default=4, help="sandbox nodes gpu-node-01.. (default 4)")
    ap.add_argument("--gpus", type=int, default=4)
    args = ap.parse_args(argv)
    FakeDcgm(node_names(args.nodes), gpus=args.gpus, host=args.host, port=args.port).start()._thread.join()  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
