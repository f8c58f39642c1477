"""The doctor's result as one self-contained HTML page (``fastloader doctor PATH --report report.html``).

One file a person can open anywhere, mail, or attach to an issue: inline CSS, charts as inline SVG
drawn here in Python, no JavaScript, nothing fetched from the network. The result dict comes from a
measurement that may have been cut short, so every key may be missing and every number may be None:
each part of the page shows "—" or "no data" instead of raising. Every string taken from the result
is escaped (dataset paths may hold ``<`` or ``&``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from fastloader.doctor.svg_charts import (
    BLUE,
    ORANGE,
    PURPLE,
    Bar,
    Series,
    fmt,
    hbar_chart,
    heatmap_chart,
    line_chart,
    num,
)
from fastloader.storage import write_report_bytes

__all__ = ["render_report", "write_report"]

STAGE_ORDER = ("read", "decode", "transform", "collate", "handoff", "pin", "h2d", "wait", "step")

# verdict level -> CSS class; anything else (a level added later, a typo) gets the neutral grey box.
LEVEL_CLASS = {"not input-bound": "ok", "moderately input-bound": "warn", "highly input-bound": "bad"}

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f1f5f9; color: #1e293b; line-height: 1.45;
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 20px 40px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 10px; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 0.92em;
       background: #e2e8f0; padding: 1px 5px; border-radius: 4px; overflow-wrap: anywhere; }
.meta { display: flex; flex-wrap: wrap; gap: 6px 22px; color: #475569; margin: 6px 0; }
.meta b { color: #1e293b; font-weight: 600; }
.chips { display: flex; flex-wrap: wrap; gap: 6px; margin: 8px 0 0; }
.chip { background: #fff; border: 1px solid #cbd5e1; border-radius: 999px; padding: 1px 10px; font-size: 13px; }
.verdict { margin: 20px 0; padding: 18px 22px; border-radius: 10px; border: 2px solid; background: #fff; }
.verdict.ok { border-color: #16a34a; background: #f0fdf4; } .verdict.ok .level { color: #15803d; }
.verdict.warn { border-color: #d97706; background: #fffbeb; } .verdict.warn .level { color: #b45309; }
.verdict.bad { border-color: #dc2626; background: #fef2f2; } .verdict.bad .level { color: #b91c1c; }
.verdict.unknown { border-color: #94a3b8; } .verdict.unknown .level { color: #475569; }
.verdict .top { display: flex; flex-wrap: wrap; align-items: baseline; gap: 8px 28px; }
.verdict .level { font-size: 26px; font-weight: 800; text-transform: uppercase; letter-spacing: 0.02em; }
.verdict .big { font-size: 22px; font-weight: 700; }
.verdict .summary { font-size: 16px; margin: 10px 0 6px; }
.verdict ul { margin: 6px 0 0; padding-left: 22px; } .verdict li { margin: 3px 0; }
.stats { display: flex; flex-wrap: wrap; gap: 10px; margin-top: 14px; }
.stat { background: #fff; border: 1px solid #e2e8f0; border-radius: 8px; padding: 6px 12px; min-width: 120px; }
.stat .v { font-size: 18px; font-weight: 700; } .stat .k { font-size: 12px; color: #64748b; }
.trap { background: #fffbeb; border-left: 5px solid #f59e0b; border-radius: 6px; padding: 10px 14px; margin: 8px 0; }
.trap .name { font-weight: 700; color: #92400e; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 16px; }
.card { background: #fff; border: 1px solid #e2e8f0; border-radius: 10px; padding: 8px; }
.card.wide { grid-column: 1 / -1; }
svg.chart { display: block; width: 100%; height: auto; font-family: inherit; }
svg .chart-title { font-size: 15px; font-weight: 700; fill: #1e293b; }
svg .tick, svg .legend { font-size: 11px; fill: #475569; }
svg .axis-label { font-size: 12px; fill: #334155; }
svg .bar-label { font-size: 13px; fill: #1e293b; } svg .value { font-size: 12px; }
svg .no-data-text { font-size: 15px; fill: #94a3b8; font-style: italic; }
table { border-collapse: collapse; background: #fff; border: 1px solid #e2e8f0; border-radius: 8px;
        font-size: 14px; margin-bottom: 8px; }
th, td { padding: 5px 12px; border-bottom: 1px solid #e2e8f0; text-align: left; }
th { background: #f8fafc; font-weight: 600; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.hl td { background: #fef2f2; font-weight: 600; }
.muted { color: #64748b; } footer { margin-top: 30px; font-size: 12px; color: #94a3b8; }
"""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _text(value: object) -> str:
    """Any value as escaped text; None (a measurement that did not happen) as a dash."""
    return "—" if value is None else escape(str(value))


