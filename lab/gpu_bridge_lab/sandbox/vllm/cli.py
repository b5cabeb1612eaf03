"""`gpu-bridge sandbox vllm`: the vLLM replica simulator as a process.

Prints ``vllm-sim listening on http://HOST:PORT`` once it serves; exits 0 on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from typing import Any

from gpu_bridge_lab.sandbox.vllm.model import ReplicaParams

_DEFAULTS = ReplicaParams()


def parse_clock(text: str) -> float:
    """Seconds from ``"64800"``, ``"18:00"`` or ``"18:00:30"`` (trace time; day 0 midnight is 0)."""
    m = re.fullmatch(r"(\d+):(\d{2})(?::(\d{2}))?", text.strip())
    if m:
        h, mi, s = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if mi > 59 or s > 59:
            raise argparse.ArgumentTypeError(f"--trace-start-s: bad time of day {text!r}")
        return float(h * 3600 + mi * 60 + s)
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--trace-start-s: expected seconds or HH:MM, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"--trace-start-s: expected >= 0, got {text!r}")
    return v


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def register_cli(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "vllm", help="run the vLLM replica simulator (vLLM /metrics + a control API)",
        description="Simulate the replicas of one or more vLLM-served models under a trace-driven load.",
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    g.add_argument("--metrics-version", choices=("v1", "v0"), default="v1",
                   help="v1: vllm:kv_cache_usage_perc; v0: vllm:gpu_cache_usage_perc, num_requests_swapped, cpu_cache_usage_perc")
    g.add_argument("--tick-s", type=_positive, default=0.1, help="wall-clock interval of simulation ticks")
    g.add_argument("--step-s", type=_positive, default=0.1, help="largest simulation step")
    g = p.add_argument_group("replicas")
    g.add_argument("--model", action="append", dest="models", metavar="NAME",
                   help="served model name (repeatable; default: meta-llama/Llama-3.1-70B-Instruct)")
    g.add_argument("--replicas", type=int, default=0, help="replicas of each model at start, named <model-slug>-0, -1, ... (slug: last path part, lower-case)")
    g.add_argument("--node", action="append", dest="nodes", default=[], metavar="NAME",
                   help="node label of the start replicas, in order (repeatable)")
    g.add_argument("--shutdown-timeout", type=_non_negative, default=_DEFAULTS.shutdown_timeout_s,
                   help="seconds a removed replica drains in-flight requests before aborting them (like vllm --shutdown-timeout)")
    g.add_argument("--warmup-s", type=_non_negative, default=_DEFAULTS.warmup_s,
                   help="seconds from POST /replicas to serving (default for the API; start replicas serve at once)")
    g.add_argument("--max-num-seqs", type=int, default=_DEFAULTS.max_num_seqs)
    g.add_argument("--tokens-per-s", type=_positive, default=_DEFAULTS.tokens_per_s,
                   help="engine token budget per replica (decode-token units/s)")
    g.add_argument("--seq-tokens-per-s", type=_positive, default=_DEFAULTS.seq_tokens_per_s,
                   help="per-sequence decode ceiling, tokens/s")
    g.add_argument("--prefill-cost", type=_non_negative, default=_DEFAULTS.prefill_cost,
                   help="budget cost of one prompt token, in decode tokens")
    g.add_argument("--kv-cache-tokens", type=int, default=_DEFAULTS.kv_cache_tokens)
    g.add_argument("--prompt-tokens-mean", type=_positive, default=_DEFAULTS.prompt_tokens_mean)
    g.add_argument("--prompt-tokens-sigma", type=_non_negative, default=_DEFAULTS.prompt_tokens_sigma)
    g.add_argument("--gen-tokens-mean", type=_positive, default=_DEFAULTS.gen_tokens_mean)
    g.add_argument("--gen-tokens-sigma", type=_non_negative, default=_DEFAULTS.gen_tokens_sigma)
    g.add_argument("--max-model-len", type=int, default=_DEFAULTS.max_model_len)
    g.add_argument("--max-tokens", type=int, default=_DEFAULTS.max_tokens)
    g.add_argument("--enable-sleep-mode", action="store_true",
                   help="like vllm --enable-sleep-mode: /sleep, /wake_up, /is_sleeping (also needs "
                   "VLLM_SERVER_DEV_MODE=1 in the environment, as vLLM), memory accounting and its metrics")
    g.add_argument("--dev-mode", action="store_true",
                   help="as VLLM_SERVER_DEV_MODE=1 in the environment (for a process started without it: the sandbox's)")
    g = p.add_argument_group("load")
    g.add_argument("--trace", default=None, help="trace CSV (default: the shipped ServeGen trace)")
    g.add_argument("--speed", type=_positive, default=1.0, help="trace seconds per wall second (288: a day in 5 min)")
    g.add_argument("--trace-start-s", type=parse_clock, default=0.0, help="trace time at start: seconds or HH:MM (18:00)")
    s = g.add_mutually_exclusive_group()
    s.add_argument("--scale", type=_positive, default=None, help="multiply the trace's rates")
    s.add_argument("--peak-rps", type=_positive, default=None, help="scale the trace so its peak window is this req/s")
    g.add_argument("--max-cv", type=_positive, default=None, help="cap the trace's burstiness (default: honour it)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("follow Kubernetes (replicas = Ready pods)")
    g.add_argument("--kubeconfig", default=None)
    g.add_argument("--namespace", default="default")
    g.add_argument("--selector", default="", help="label selector of the vLLM Deployment's pods")
    g.add_argument("--model-label", default=None, help="pod label naming the model (default gpu-bridge.io/model)")
    g.add_argument("--pod-port", type=int, default=None, metavar="PORT",
                   help="also answer each pod's vLLM sleep routes (/sleep, /wake_up, /is_sleeping, /health) at "
                   "http://<pod IP>:PORT for that pod's replica, as its own server would (needs --kubeconfig, and "
                   "pod IPs local to this machine: the sandbox's are loopback addresses)")
    p.set_defaults(func=run)


DEFAULT_MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def _replica_name(model: str, i: int) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-") or "model"
    return f"{slug}-{i}"


def run(args: argparse.Namespace) -> int:
    from bridge import logs
    from bridge.errors import ConfigError
    from gpu_bridge_lab.sandbox.vllm.server import SimServer
    from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams
    from gpu_bridge_lab.sandbox.vllm.sim import SimError, Simulation
    from bridge.trace import load_trace

    logs.configure()
    log = logs.get("gpu_bridge_lab.sandbox.vllm")
    try:
        params = ReplicaParams(
            max_num_seqs=args.max_num_seqs, tokens_per_s=args.tokens_per_s, seq_tokens_per_s=args.seq_tokens_per_s,
            prefill_cost=args.prefill_cost, kv_cache_tokens=args.kv_cache_tokens,
            prompt_tokens_mean=args.prompt_tokens_mean, prompt_tokens_sigma=args.prompt_tokens_sigma,
            gen_tokens_mean=args.gen_tokens_mean, gen_tokens_sigma=args.gen_tokens_sigma,
            max_model_len=args.max_model_len, max_tokens=args.max_tokens,
            shutdown_timeout_s=args.shutdown_timeout, warmup_s=args.warmup_s,
        )
    except ValueError as exc:
        print(f"gpu-bridge sandbox vllm: {exc}", file=sys.stderr)
        return 2
    if args.replicas < 0:
        print("gpu-bridge sandbox vllm: --replicas: expected >= 0", file=sys.stderr)
        return 2
    try:
        trace = load_trace(args.trace)
    except ConfigError as exc:
        print(f"gpu-bridge sandbox vllm: {exc}", file=sys.stderr)
        return 2
    if args.peak_rps is not None:
        trace = trace.scaled(args.peak_rps / trace.peak_rate)
    elif args.scale is not None:
        trace = trace.scaled(args.scale)
    if args.pod_port is not None and (not args.kubeconfig or not 0 < args.pod_port < 65536):
        print("gpu-bridge sandbox vllm: --pod-port: needs --kubeconfig and a port 1-65535", file=sys.stderr)
        return 2
    models = args.models or [DEFAULT_MODEL]
    sim = Simulation(trace, models, params, speed=args.speed, trace_start_s=args.trace_start_s, seed=args.seed,
                     step_s=args.step_s, max_cv=args.max_cv,
                     sleep_params=SleepParams() if args.enable_sleep_mode else None)
    i_node = 0
    for model in models:
        for i in range(args.replicas):
            node = args.nodes[i_node] if i_node < len(args.nodes) else ""
            i_node += 1
            try:
                sim.add_replica(_replica_name(model, i), model, node, warmup_s=0.0)
            except SimError as exc:
                print(f"gpu-bridge sandbox vllm: --model {model}: {exc}", file=sys.stderr)
                return 2
    try:
        server = SimServer(sim, args.host, args.port, metrics_version=args.metrics_version, tick_s=args.tick_s,
                           dev_mode=True if args.dev_mode else None)
    except OSError as exc:
        print(f"gpu-bridge sandbox vllm: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    server.start()
    follower = None
    pod_ports = None
    if args.kubeconfig:
        from gpu_bridge_lab.sandbox.vllm.follow_kube import MODEL_LABEL, KubeFollower, PodTracker
        from gpu_bridge_lab.sandbox.vllm.pod_ports import PodPorts

        pod_ports = PodPorts(server, args.pod_port) if args.pod_port is not None else None
        tracker = PodTracker(sim, models[0], args.model_label or MODEL_LABEL,
                             on_pods=pod_ports.sync if pod_ports is not None else None)
        try:
            follower = KubeFollower(tracker, args.kubeconfig, args.namespace, args.selector).start()
        except Exception as exc:
            server.stop()
            print(f"gpu-bridge sandbox vllm: --kubeconfig {args.kubeconfig}: {exc}", file=sys.stderr)
            return 2
    log.info("vllm_sim_started", port=server.port, models=models, replicas=len(sim.replicas),
             speed=args.speed, trace=trace.source, peak_rps=round(trace.peak_rate, 1),
             capacity_rps_per_replica=round(params.capacity_rps(), 2), follow_kube=bool(args.kubeconfig))
    print(f"vllm-sim listening on {server.url}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        if follower is not None:
            follower.stop()
        if pod_ports is not None:
            pod_ports.stop()
        server.stop()
        log.info("vllm_sim_stopped", reason="signal")
    return 0
