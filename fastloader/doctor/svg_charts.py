"""Inline SVG charts for the doctor report: horizontal bars, lines over time, a heatmap.

Generated in Python as strings so the report is one self-contained file: no JavaScript, no chart
library, nothing fetched when it is opened. Every chart takes already-cleaned numbers (see ``num``)
and draws "no data" in its place when there is nothing to plot, so a half-filled result never
raises. Every text that reaches the SVG goes through ``html.escape``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

BLUE = "#2563eb"
ORANGE = "#ea580c"
TEAL = "#0d9488"
PURPLE = "#7c3aed"
RED = "#dc2626"
GREY = "#94a3b8"
INK = "#1e293b"
MUTED = "#64748b"
GRID = "#e2e8f0"

# Heat scale for CPU busy percent: pale when idle, red when saturated, so a wall of red reads as
# "every core is busy" at a glance.
# (ColorBrewer's YlOrRd: one direction of hue, so no percent reads as "less" than a lower one.)
_HEAT_STOPS = (
    (0.0, (248, 250, 252)),
    (0.25, (254, 217, 118)),
    (0.5, (253, 141, 60)),
    (0.75, (227, 26, 28)),
    (1.0, (128, 0, 38)),
)

# Lines beyond this many points are thinned: a timeline of a long run would otherwise make the page
# megabytes of circles while adding nothing visible at 500 px.
MAX_LINE_POINTS = 600
MAX_HEAT_COLUMNS = 120
MAX_HEAT_CELLS = 12_000  # a 256-core machine gets fewer, wider time bins rather than a 3 MB page


def num(value: object) -> float | None:
    """A finite float, or None for anything else (None, bools, strings, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def fmt(value: float | None) -> str:
    """A number for a label: about three significant digits, thousands separated, "—" for None."""
    if value is None:
        return "—"
    a = abs(value)
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a == 0:
        return "0"
    if a >= 0.01:
        return f"{value:.2f}"
    return f"{value:.3g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]; a degenerate range (one value, all zeros) is widened."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = (0.0, hi + pad) if lo >= 0 and lo - pad < 0 else (lo - pad, hi + pad)
    raw = (hi - lo) / count
    if not math.isfinite(raw) or raw <= 0:  # a span past float range (1e308 - -1e308): no round steps exist
        return [lo, hi]
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def _tick_label(value: float, ticks: Sequence[float]) -> str:
    # The fewest decimals that still tell every tick apart exactly (0.25 needs two, 2,000 none).
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    decimals = next((d for d in range(7) if all(abs(round(t, d) - t) < step * 1e-6 for t in ticks)), 6)
    return f"{value:,.{decimals}f}"


def _open(kind: str, title: str, width: int, height: int, extra_class: str = "") -> str:
    cls = f"chart {extra_class}".strip()
    return (
        f'<svg class="{cls}" data-chart="{escape(kind)}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}">'
        f'<text x="12" y="22" class="chart-title">{escape(title)}</text>'
    )


def no_data(kind: str, title: str, width: int = 520, height: int = 160, why: str = "no data") -> str:
    """The chart's frame with a "no data" note in place of the plot, same attributes as a real chart."""
    return (
        _open(kind, title, width, height, "no-data")
        + f'<rect x="12" y="36" width="{width - 24}" height="{height - 48}" fill="#f8fafc" stroke="{GRID}" rx="6"/>'
        + f'<text x="{width / 2:.0f}" y="{height / 2 + 12:.0f}" text-anchor="middle" class="no-data-text">'
        + f"{escape(why)}</text></svg>"
    )


@dataclass(frozen=True)
class _Scale:
    """Linear map from a data domain onto a pixel range."""

    d0: float
    d1: float
    p0: float
    p1: float

    def __call__(self, v: float) -> float:
        span = self.d1 - self.d0
        return self.p0 + (v - self.d0) / span * (self.p1 - self.p0) if span else (self.p0 + self.p1) / 2


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    tooltip: str
    highlight: bool = False


def hbar_chart(kind: str, title: str, bars: Sequence[Bar], *, unit: str, axis_label: str, width: int = 1040) -> str:
    """Horizontal bars with value labels; highlighted bars are red and marked, the rest blue."""
    if not bars:
        return no_data(kind, title, width)
    left, right, top, bar_h, gap = 150, 150, 40, 24, 8
    plot_bottom = top + len(bars) * (bar_h + gap)
    height = plot_bottom + 46
    ticks = nice_ticks(0.0, max(max(b.value for b in bars), 0.0))
    x = _Scale(ticks[0], ticks[-1], left, width - right)
    out = [_open(kind, title, width, height)]
    for t in ticks:
        px = x(t)
        out.append(f'<line x1="{px:.1f}" y1="{top - 4}" x2="{px:.1f}" y2="{plot_bottom}" stroke="{GRID}"/>')
        out.append(
            f'<text x="{px:.1f}" y="{plot_bottom + 16}" text-anchor="middle" class="tick">'
            f"{escape(_tick_label(t, ticks))}</text>"
        )
    out.append(
        f'<text x="{(left + width - right) / 2:.0f}" y="{plot_bottom + 36}" text-anchor="middle" class="axis-label">'
        f"{escape(axis_label)}</text>"
    )
    for i, bar in enumerate(bars):
        y = top + i * (bar_h + gap)
        w = max(x(bar.value) - x(0.0), 0.0)
        color = RED if bar.highlight else BLUE
        weight = ' font-weight="700"' if bar.highlight else ""
        out.append(
            f'<text x="{left - 10}" y="{y + bar_h / 2 + 5:.0f}" text-anchor="end" class="bar-label"{weight}>'
            f"{escape(bar.label)}</text>"
        )
        # A zero-width bar still gets a hover target the height of the row.
        out.append(
            f'<rect x="{left}" y="{y}" width="{max(w, 2):.1f}" height="{bar_h}" fill="{color}" rx="3">'
            f"<title>{escape(bar.tooltip)}</title></rect>"
        )
        note = f"{fmt(bar.value)} {unit}" + ("  ◀ bottleneck" if bar.highlight else "")
        out.append(
            f'<text x="{left + w + 6:.1f}" y="{y + bar_h / 2 + 5:.0f}" class="value" fill="{color}"{weight}>'
            f"{escape(note)}</text>"
        )
    out.append(f'<line x1="{left}" y1="{top - 4}" x2="{left}" y2="{plot_bottom}" stroke="{MUTED}"/>')
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Series:
    """One line: ``points`` are (x, y); a None y breaks the line there."""

    name: str
    color: str
    points: Sequence[tuple[float, float | None]]


def _thin(points: Sequence[tuple[float, float | None]]) -> Sequence[tuple[float, float | None]]:
    if len(points) <= MAX_LINE_POINTS:
        return points
    stride = math.ceil(len(points) / MAX_LINE_POINTS)
    return [*points[::stride], points[-1]]


def line_chart(
    kind: str,
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    y_unit: str,
    y_max: float | None = None,
    reference: tuple[float, str] | None = None,
    width: int = 520,
    height: int = 260,
) -> str:
    """Lines over x with a dot (and tooltip) per point; ``y_max`` fixes the top (100 for percents)."""
    series = [Series(s.name, s.color, _thin(sorted(s.points, key=lambda p: p[0]))) for s in series]
    ys = [y for s in series for _, y in s.points if y is not None]
    if not ys:
        return no_data(kind, title, width, height)
    xs = [x for s in series for x, y in s.points if y is not None]
    left, right, top, bottom = 62, 16, 46, 44
    x_ticks = nice_ticks(min(xs), max(xs))
    y_hi = y_max if y_max is not None else max(max(ys), reference[0] if reference else 0.0)
    y_ticks = nice_ticks(min(0.0, min(ys)), y_hi)
    sx = _Scale(min(xs), max(xs), left, width - right) if max(xs) > min(xs) else _Scale(0, 0, left, width - right)
    x_ticks = [t for t in x_ticks if min(xs) <= t <= max(xs)] or [xs[0]]
    sy = _Scale(y_ticks[0], y_ticks[-1], height - bottom, top)
    out = [_open(kind, title, width, height)]
    for t in y_ticks:
        py = sy(t)
        out.append(f'<line x1="{left}" y1="{py:.1f}" x2="{width - right}" y2="{py:.1f}" stroke="{GRID}"/>')
        out.append(
            f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end" class="tick">'
            f"{escape(_tick_label(t, y_ticks))}</text>"
        )
    for t in x_ticks:
        px = sx(t)
        out.append(
            f'<line x1="{px:.1f}" y1="{height - bottom}" x2="{px:.1f}" y2="{height - bottom + 4}" stroke="{MUTED}"/>'
        )
        out.append(
            f'<text x="{px:.1f}" y="{height - bottom + 16}" text-anchor="middle" class="tick">'
            f"{escape(_tick_label(t, x_ticks) if len(x_ticks) > 1 else fmt(t))}</text>"
        )
    out.append(
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="{MUTED}"/>'
    )
    out.append(
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" text-anchor="middle" class="axis-label">'
        f"{escape(x_label)}</text>"
    )
    out.append(
        f'<text transform="translate(14 {(top + height - bottom) / 2:.0f}) rotate(-90)" text-anchor="middle" '
        f'class="axis-label">{escape(y_label)}</text>'
    )
    if reference is not None:
        py = sy(reference[0])
        out.append(
            f'<line x1="{left}" y1="{py:.1f}" x2="{width - right}" y2="{py:.1f}" stroke="{MUTED}" '
            f'stroke-dasharray="5 4"><title>{escape(reference[1])}</title></line>'
        )
        out.append(
            # A white halo keeps the label readable where the data line crosses it.
            f'<text x="{width - right - 4}" y="{py - 5:.1f}" text-anchor="end" class="tick" '
            'paint-order="stroke" stroke="#fff" stroke-width="3">'
            f"{escape(reference[1])}</text>"
        )
    legend_x = width - right
    for s in reversed(series if len(series) > 1 else []):  # right-aligned legend; one line needs none
        legend_x -= 14 + 7 * len(s.name)
        out.append(f'<rect x="{legend_x}" y="30" width="10" height="10" fill="{s.color}" rx="2"/>')
        out.append(f'<text x="{legend_x + 14}" y="39" class="legend">{escape(s.name)}</text>')
        legend_x -= 10
    for s in series:
        out.append(_polyline(s, sx, sy, y_unit, x_label))
    out.append("</svg>")
    return "".join(out)


def _polyline(s: Series, sx: _Scale, sy: _Scale, y_unit: str, x_label: str) -> str:
    out: list[str] = []
    run: list[str] = []
    few = len(s.points) <= 80
    x_name = x_label.split(" (")[0]

    def flush() -> None:
        if len(run) > 1:
            out.append(
                f'<polyline points="{" ".join(run)}" fill="none" stroke="{s.color}" stroke-width="2" '
                'stroke-linejoin="round"/>'
            )
        run.clear()

    dots: list[str] = []
    for x, y in s.points:
        if y is None:
            flush()
            continue
        px, py = sx(x), sy(y)
        run.append(f"{px:.1f},{py:.1f}")
        # Few points: visible dots. Many: invisible hover targets, so the tooltip still works.
        style = f'r="3" fill="{s.color}"' if few else 'r="4" fill="transparent" pointer-events="all"'
        tip = f"{s.name}: {fmt(y)} {y_unit} at {x_name} {fmt(x)}"
        dots.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" {style}><title>{escape(tip)}</title></circle>')
    flush()
    return "".join(out + dots)


def heat_color(percent: float) -> str:
    f = min(max(percent / 100.0, 0.0), 1.0)
    for (f0, c0), (f1, c1) in zip(_HEAT_STOPS, _HEAT_STOPS[1:]):
        if f <= f1:
            k = (f - f0) / (f1 - f0)
            r, g, b = (round(a + (b - a) * k) for a, b in zip(c0, c1))
            return f"#{r:02x}{g:02x}{b:02x}"
    return "#800026"


def heatmap_chart(
    kind: str,
    title: str,
    samples: Sequence[tuple[float, Sequence[float | None]]],
    means: Sequence[float | None],
    *,
    width: int = 1040,
) -> str:
    """Cores (rows) x time (columns) coloured by busy percent, with each core's mean as a bar on the right.

    Samples are averaged into at most ``MAX_HEAT_COLUMNS`` time bins: a heatmap cell per sample of a
    long run on 128 cores would be tens of thousands of rects.
    """
    rows = max([len(v) for _, v in samples] + [len(means)], default=0)
    if not any(v is not None for _, values in samples for v in values) and not any(m is not None for m in means):
        return no_data(kind, title, width)
    left, right, top = 70, 180, 46
    row_h = min(max(240 / rows, 3.0), 18.0)
    plot_h = rows * row_h
    height = int(top + plot_h + 70)
    plot_r = width - right
    out = [_open(kind, title, width, height)]
    ts = [t for t, _ in samples]
    if samples:
        t0, t1 = min(ts), max(ts)
        ncols = max(1, min(len(samples), MAX_HEAT_COLUMNS, MAX_HEAT_CELLS // rows))
        sums = [[0.0] * rows for _ in range(ncols)]
        counts = [[0] * rows for _ in range(ncols)]
        for t, values in samples:
            col = min(int((t - t0) / (t1 - t0) * ncols), ncols - 1) if t1 > t0 else 0
            for r, v in enumerate(values):
                if v is not None:
                    sums[col][r] += v
                    counts[col][r] += 1
        cell_w = (plot_r - left) / ncols
        for c in range(ncols):
            c_t0 = t0 + (t1 - t0) * c / ncols
            c_t1 = t0 + (t1 - t0) * (c + 1) / ncols
            for r in range(rows):
                if not counts[c][r]:
                    continue
                v = sums[c][r] / counts[c][r]
                tip = f"core {r}, t {fmt(c_t0)}–{fmt(c_t1)} s: {fmt(v)}% busy"
                out.append(
                    f'<rect x="{left + c * cell_w:.1f}" y="{top + r * row_h:.1f}" width="{cell_w + 0.3:.1f}" '
                    f'height="{row_h + 0.3:.1f}" fill="{heat_color(v)}"><title>{escape(tip)}</title></rect>'
                )
        x_ticks = [t for t in nice_ticks(t0, t1) if t0 <= t <= t1] if t1 > t0 else [t0]
        sx = _Scale(t0, t1, left, plot_r)
        for t in x_ticks:
            px = sx(t)
            out.append(
                f'<text x="{px:.1f}" y="{top + plot_h + 16:.0f}" text-anchor="middle" class="tick">'
                f"{escape(_tick_label(t, x_ticks) if len(x_ticks) > 1 else fmt(t))}</text>"
            )
    else:
        out.append(
            f'<text x="{(left + plot_r) / 2:.0f}" y="{top + plot_h / 2 + 5:.0f}" text-anchor="middle" '
            'class="no-data-text">no timeline</text>'
        )
    out.append(
        f'<rect x="{left}" y="{top}" width="{plot_r - left}" height="{plot_h:.1f}" fill="none" stroke="{GRID}"/>'
    )
    out.append(
        f'<text x="{(left + plot_r) / 2:.0f}" y="{top + plot_h + 36:.0f}" text-anchor="middle" class="axis-label">'
        "time (s)</text>"
    )
    label_every = math.ceil(12 / row_h)  # no row label closer than 12 px to the next
    bar_l, bar_w = plot_r + 14, right - 60
    for r in range(rows):
        y = top + r * row_h
        if r % label_every == 0:
            out.append(
                f'<text x="{left - 6}" y="{y + row_h / 2 + 4:.1f}" text-anchor="end" class="tick">core {r}</text>'
            )
        mean = means[r] if r < len(means) else None
        if mean is not None:
            w = min(max(mean, 0.0), 100.0) / 100 * bar_w
            out.append(
                f'<rect x="{bar_l}" y="{y + row_h * 0.15:.1f}" width="{max(w, 1):.1f}" height="{row_h * 0.7:.1f}" '
                f'fill="{heat_color(mean)}"><title>core {r}: {escape(fmt(mean))}% busy on average</title></rect>'
            )
            if r % label_every == 0:
                out.append(
                    f'<text x="{bar_l + w + 4:.1f}" y="{y + row_h / 2 + 4:.1f}" class="tick">'
                    f"{escape(fmt(mean))}%</text>"
                )
    out.append(f'<text x="{bar_l}" y="{top - 6}" class="legend">mean per core (%)</text>')
    # Legend: five swatches of the heat scale.
    lx = left
    ly = top + plot_h + 46
    out.append(f'<text x="{lx}" y="{ly + 10:.0f}" class="legend">busy %</text>')
    for i, p in enumerate((0, 25, 50, 75, 100)):
        x0 = lx + 52 + i * 58
        out.append(f'<rect x="{x0}" y="{ly:.0f}" width="14" height="12" fill="{heat_color(p)}" stroke="{GRID}"/>')
        out.append(f'<text x="{x0 + 18}" y="{ly + 10:.0f}" class="legend">{p}</text>')
    out.append("</svg>")
    return "".join(out)
