"""Slurm hostlists (``gpu-node-[01-03,07]``)."""

from __future__ import annotations

import re

from bridge.errors import AdapterError

MAX_EXPANDED = 100_000
def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError("unbalanced '['")
    out.append("".join(cur))
    return [p for p in (s.strip() for s in out) if p]


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if m is None:
        return [item]
    prefix, body, rest = item[: m.start()], m.group(1), item[m.end() :]
    values: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if re.fullmatch(r"\d+", part):
            values.append(part)
            continue
        r = re.fullmatch(r"(\d+)-(\d+)", part)
        if r is None:
            raise ValueError(f"bad range {part!r}")
        lo, hi = int(r.group(1)), int(r.group(2))
        if hi < lo:
            raise ValueError(f"bad range {part!r} (end before start)")
        if hi - lo >= MAX_EXPANDED:
            raise ValueError(f"range {part!r} too large")
        width = len(r.group(1))
        values.extend(f"{i:0{width}d}" for i in range(lo, hi + 1))
    out = []
    for v in values:
        out.extend(_expand_one(prefix + v + rest))
        if len(out) > MAX_EXPANDED:
            raise ValueError("hostlist too large")
    return out


def expand(hostlist: str) -> tuple[str, ...]:
    """``gpu-node-[01-03,07],login1`` -> ("gpu-node-01", "gpu-node-02", "gpu-node-03",
    "gpu-node-07", "login1"); ``""`` -> (). AdapterError on a malformed list."""
    if not isinstance(hostlist, str):
        raise AdapterError("slurm", f"hostlist: expected a string, got {type(hostlist).__name__}")
    text = hostlist.strip()
    if not text or text in ("(null)", "None"):
        return ()
    if "[" not in text and "]" not in text and "," not in text:
        return (text,)  # one plain name, the common case: no parsing needed
    try:
        out: list[str] = []
        for item in _split_top(text):
            out.extend(_expand_one(item))
            if len(out) > MAX_EXPANDED:  # each item was bounded, their sum was not (30 items: 3 million names)
                raise ValueError(f"more than {MAX_EXPANDED:,} names")
    except ValueError as e:
        raise AdapterError("slurm", f"hostlist {hostlist[:80]!r}: {e}") from None
    return tuple(out)
