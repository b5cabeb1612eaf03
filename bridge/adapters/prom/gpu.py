"""The free GPU memory of nodes about to wake a sleeping replica (``pools[].wake_gpu_free_mib``).

One instant query, made only for the nodes returning asleep: dcgm-exporter's
``DCGM_FI_DEV_FB_FREE`` (a gauge, MiB, one series per GPU, the node on ``prometheus.gpu_node_label``)
and each series' sample time, as ``build_query`` pairs them (``bridge_q`` tags). Per node the
lowest value over its GPUs, or None (unknown, which the lifecycle counts as not free) when any
series is NaN, infinite, negative or stale, or the node shows fewer series than it has GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .types import TAG, _bad, _describe, _escape, _float, _replica_key, _tag

FB_FREE = "DCGM_FI_DEV_FB_FREE"


def build_gpu_query(nodes: Collection[str], *, node_label: str) -> str:
    """The free framebuffer of each GPU of ``nodes`` and its sample time, in one query."""
    sel = f'{node_label}=~"{_escape("|".join(re.escape(n) for n in sorted(nodes)))}"'
    return f"{_tag(f'{FB_FREE}{{{sel}}}', 'value')}\n  or {_tag(f'timestamp({FB_FREE}{{{sel}}})', 'ts')}"


def parse_gpu_free(
    result: Sequence[Mapping[str, Any]], *, nodes: Collection[str], node_label: str, gpus: int, now: float, staleness_s: float
) -> tuple[dict[str, float | None], dict[str, str]]:
    """An instant-query result -> node -> its lowest free MiB (None: unknown), and node -> why
    it is unknown (pure). Samples are aged against the answer's evaluation time (``now`` when it
    is empty); ``gpus``: the series each node must show."""
    t = float(result[0]["value"][0]) if result else now
    values: dict[str, dict[frozenset[tuple[str, str]], float]] = {n: {} for n in nodes}
    stamps: dict[str, dict[frozenset[tuple[str, str]], float]] = {n: {} for n in nodes}
    unlabelled = ""
    for item in result:
        metric = item.get("metric") or {}
        node = metric.get(node_label)
        if node is None:
            unlabelled = unlabelled or _describe(_replica_key(metric))
            continue
        if node in values:
            (stamps if metric.get(TAG) == "ts" else values)[node][_replica_key(metric)] = _float(item["value"][1])
    free: dict[str, float | None] = {}
    problems: dict[str, str] = {}
    for node in sorted(nodes):
        why = f"a {FB_FREE} series without the label {node_label}: {unlabelled}" if unlabelled else None
        for key, v in sorted(values[node].items(), key=lambda kv: sorted(kv[0])):
            bad = _bad(v)
            ts = stamps[node].get(key)
            if bad is None and (ts is None or t - ts > staleness_s):
                bad = f"is stale (sample {'time missing' if ts is None else f'{t - ts:.0f} s old'}, limit {staleness_s:g} s)"
            if bad is not None:
                why = why or f"{FB_FREE}{_describe(key)} {bad}"
        if why is None and len(values[node]) < gpus:
            why = f"{FB_FREE}: {len(values[node])} series for {node_label}={node!r}, expected one per GPU ({gpus})"
        free[node] = None if why is not None else min(values[node].values())
        if why is not None:
            problems[node] = why
    return free, problems
