"""Inline SVG line charts of time series (no JavaScript, no external assets).

Contract: pure; returns an ``<svg>`` element as text with every label
HTML-escaped. Points with a ``None`` value are skipped (the line breaks).
Bands (e.g. the windows a monitor alerted on) are shaded spans of x, clipped to
the plotted range, with their label in a tooltip and above the plot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
Point = tuple[int, float | None]  # (epoch ms, value)
Band = tuple[int, int, str]  # (start ms, end ms, label)
BAND_FILL = "#c62828"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 × 10ⁿ)."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def _time_label(ms: int, span_ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%m-%d %H:%M" if span_ms > 86_400_000 else "%H:%M")


def line_chart(title: str, series: Mapping[str, Sequence[Point]], fmt: Callable[[float], str],
               width: int = 720, height: int = 260, bands: Sequence[Band] = ()) -> str:
    """A chart with one coloured line per series, time on x (UTC), ``fmt`` on y, ``bands`` shaded."""
    left, right, top, bottom = 78, 150, 30, 36
    pts = [(x, y) for s in series.values() for x, y in s if y is not None and math.isfinite(y)]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="system-ui,sans-serif" role="img" '
           f'aria-label="{escape(title)}">',
           f'<text x="{left}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>']
    if not pts:
        out.append(f'<text x="{left}" y="{height // 2}" font-size="12" fill="#666">no data</text></svg>')
        return "".join(out)
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    yticks = nice_ticks(min(p[1] for p in pts), max(p[1] for p in pts))
    y0, y1 = yticks[0], yticks[-1]
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>')
    out.extend(_band(b, sx, x0, x1, top, ph) for b in bands)
    for t in yticks:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" font-size="11" text-anchor="end">{escape(fmt(t))}</text>')
    for i in range(6):
        x = x0 + (x1 - x0) * i / 5
        out.append(f'<text x="{sx(x):.1f}" y="{top + ph + 16}" font-size="11" text-anchor="middle">'
                   f'{escape(_time_label(int(x), x1 - x0))}</text>')
    for i, (name, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        seg: list[str] = []
        for x, y in sorted(s, key=lambda p: p[0]):
            if y is None or not math.isfinite(y):
                out.append(_polyline(seg, color))
                seg = []
                continue
            seg.append(f"{sx(x):.1f},{sy(y):.1f}")
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}">'
                       f'<title>{escape(name)} {escape(_time_label(x, 0))} UTC: {escape(fmt(y))}</title></circle>')
        out.append(_polyline(seg, color))
        ly = top + 14 + i * 18
        out.append(f'<rect x="{left + pw + 12}" y="{ly - 9}" width="12" height="12" fill="{color}"/>'
                   f'<text x="{left + pw + 30}" y="{ly + 1}" font-size="12">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _polyline(seg: list[str], color: str) -> str:
    if len(seg) < 2:
        return ""
    return f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="1.8"/>'


def _band(band: Band, sx: Callable[[float], float], x0: float, x1: float, top: int, ph: int) -> str:
    start, end, label = band
    lo, hi = max(float(start), x0), min(float(end), x1)
    if hi < lo:
        return ""
    a, b = sx(lo), max(sx(hi), sx(lo) + 3)
    return (f'<rect x="{a:.1f}" y="{top}" width="{b - a:.1f}" height="{ph}" fill="{BAND_FILL}" fill-opacity="0.10" '
            f'stroke="{BAND_FILL}" stroke-opacity="0.5" stroke-dasharray="3,2"><title>{escape(label)}</title></rect>'
            f'<text x="{a + 3:.1f}" y="{top + 12}" font-size="10" fill="{BAND_FILL}">{escape(label)}</text>')
