"""The vLLM replica simulator (`gpu-bridge sandbox vllm`): queueing model, trace-driven
arrivals, vLLM's Prometheus metrics, a control API and follow-kube mode.
See docs/vllm-simulator.md."""

from gpu_bridge_lab.sandbox.vllm.cli import register_cli

__all__ = ["register_cli"]
