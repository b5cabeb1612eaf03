"""`gpu-bridge sandbox kube` arguments and the orchestrator's helper that builds them."""

from __future__ import annotations

import pytest

from bridge.cli import build_parser, main
from gpu_bridge_lab.sandbox.kube import ServingModel, cli_args


def test_cli_args_round_trip_through_the_parser() -> None:
    m = ServingModel(nodes=6, pool="research", model="qwen2.5-7b", replicas=5, termination_grace_s=12)
    args = build_parser().parse_args(["sandbox", "kube", "--kubeconfig", "/tmp/x", *cli_args(m, spare_nodes=2)])
    assert (args.seed_serving, args.nodes, args.pool, args.model, args.replicas, args.grace_s, args.spare_nodes) == (
        True, 6, "research", "qwen2.5-7b", 5, 12, 2)
    assert args.port == 0 and args.host == "127.0.0.1" and args.token is None and args.pod_stop_s is None


def test_negative_node_count_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "kube", "--kubeconfig", "/tmp/x", "--nodes", "-1"]) == 2
    assert "--nodes" in capsys.readouterr().err
