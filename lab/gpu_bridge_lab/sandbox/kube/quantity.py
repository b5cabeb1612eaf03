"""Kubernetes resource quantities ("100m", "4", "16Gi", "1e3") as floats, for the scheduler."""

from __future__ import annotations

from typing import Any

_SUFFIX = {
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50, "Ei": 2.0 ** 60,
}


def parse(q: Any) -> float:
    """A quantity as a number; a malformed one raises ValueError naming it."""
    if isinstance(q, (int, float)):
        return float(q)
    s = str(q).strip()
    for suf in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"):
        if s.endswith(suf):
            num = s[: -len(suf)]
            try:
                return float(num) * _SUFFIX[suf]
            except ValueError:
                break
    try:
        return float(s)
    except ValueError:
        raise ValueError(f"quantity: cannot parse {q!r}") from None
