"""The free GPU memory of nodes about to wake a sleeping replica (``pools[].wake_gpu_free_mib``).

One instant query, made only for the nodes returning asleep: dcgm-exporter's
``DCGM_FI_DEV_FB_FREE`` (a gauge, MiB, one series per GPU, the node on ``prometheus.gpu_node_label``)
and each series' sample time, as ``build_query`` pairs them (``bridge_q`` tags). Per node the
lowest value over its GPUs, or None (unknown, which the lifecycle counts as not free) when any
series is NaN, infinite, negative or stale, or the node shows fewer series than it has GPUs.

With ``wake_gpu_free_mib: auto`` (``pods``: node -> its sleeping pod) the same query also reads
each GPU's ``DCGM_FI_DEV_FB_USED`` (and ``DCGM_FI_DEV_FB_RESERVED`` where exported; not a
dcgm-exporter default) and the pod's ``vllm:cache_config_info``, an info gauge whose label
``gpu_memory_utilization`` is the engine's share of each GPU. Per node the value is then the
lowest, over its GPUs, of free - utilization x (free + used [+ reserved]): the MiB free beyond
what the woken engine will allocate; >= 0 is free enough.

Why that is conservative: vLLM sizes its whole footprint (weights, activations, KV cache and the
non-torch memory: CUDA context, NCCL buffers) to utilization x the GPU's memory. Asleep (level 1)
the process still holds its CUDA context and NCCL buffers (~0.5-1 GiB a GPU); the wake brings
back only the weights and the KV cache. Demanding the whole footprint free overstates the need
by what the sleeping process keeps, so a GPU judged free has room; a small leftover the wake
would have fitted makes it wait (then cold start) instead. The total is FB_FREE + FB_USED
(+ FB_RESERVED): without RESERVED it is CUDA's total (what vLLM multiplies) on recent drivers,
with it the board's, larger still. Not conservative: the check reads one instant (memory taken
after it is not seen), and an engine sized by ``kv_cache_memory_bytes`` ignores the utilization
(that label set makes the node unknown, with why).
``FB_USED`` is aged like ``FB_FREE`` (its own sample times): a site may export it from another job.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .types import POD_LABEL, TAG, PromPool, _bad, _describe, _escape, _float, _replica_key, _tag, scope_matchers

FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
CACHE_INFO = "vllm:cache_config_info"
UTIL_LABEL = "gpu_memory_utilization"
KV_BYTES_LABEL = "kv_cache_memory_bytes"  # vLLM >= 0.10: when set, the KV cache ignores the utilization


def _any_of(label: str, values: Collection[str]) -> str:
    return f'{label}=~"{_escape("|".join(re.escape(v) for v in sorted(values)))}"'


def build_gpu_query(nodes: Collection[str], *, node_label: str, pods: Collection[str] = (), pool: PromPool | None = None) -> str:
    """The free framebuffer of each GPU of ``nodes`` and its sample time, in one query; with
    ``pods`` (``auto``) also the GPUs' used and reserved memory and the pods' cache config
    (selected by ``pod`` and the ``pool``'s namespace and ``prometheus_matchers``: the info gauge
    carries no model name)."""
    sel = _any_of(node_label, nodes)
    parts = [_tag(f"{FB_FREE}{{{sel}}}", "value"), _tag(f"timestamp({FB_FREE}{{{sel}}})", "ts")]
    if pods:
        info = ",".join([_any_of(POD_LABEL, pods), *(scope_matchers(pool) if pool is not None else [])])
        parts += [_tag(f"{FB_USED}{{{sel}}}", "used"), _tag(f"timestamp({FB_USED}{{{sel}}})", "used_ts"),
                  _tag(f"{FB_RESERVED}{{{sel}}}", "reserved"), _tag(f"{CACHE_INFO}{{{info}}}", "util")]
    return "\n  or ".join(parts)


def engine_utilization(pod: str, infos: Sequence[Mapping[str, str]]) -> tuple[float | None, str]:
    """The share of each GPU the pod's engine allocates (the label ``gpu_memory_utilization`` of
    its ``vllm:cache_config_info``; the largest over its engines), or None and why (pure)."""
    if not infos:
        return None, f"no {CACHE_INFO} series for {POD_LABEL}={pod!r} (its engine's gpu_memory_utilization is unknown)"
    out = 0.0
    for m in infos:
        where = f'{CACHE_INFO}{{{POD_LABEL}="{pod}",engine="{m.get("engine", "")}"}}'
        raw, kv = m.get(UTIL_LABEL), m.get(KV_BYTES_LABEL, "None")
        if raw is None:
            return None, f"{where} has no label {UTIL_LABEL}"
        if not 0 < (v := _float(raw)) <= 1:  # NaN too
            return None, f"{where}: label {UTIL_LABEL}={raw!r} is not a number in (0, 1]"
        if kv not in ("None", ""):
            return None, (f"{where}: label {KV_BYTES_LABEL}={kv!r} is set, the engine sizes its KV cache by it, "
                          f"not by {UTIL_LABEL}: set pools[].wake_gpu_free_mib to a number of MiB")
        out = max(out, v)
    return out, ""


def _margin(
    free: Mapping[frozenset[tuple[str, str]], float], used: Mapping[frozenset[tuple[str, str]], float],
    reserved: Mapping[frozenset[tuple[str, str]], float], util: float | None, problem: str,
) -> tuple[float | None, tuple[str, str] | None]:
    """The lowest, over the GPUs, of free - util x total (total: free + used [+ reserved]), or
    None and (the series at fault, why)."""
    if util is None:
        return None, (CACHE_INFO, problem)
    margins = []
    for key, f in sorted(free.items(), key=lambda kv: sorted(kv[0])):
        u, r = used.get(key), reserved.get(key, 0.0)
        if u is None or _bad(u) is not None:
            return None, (FB_USED, f"{FB_USED}{_describe(key)} {_bad(u) if u is not None else 'is missing'}: "
                                   "the GPU's total memory is unknown")
        if _bad(r) is not None:
            return None, (FB_RESERVED, f"{FB_RESERVED}{_describe(key)} {_bad(r)}: the GPU's total memory is unknown")
        margins.append(f - util * (f + u + r))
    return min(margins), None


def _first_bad(name: str, values: Mapping[frozenset[tuple[str, str]], float],
               stamps: Mapping[frozenset[tuple[str, str]], float], t: float, staleness_s: float,
               so: str = "") -> tuple[str, str] | None:
    """The first of ``name``'s series (by labels) that is bad or older than ``staleness_s`` at
    ``t``: (its name, why and ``so``), or None."""
    for key, v in sorted(values.items(), key=lambda kv: sorted(kv[0])):
        bad = _bad(v)
        ts = stamps.get(key)
        if bad is None and (ts is None or t - ts > staleness_s):
            bad = f"is stale (sample {'time missing' if ts is None else f'{t - ts:.0f} s old'}, limit {staleness_s:g} s)"
        if bad is not None:
            return name, f"{name}{_describe(key)} {bad}{so}"
    return None


def parse_gpu_free(
    result: Sequence[Mapping[str, Any]], *, nodes: Collection[str], node_label: str, gpus: int, now: float, staleness_s: float,
    pods: Mapping[str, str] | None = None,
) -> tuple[dict[str, float | None], dict[str, tuple[str, str]]]:
    """An instant-query result -> node -> its lowest free MiB (with ``pods``, node -> its
    sleeping pod: its lowest MiB free beyond the engine's need; None: unknown), and node ->
    (the series at fault, why it is unknown) (pure). Samples are aged against the answer's
    evaluation time (``now`` when it is empty); ``gpus``: the series each node must show."""
    t = float(result[0]["value"][0]) if result else now
    # node -> tag (value, ts, used, used_ts, reserved) -> GPU -> value
    by_node: dict[str, dict[str, dict[frozenset[tuple[str, str]], float]]] = {n: {} for n in nodes}
    infos: dict[str, list[Mapping[str, str]]] = {}
    unlabelled: tuple[str, str] | None = None  # the first series without the node label: its name, why
    for item in result:
        metric = item.get("metric") or {}
        tag, node = metric.get(TAG, "value"), metric.get(node_label)
        if tag == "util":
            infos.setdefault(metric.get(POD_LABEL, ""), []).append(metric)
        elif node is None and unlabelled is None:
            name = metric.get("__name__", FB_FREE)  # timestamp() drops the name
            unlabelled = (name, f"a {name} series without the label {node_label}: {_describe(_replica_key(metric))}")
        elif node in by_node:
            by_node[node].setdefault(tag, {})[_replica_key(metric)] = _float(item["value"][1])
    free: dict[str, float | None] = {}
    problems: dict[str, tuple[str, str]] = {}
    for node in sorted(nodes):
        got = by_node[node]
        values = got.get("value", {})
        why = unlabelled or _first_bad(FB_FREE, values, got.get("ts", {}), t, staleness_s)
        if why is None and pods is not None:  # used memory aged on its own (another job may export it)
            why = _first_bad(FB_USED, got.get("used", {}), got.get("used_ts", {}), t, staleness_s,
                             ": the GPU's total memory is unknown")
        if why is None and len(values) < gpus:
            why = (FB_FREE, f"{FB_FREE}: {len(values)} series for {node_label}={node!r}, expected one per GPU ({gpus})")
        value = min(values.values()) if why is None else None
        if why is None and pods is not None:
            value, why = _margin(values, got.get("used", {}), got.get("reserved", {}),
                                 *engine_utilization(pods[node], infos.get(pods[node], [])))
        free[node] = value
        if why is not None:
            problems[node] = why
    return free, problems