def _bytes(value: object) -> str:
    n = num(value)
    if n is None:
        return _text(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _cell(key: str, value: object) -> str:
    """A table cell: bytes in kB/MB/GB, bools as yes/no, numbers right-aligned."""
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if key == "bytes" or key.endswith("_bytes"):
        return f'<td class="n">{_bytes(value)}</td>'
    if isinstance(value, int):
        return f'<td class="n">{value:,}</td>'
    if num(value) is not None:
        return f'<td class="n">{fmt(num(value))}</td>'
    return f"<td>{_text(value)}</td>"


def _count(value: object) -> str:
    """Counts stay integers ("47 batches", not "47.0"); other numbers get ``fmt``."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else fmt(num(value))


def _percent(fraction: object) -> str:
    f = num(fraction)
    return "—" if f is None else f"{f * 100:.0f}%"


def _ordered_stages(stages: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Known stages in pipeline order, then any the doctor adds later, in the order it gave them."""
    names = [s for s in STAGE_ORDER if s in stages] + [s for s in stages if s not in STAGE_ORDER]
    return [(str(name), _map(stages[name])) for name in names if isinstance(stages[name], Mapping)]


def _header(result: Mapping[str, Any]) -> str:
    dataset, config = _map(result.get("dataset")), _map(result.get("config"))
    images = dataset.get("images")  # may be None or text ("unknown") in a partial result
    chips = "".join(f'<span class="chip">{_text(k)} = {_text(v)}</span>' for k, v in config.items())
    return (
        f"<header><h1>fastloader doctor: <code>{_text(dataset.get('path'))}</code></h1>"
        f'<div class="meta"><span>format <b>{_text(dataset.get("format"))}</b></span>'
        f"<span>images <b>{_count(images) if num(images) is not None else _text(images)}</b></span>"
        f"<span>fastloader <b>{_text(result.get('fastloader_version'))}</b></span>"
        f"<span>measured <b>{_text(result.get('created'))}</b></span>{_bad_samples(result)}</div>"
        f'<div class="chips">{chips or "<span class=muted>no config recorded</span>"}</div></header>'
    )


def _bad_samples(result: Mapping[str, Any]) -> str:
    """The bad samples replaced during the measurement: their count, the first few named on hover."""
    count = num(result.get("bad_samples"))
    if not count:
        return ""
    examples = "\n".join(str(example) for example in _list(result.get("bad_examples")))
    return f'<span title="{_text(examples)}">bad samples (replaced) <b>{_count(result.get("bad_samples"))}</b></span>'


def _verdict(result: Mapping[str, Any]) -> str:
    verdict, throughput = _map(result.get("verdict")), _map(result.get("throughput"))
    level = verdict.get("level")
    css = LEVEL_CLASS.get(str(level).strip().lower(), "unknown")
    wait = verdict.get("wait_fraction")
    wait = throughput.get("wait_fraction") if wait is None else wait
    # Without a training step the loop only waits: its wait says nothing, the loader's rate does.
    loader_only = str(level).startswith("loader only")
    waits = (
        f'<span class="big">{_percent(wait)} <span class="muted">of the time the training loop waits</span></span>'
        if not loader_only
        else f'<span class="big">{fmt(num(throughput.get("images_per_s")))} <span class="muted">images/s from the'
        " loader alone</span></span>"
    )
    advice = "".join(f"<li>{_text(a)}</li>" for a in _list(verdict.get("advice")))
    stats = [
        ("images/s", fmt(num(throughput.get("images_per_s")))),
        ("images", _count(throughput.get("images"))),
        ("batches", _count(throughput.get("batches"))),
        ("seconds measured", fmt(num(throughput.get("seconds")))),
    ]
    stat_html = "".join(f'<div class="stat"><div class="v">{v}</div><div class="k">{k}</div></div>' for k, v in stats)
    return (
        f'<section class="verdict {css}" id="verdict"><div class="top">'
        f'<span class="level">{_text(level) if level is not None else "no verdict"}</span>'
        f"{waits}"
        f'<span class="big"><span class="muted">bottleneck</span> {_text(verdict.get("bottleneck"))}</span></div>'
        f'<p class="summary">{_text(verdict.get("summary")) if verdict.get("summary") is not None else ""}</p>'
        f"{f'<b>What to do</b><ul>{advice}</ul>' if advice else ''}"
        f'<div class="stats">{stat_html}</div></section>'
    )


def _traps(result: Mapping[str, Any]) -> str:
    traps = _list(result.get("traps"))
    if not traps:
        return ""
    items = []
    for trap in traps:
        t = _map(trap) if isinstance(trap, Mapping) else {"message": trap}
        fix = f"<div>fix: <code>{_text(t.get('fix'))}</code></div>" if t.get("fix") is not None else ""
        items.append(
            f'<div class="trap"><span class="name">⚠ {_text(t.get("name", "environment trap"))}</span> '
            f"{_text(t.get('message'))}{fix}</div>"
        )
    return f"<h2>Environment traps</h2>{''.join(items)}"


def _stage_chart(result: Mapping[str, Any]) -> str:
    bottleneck = _map(result.get("verdict")).get("bottleneck")
    bars = []
    for name, stage in _ordered_stages(_map(result.get("stages"))):
        ms = num(stage.get("per_image_ms"))
        if ms is None:
            continue
        pct = _map(stage.get("per_batch_ms"))
        tip = (
            f"{name} ({stage.get('where', '?')}): {fmt(ms)} ms/image, total {fmt(num(stage.get('total_s')))} s, "
            f"per batch p50 {fmt(num(pct.get('p50')))} / p90 {fmt(num(pct.get('p90')))} / "
            f"p99 {fmt(num(pct.get('p99')))} ms"
        )
        label = f"{name} ({stage['where']})" if stage.get("where") else name
        bars.append(Bar(label, ms, tip, highlight=name == bottleneck))
    return hbar_chart("stages", "Time per image, by stage", bars, unit="ms", axis_label="milliseconds per image")


def _timeline_points(timeline: Sequence[Any], key: str) -> list[tuple[float, float | None]]:
    points = []
    for sample in timeline:
        s = _map(sample)
        t = num(s.get("t"))
        if t is not None:
            points.append((t, num(s.get(key))))
    return points


def _charts(result: Mapping[str, Any]) -> str:
    timeline = _list(result.get("timeline"))
    mean_ips = num(_map(result.get("throughput")).get("images_per_s"))
    throughput = line_chart(
        "throughput",
        "Throughput over time",
        [Series("images/s", BLUE, _timeline_points(timeline, "images_per_s"))],
        x_label="time (s)",
        y_label="images / s",
        y_unit="images/s",
        reference=(mean_ips, f"mean {fmt(mean_ips)} images/s") if mean_ips is not None else None,
    )
    queues = line_chart(
        "queues",
        "Queue depth over time",
        [
            Series("prefetch queue", BLUE, _timeline_points(timeline, "prefetch_queue")),
            Series("worker queue", ORANGE, _timeline_points(timeline, "worker_queue")),
        ],
        x_label="time (s)",
        y_label="batches queued",
        y_unit="batches",
    )
    cards = [f'<div class="card wide">{_stage_chart(result)}</div>', f'<div class="card">{throughput}</div>']
    cards += [f'<div class="card">{queues}</div>', f'<div class="card wide">{_cpu_chart(result)}</div>']
    gpu = result.get("gpu")
    if gpu is not None:
        g = _map(gpu)
        mean = num(g.get("utilization_percent_mean"))
        title = f"GPU utilisation ({g.get('name') or 'GPU'}, mean {fmt(mean)}%)"
        chart = line_chart(
            "gpu",
            title,
            [Series("utilisation", PURPLE, _timeline_points(_list(g.get("timeline")), "utilization_percent"))],
            x_label="time (s)",
            y_label="utilisation (%)",
            y_unit="%",
            y_max=100.0,
            width=1040,
        )
        cards.append(f'<div class="card wide">{chart}</div>')
    return f'<h2>Where the time goes</h2><div class="charts">{"".join(cards)}</div>'


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _cpu_chart(result: Mapping[str, Any]) -> str:
    cpu = _map(result.get("cpu"))
    samples = []
    for sample in _list(cpu.get("timeline")):
        s = _map(sample)
        t = num(s.get("t"))
        if t is not None:
            samples.append((t, [num(v) for v in _list(s.get("per_core"))]))
    means = [num(v) for v in _list(cpu.get("per_core_percent_mean"))]
    if not means and samples:  # an older or partial result: the means follow from the timeline
        rows = max(len(v) for _, v in samples)
        means = [_mean([v[r] for _, v in samples if r < len(v)]) for r in range(rows)]
    return heatmap_chart("cpu", "CPU busy per core over time", samples, means)


def _table(head: Sequence[str], rows: Sequence[str]) -> str:
    if not rows:
        return '<p class="muted">no data</p>'
    return f"<table><tr>{''.join(f'<th>{escape(h)}</th>' for h in head)}</tr>{''.join(rows)}</table>"


def _tables(result: Mapping[str, Any]) -> str:
    bottleneck = _map(result.get("verdict")).get("bottleneck")
    stage_rows = []
    for name, stage in _ordered_stages(_map(result.get("stages"))):
        pct = _map(stage.get("per_batch_ms"))
        cells = [_cell("", stage.get("total_s")), _cell("", stage.get("per_image_ms"))]
        cells += [_cell("", pct.get(p)) for p in ("p50", "p90", "p99")]
        hl = ' class="hl"' if name == bottleneck else ""
        stage_rows.append(f"<tr{hl}><td>{_text(name)}</td><td>{_text(stage.get('where'))}</td>{''.join(cells)}</tr>")
    storage_rows = []
    for name, run in _map(result.get("storage")).items():
        r = _map(run)
        row = "".join(_cell(k, r.get(k)) for k in ("mb_per_s", "files_per_s", "files", "bytes", "seconds"))
        storage_rows.append(f"<tr><td>{_text(name)}</td>{row}</tr>")
    env_rows = [f"<tr><th>{_text(k)}</th>{_cell(str(k), v)}</tr>" for k, v in _map(result.get("environment")).items()]
    cpu = _map(result.get("cpu"))
    for key, label in (("rss_bytes", "process RSS"), ("memory_percent", "memory used (%)")):
        if key in cpu:
            env_rows.append(f"<tr><th>{label}</th>{_cell(key, cpu[key])}</tr>")
    stage_head = ["stage", "where", "total (s)", "per image (ms)", "p50 batch (ms)", "p90 batch (ms)", "p99 batch (ms)"]
    return (
        f"<h2>Stages</h2>{_table(stage_head, stage_rows)}"
        f"<h2>Storage</h2>{_table(['access', 'MB/s', 'files/s', 'files', 'bytes', 'seconds'], storage_rows)}"
        f"<h2>Environment</h2>{_table(['setting', 'value'], env_rows)}"
    )


def render_report(result: Mapping[str, Any]) -> str:
    """The whole report page as HTML text; never raises on missing keys or None numbers."""
    result = _map(result)  # a result that is not even a dict (JSON "null") still renders an empty page
    path = _map(result.get("dataset")).get("path")
    title = f"fastloader doctor: {path}" if path is not None else "fastloader doctor"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
        f"{_header(result)}{_verdict(result)}{_traps(result)}{_charts(result)}{_tables(result)}"
        "<footer>Generated by <code>fastloader doctor</code>. Self-contained: no scripts, nothing loaded "
        "from the network. Hover a bar or point for its exact value.</footer></main></body></html>\n"
    )


def write_report(result: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the page to ``path`` atomically: a reader never sees half a report, a failed write leaves the
    old one (a symlink's target is written, a FIFO or ``/dev/null`` in place: see ``write_report_bytes``)."""
    text = render_report(result)  # before touching the disk: a render error leaves no temporary file
    write_report_bytes(path, text.encode("utf-8"))
