"""Server-side SVG charts (pure): nothing runs in the browser and nothing is fetched. Each chart
has a <title> and <desc> (its text alternative); the pages also show the same numbers as a table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

W, H = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 48, 16, 16, 40
BAR = "#1f4e79"  # contrast 9.6:1 on white
LINE = "#8a3b00"  # contrast 7.3:1 on white
GRID = "#8c8c8c"
TEXT = "#1a1a1a"


def _head(chart_id: str, title: str, desc: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc" id="{chart_id}">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        f'<desc id="{chart_id}-desc">{escape(desc)}</desc>',
    ]


def _y_axis(top: float, label: str) -> list[str]:
    """Grid lines and labels for 0..top (whole numbers)."""
    out = []
    step = max(1, math.ceil(top / 5))
    v = 0
    while v <= top + 1e-9:
        y = TOP + (H - TOP - BOTTOM) * (1 - v / top)
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}" stroke-width="0.5"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="12" fill="{TEXT}">{v}</text>')
        v += step
    out.append(
        f'<text x="12" y="{TOP + (H - TOP - BOTTOM) / 2:.0f}" font-size="12" fill="{TEXT}" '
        f'transform="rotate(-90 12 {TOP + (H - TOP - BOTTOM) / 2:.0f})" text-anchor="middle">{escape(label)}</text>'
    )
    return out


def outlook_chart(labels: Sequence[str], lendable: Sequence[int | None], demand: Sequence[float | None], *, nodes: int) -> str:
    """Bars: nodes expected lendable per hour ahead; line: serving demand (replicas)."""
    n = len(labels)
    top = max([nodes, 1] + [math.ceil(d) for d in demand if d is not None])
    known = [(labels[i], v) for i, v in enumerate(lendable) if v is not None]
    desc = (
        "Nodes expected lendable per hour ahead: "
        + ("; ".join(f"{lab} {v}" for lab, v in known) if known else "no hour forecast yet")
        + ". The line is the serving demand the forecast expects, in replicas."
    )
    out = _head("outlook-chart", "Lendable nodes over the next hours", desc)
    out += _y_axis(top, "nodes / replicas")
    pw = (W - LEFT - RIGHT) / max(1, n)
    ph = H - TOP - BOTTOM
    pts = []
    for i in range(n):
        x = LEFT + i * pw
        v = lendable[i]
        if v is None:
            out.append(f'<text x="{x + pw / 2:.1f}" y="{H - BOTTOM - 4}" text-anchor="middle" font-size="11" fill="{TEXT}">?</text>')
        elif v > 0:
            h = ph * v / top
            out.append(f'<rect x="{x + pw * 0.15:.1f}" y="{TOP + ph - h:.1f}" width="{pw * 0.7:.1f}" height="{h:.1f}" fill="{BAR}"/>')
        d = demand[i]
        if d is not None:
            pts.append(f"{x + pw / 2:.1f},{TOP + ph * (1 - min(d, top) / top):.1f}")
        if i % max(1, n // 8) == 0 and x < W - RIGHT - 40:
            out.append(f'<text x="{x + pw / 2:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle" font-size="12" fill="{TEXT}">{escape(labels[i])}</text>')
    if len(pts) > 1:
        out.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{LINE}" stroke-width="2.5" stroke-dasharray="6 3"/>')
    out.append(f'<text x="{W - RIGHT}" y="{H - 6}" text-anchor="end" font-size="12" fill="{TEXT}">hour (UTC)</text>')
    out.append("</svg>")
    return "\n".join(out)


def history_chart(t: Sequence[float], lent: Sequence[float | None], lends: Sequence[float | None], reclaims: Sequence[float | None],
                  *, nodes: int) -> str:
    """Timeline: nodes lent (area), lends (marks above) and reclaims (marks below) per step."""
    n = len(t)
    top = max([nodes, 1] + [math.ceil(v) for v in lent if v is not None])
    n_l = round(sum(v or 0 for v in lends))
    n_r = round(sum(v or 0 for v in reclaims))
    span = f"{datetime.fromtimestamp(t[0], UTC):%Y-%m-%d %H:%M} to {datetime.fromtimestamp(t[-1], UTC):%Y-%m-%d %H:%M} UTC" if n else "no data"
    desc = f"Nodes lent to Slurm over time, {span}: at most {max((v for v in lent if v is not None), default=0):g} at once; {n_l} lends and {n_r} reclaims."
    out = _head("history-chart", "Nodes lent over the last days", desc)
    out += _y_axis(top, "nodes lent")
    pw = (W - LEFT - RIGHT) / max(1, n)
    ph = H - TOP - BOTTOM
    last_day = ""
    for i in range(n):
        x = LEFT + i * pw
        v = lent[i]
        if v is not None and v > 0:
            h = ph * v / top
            out.append(f'<rect x="{x:.1f}" y="{TOP + ph - h:.1f}" width="{pw + 0.3:.1f}" height="{h:.1f}" fill="{BAR}" fill-opacity="0.85"/>')
        if (lends[i] or 0) >= 0.5:
            out.append(f'<rect x="{x:.1f}" y="{TOP - 10}" width="{max(pw, 2):.1f}" height="8" fill="#1b6e20"/>')
        if (reclaims[i] or 0) >= 0.5:
            out.append(f'<rect x="{x:.1f}" y="{H - BOTTOM + 2}" width="{max(pw, 2):.1f}" height="8" fill="{LINE}"/>')
        day = datetime.fromtimestamp(t[i], UTC).strftime("%m-%d %H:%M" if t[-1] - t[0] < 2 * 86400 else "%a %m-%d")
        if i % max(1, n // 6) == 0 and day != last_day and x < W - RIGHT - 80:  # no label cut at the edge
            out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 26}" font-size="12" fill="{TEXT}">{escape(day)}</text>')
            last_day = day
    out.append("</svg>")
    return "\n".join(out)
