"""The doctor's HTML report: complete, escaped, offline, robust to partial results, and drawn by a real browser."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastloader.doctor import report_html
from fastloader.doctor.report_html import CSS, render_report, write_report
from fastloader.doctor.svg_charts import BLUE, ORANGE, PURPLE, RED, nice_ticks, num
from tests.helpers import run_child

CHROMIUM = "/usr/bin/chromium"
ALL_CHARTS = {"stages", "throughput", "queues", "cpu", "gpu"}
BASE_CHARTS = {"stages", "throughput", "queues", "cpu"}


def stage(per_image_ms: float | None, where: str = "workers") -> dict[str, Any]:
    return {
        "total_s": None if per_image_ms is None else per_image_ms * 2,
        "per_image_ms": per_image_ms,
        "per_batch_ms": {"p50": 9.1, "p90": 12.0, "p99": 15.2},
        "where": where,
    }


def full_result() -> dict[str, Any]:
    return {
        "fastloader_version": "0.3.0",
        "created": "2026-12-01T03:30:00Z",
        "dataset": {"path": "data/sample.lmdb", "format": "lmdb", "images": 2000},
        "config": {"batch_size": 64, "num_workers": 2, "transform": "train", "decode_on": "cpu", "step_ms": 0.0},
        "environment": {
            "usable_cores": 2,
            "cpu_count": 2,
            "cgroup_quota": None,
            "shm_bytes": 12_000_000_000,
            "shm_needed_bytes": 40_000_000,
            "cuda": False,
            "gpu_name": None,
        },
        "traps": [
            {
                "name": "shm_too_small",
                "message": "/dev/shm has 64 MB; the planned batches need 310 MB",
                "fix": "docker run --shm-size=1g",
            }
        ],
        "storage": {
            "sequential": {
                "mb_per_s": 410.2,
                "files_per_s": 3500.1,
                "files": 500,
                "bytes": 58_000_000,
                "seconds": 0.14,
            },
            "random": {"mb_per_s": 390.0, "files_per_s": 3300.0, "files": 500, "bytes": 58_000_000, "seconds": 0.15},
        },
        "stages": {
            "read": stage(0.15),
            "decode": stage(3.1),
            "transform": stage(0.9),
            "collate": stage(0.1),
            "handoff": stage(0.05, "main"),
            "pin": stage(None, "main"),  # not measured (no pinning): no bar, still a table row
            "wait": stage(0.7, "training loop"),
            "step": stage(0.01, "training loop"),
        },
        "throughput": {"images_per_s": 812.3, "batches": 30, "images": 1920, "seconds": 2.36, "wait_fraction": 0.93},
        "timeline": [
            {"t": 0.1 * i, "images_per_s": 600.0 + 20 * i, "prefetch_queue": i % 2, "worker_queue": 3}
            for i in range(20)
        ],
        "cpu": {
            "per_core_percent_mean": [97.1, 95.0],
            "timeline": [{"t": 0.1 * i, "per_core": [90.0 + i % 10, 99.0]} for i in range(20)],
            "rss_bytes": 812_000_000,
            "memory_percent": 3.1,
        },
        "gpu": {
            "name": "NVIDIA H200",
            "utilization_percent_mean": 41.0,
            "timeline": [{"t": 0.1 * i, "utilization_percent": 40.0 + i} for i in range(20)],
        },
        "verdict": {
            "level": "highly input-bound",
            "wait_fraction": 0.93,
            "bottleneck": "decode",
            "summary": "the training loop waits 93% of the time; decode is the slowest stage",
            "advice": ["every core is busy: pack with --resize-max-side 256, or decode_on='cuda'"],
        },
    }


class Page(HTMLParser):
    """The parts of a page the tests look at: each chart svg (its attributes, inner tags, text), all text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, Any]] = {}
        self._chart: dict[str, Any] | None = None
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg":
            self._chart = {"attrs": a, "tags": [], "text": []}
            self.charts[str(a.get("data-chart"))] = self._chart
        elif self._chart is not None:
            self._chart["tags"].append((tag, a))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._chart = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._chart is not None:
            self._chart["text"].append(data)


def chart_text(page: Page, kind: str) -> str:
    return " ".join(page.charts[kind]["text"])


def tags(page: Page, kind: str, name: str) -> list[dict[str, Any]]:
    return [a for t, a in page.charts[kind]["tags"] if t == name]


# -- content -----------------------------------------------------------------------------------------


def test_full_result_renders_header_verdict_traps_and_tables() -> None:
    text = render_report(full_result())
    page = Page(text)
    body = " ".join(page.text)
    assert text.startswith("<!DOCTYPE html>")
    for expected in ("data/sample.lmdb", "lmdb", "2,000", "0.3.0", "2026-12-01T03:30:00Z", "batch_size = 64"):
        assert expected in body
    assert '<section class="verdict bad"' in text
    for expected in ("highly input-bound", "93%", "decode", "every core is busy", "the training loop waits 93%"):
        assert expected in body
    assert "/dev/shm has 64 MB" in body and "docker run --shm-size=1g" in body
    # tables: storage throughput, environment bytes in human units, the stage percentiles
    assert "410" in body and "3,500" in body and "12.0 GB" in body and "812.0 MB" in body and "15.2" in body


def test_every_chart_is_an_svg_with_its_data_chart_attribute_and_tooltips() -> None:
    page = Page(render_report(full_result()))
    assert set(page.charts) == ALL_CHARTS
    for kind, chart in page.charts.items():
        assert chart["attrs"]["class"] == "chart", kind
        assert "no data" not in chart_text(page, kind), kind
        assert len(tags(page, kind, "title")) >= 2, kind  # tooltips on bars / points / cells
    assert len(tags(page, "throughput", "circle")) == 20
    assert len(tags(page, "queues", "polyline")) == 2
    assert len(tags(page, "cpu", "rect")) >= 2 * 20  # two cores x twenty samples
    # axes carry tick labels and units
    assert "time (s)" in chart_text(page, "throughput") and "images / s" in chart_text(page, "throughput")
    assert "milliseconds per image" in chart_text(page, "stages")
    assert "100" in chart_text(page, "gpu")  # a percent axis runs to 100


def test_stage_bars_in_pipeline_order_with_the_bottleneck_highlighted() -> None:
    result = full_result()
    result["stages"] = dict(reversed(list(result["stages"].items())))  # the dict's own order must not matter
    page = Page(render_report(result))
    labels = [t.split(" (")[0] for t in page.charts["stages"]["text"] if " (" in t and "ms" not in t]
    assert labels == ["read", "decode", "transform", "collate", "handoff", "wait", "step"]  # pin: None, skipped
    fills = [a["fill"] for a in tags(page, "stages", "rect")]
    assert fills.count(RED) == 1 and fills[1] == RED and fills.count(BLUE) == 6
    assert "bottleneck" in chart_text(page, "stages")


def test_no_gpu_means_no_gpu_chart() -> None:
    result = full_result()
    result["gpu"] = None
    assert set(Page(render_report(result)).charts) == BASE_CHARTS


@pytest.mark.parametrize(
    ("level", "css"),
    [
        ("not input-bound", "ok"),
        ("moderately input-bound", "warn"),
        ("highly input-bound", "bad"),
        ("something new", "unknown"),
        (None, "unknown"),
    ],
)
def test_verdict_box_is_coloured_by_level(level: str | None, css: str) -> None:
    result = full_result()
    result["verdict"]["level"] = level
    assert f'<section class="verdict {css}"' in render_report(result)


# -- escaping and offline ----------------------------------------------------------------------------


def test_page_loads_nothing_from_the_network_and_runs_no_script() -> None:
    text = render_report(full_result())
    lowered = text.lower()
    assert "http://" not in lowered and "https://" not in lowered
    assert not re.search(r"\b(src|href|srcset|action|xlink:href)\s*=", lowered)
    assert "url(" not in lowered and "@import" not in lowered
    for tag in ("<script", "<link", "<img", "<iframe", "<object", "<embed"):
        assert tag not in lowered


# -- partial and odd results -------------------------------------------------------------------------


def _empty_lists(r: dict[str, Any]) -> None:
    r.update(stages={}, timeline=[], traps=[], storage={}, environment={})
    r["cpu"] = {"per_core_percent_mean": [], "timeline": []}
    r["gpu"] = {"timeline": []}
    r["verdict"]["advice"] = []


def _all_none(r: dict[str, Any]) -> None:
    for key in list(r):
        r[key] = None


def _none_numbers(r: dict[str, Any]) -> None:
    for s in r["stages"].values():
        s.update(total_s=None, per_image_ms=None, per_batch_ms=None)
    r["timeline"] = [
        {"t": s["t"], "images_per_s": None, "prefetch_queue": None, "worker_queue": None} for s in r["timeline"]
    ]
    r["cpu"] = {"per_core_percent_mean": [None, None], "timeline": [{"t": 0.0, "per_core": [None, None]}]}
    r["gpu"]["timeline"] = [{"t": None, "utilization_percent": 50.0}, {"t": 1.0, "utilization_percent": None}]
    r["throughput"] = {k: None for k in r["throughput"]}
    r["verdict"] = {k: None for k in r["verdict"]}


def _missing_keys(r: dict[str, Any]) -> None:
    r["timeline"] = [{}, {"t": 0.5}]
    r["cpu"] = {"timeline": [{}]}
    r["gpu"] = {}
    r["stages"] = {"read": {}, "decode": None}


def _wrong_types(r: dict[str, Any]) -> None:
    r.update(timeline="soon", stages=["read"], cpu=7, gpu="yes", storage=[1], traps="none", environment=3)
    r["verdict"] = "slow"
    r["throughput"] = {"images_per_s": "fast", "wait_fraction": float("nan")}


EMPTYING: dict[str, Callable[[dict[str, Any]], None]] = {
    "empty result": lambda r: r.clear(),
    "empty lists": _empty_lists,
    "every section None": _all_none,
    "None numbers": _none_numbers,
    "missing keys": _missing_keys,
    "wrong types": _wrong_types,
}


@pytest.mark.parametrize("name", list(EMPTYING))
def test_partial_results_show_no_data_instead_of_raising(name: str) -> None:
    result = full_result()
    EMPTYING[name](result)
    text = render_report(result)
    page = Page(text)
    assert BASE_CHARTS <= set(page.charts)
    for kind in page.charts.keys() & {"stages", "throughput", "queues", "cpu", "gpu"}:
        assert "no data" in chart_text(page, kind), (name, kind)
        assert "no-data" in page.charts[kind]["attrs"]["class"]
    assert not re.search(r"\b(nan|inf)\b", text)


def test_extreme_numbers_render_without_raising() -> None:
    result = full_result()
    result["timeline"] = [{"t": 0.0, "images_per_s": -1e308}, {"t": 1e308, "images_per_s": 1e308}]
    result["stages"] = {"read": stage(1e308), "decode": stage(-5.0)}
    page = Page(render_report(result))
    assert len(tags(page, "throughput", "circle")) == 2 and len(tags(page, "stages", "rect")) == 2


def test_wait_fraction_falls_back_to_the_throughput_measurement() -> None:
    result = full_result()
    result["verdict"]["wait_fraction"] = None
    result["throughput"]["wait_fraction"] = 0.42
    assert "42%" in render_report(result)


def test_many_cores_get_fewer_time_bins_not_a_huge_page() -> None:
    result = full_result()
    result["cpu"] = {"timeline": [{"t": i * 0.1, "per_core": [50.0] * 256} for i in range(300)]}
    page = Page(render_report(result))
    cells = [a for a in tags(page, "cpu", "rect") if "%" not in str(a)]
    assert 256 * 10 <= len(cells) <= 12_000 + 2 * 256 + 10  # cells, plus mean bars and legend swatches
    assert "no data" not in chart_text(page, "cpu")


@pytest.mark.parametrize("values", [[0.0, 0.0, 0.0], [5.0], [3.0, 3.0]], ids=["all zeros", "one point", "flat"])
def test_degenerate_series_still_draw_a_chart(values: list[float]) -> None:
    result = full_result()
    result["timeline"] = [
        {"t": float(i), "images_per_s": v, "prefetch_queue": v, "worker_queue": v} for i, v in enumerate(values)
    ]
    result["cpu"]["timeline"] = [{"t": float(i), "per_core": [v, v]} for i, v in enumerate(values)]
    result["gpu"]["timeline"] = [{"t": float(i), "utilization_percent": v} for i, v in enumerate(values)]
    for s in result["stages"].values():
        s["per_image_ms"] = values[0]
    text = render_report(result)
    page = Page(text)
    for kind in ALL_CHARTS:
        assert "no data" not in chart_text(page, kind), kind
    assert len(tags(page, "throughput", "circle")) == len(values)
    assert len(tags(page, "stages", "rect")) == 8
    # every coordinate is a finite number: no division by a zero range slipped through
    assert not re.search(r"\b(nan|inf)\b", text)
    for kind in ALL_CHARTS:
        for _, attrs in page.charts[kind]["tags"]:
            for key in ("x", "y", "width", "height", "cx", "cy"):
                if key in attrs:
                    assert num(float(attrs[key])) is not None


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0, 812.3) == [0, 200, 400, 600, 800, 1000]
    assert nice_ticks(0, 0) == [0, 0.2, 0.4, 0.6, 0.8, 1]  # all zeros: an axis from 0 to 1, not a division by 0
    ticks = nice_ticks(5, 5)
    assert ticks[0] <= 5 <= ticks[-1] and ticks[-1] > ticks[0]


# -- writing -----------------------------------------------------------------------------------------


def test_write_report_writes_utf8_atomically(tmp_path: Path) -> None:
    result = full_result()
    result["dataset"]["path"] = "données/straße—ü.lmdb"
    target = tmp_path / "report.html"
    write_report(result, target)
    assert target.read_bytes() == render_report(result).encode("utf-8")
    assert "straße—ü".encode() in target.read_bytes()
    assert os.listdir(tmp_path) == ["report.html"]  # no temporary file left beside it
    write_report(full_result(), str(target))  # overwrite, str path
    assert target.read_text(encoding="utf-8") == render_report(full_result())


def test_a_failed_write_keeps_the_old_report_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report.html"
    target.write_text("old report", encoding="utf-8")

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(report_html.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_report(full_result(), target)
    assert target.read_text(encoding="utf-8") == "old report"
    assert os.listdir(tmp_path) == ["report.html"]


# -- a real browser ----------------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} not installed (apt-get install chromium; CI installs it)"
)


def chromium(tmp_path: Path, page: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path)  # a fresh profile per run
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
    flags += [f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]
    done = run_child([CHROMIUM, *flags, *mode, page.as_uri()])
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def console_messages(stderr: str) -> list[str]:
    """Chromium's console lines on stderr (``INFO:CONSOLE:...``, ``Uncaught ...``).

    Chromium logs every console level as INFO, so the level cannot be told apart; the report runs
    no script, so any console line at all (an exception, a resource that failed to load) is a fault.
    """
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@needs_chromium
def test_console_detection_sees_a_page_error(tmp_path: Path) -> None:
    """The check below could fail: a page that throws is seen by the same detector."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>throw new Error('boom')</script>", encoding="utf-8")
    messages = console_messages(chromium(tmp_path, page, "--dump-dom").stderr)
    assert any("Uncaught" in m and "boom" in m for m in messages)


@needs_chromium
def test_browser_builds_every_chart_without_console_errors(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    write_report(full_result(), page)
    done = chromium(tmp_path, page, "--dump-dom")
    dom = Page(done.stdout)
    assert set(dom.charts) == ALL_CHARTS
    assert len([t for t, _ in dom.charts["stages"]["tags"] if t == "rect"]) == 7
    assert console_messages(done.stderr) == []


def _paint(image: Any, box: tuple[int, int, int, int]) -> tuple[int, int]:
    """(coloured pixels, distinct colours among them) inside ``box`` of an RGB image.

    Coloured: clearly saturated. Text, axes and grid lines are grey, so only drawn data (bars,
    lines, heat cells) counts; a "no data" chart scores about zero.
    """
    pixels = np.asarray(image.crop(box), dtype=np.int16).reshape(-1, 3)
    coloured = pixels[pixels.max(axis=1) - pixels.min(axis=1) > 60]
    return len(coloured), len({tuple(p) for p in (coloured // 16).tolist()})


def _near(image: Any, colour: str, tolerance: int = 40) -> int:
    target = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    pixels = np.asarray(image, dtype=np.int16).reshape(-1, 3)
    return int((np.abs(pixels - target).sum(axis=1) <= tolerance).sum())


SLOT_H = 420


@needs_chromium
def test_browser_paints_each_chart(tmp_path: Path) -> None:
    """Each chart, as the browser draws it, in a slot of its own so its area is known; then the whole page."""
    from PIL import Image

    text = render_report(full_result())
    svgs = re.findall(r"<svg .*?</svg>", text, flags=re.S)
    empty = re.findall(r"<svg .*?</svg>", render_report({}), flags=re.S)[1]  # a "no data" chart, as control
    slots = "".join(f'<div class="slot">{svg}</div>' for svg in [*svgs, empty])
    harness = tmp_path / "charts.html"
    harness.write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>{CSS}'
        f"body{{background:#fff;margin:0}} .slot{{width:1000px;height:{SLOT_H}px;overflow:hidden}}</style>"
        f"</head><body>{slots}</body></html>",
        encoding="utf-8",
    )
    shot = tmp_path / "charts.png"
    done = chromium(tmp_path, harness, f"--screenshot={shot}", f"--window-size=1000,{SLOT_H * len(svgs) + SLOT_H}")
    assert console_messages(done.stderr) == []
    image = Image.open(shot).convert("RGB")
    kinds = [re.search(r'data-chart="(\w+)"', s).group(1) for s in svgs]  # type: ignore[union-attr]
    for i, kind in enumerate(kinds):
        coloured, colours = _paint(image, (0, i * SLOT_H, 1000, (i + 1) * SLOT_H))
        assert coloured > 1000 and colours >= 4, (kind, coloured, colours)
    stages = image.crop((0, kinds.index("stages") * SLOT_H, 1000, (kinds.index("stages") + 1) * SLOT_H))
    assert _near(stages, RED) > 1000  # the bottleneck bar is painted red
    # The control: the same measure on a "no data" chart stays below the bar the real charts clear.
    coloured, colours = _paint(image, (0, len(svgs) * SLOT_H, 1000, (len(svgs) + 1) * SLOT_H))
    assert coloured < 1000 or colours < 4, (coloured, colours)

    page = tmp_path / "report.html"
    write_report(full_result(), page)
    shot = tmp_path / "report.png"
    done = chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,2400")
    assert console_messages(done.stderr) == []
    assert shot.stat().st_size > 10_000
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2400)
    # every chart's own colour made it to the page: stage bars and throughput (blue), the worker
    # queue (orange), the GPU line (purple). (Not red: the verdict box's border is red too.)
    for colour, least in ((BLUE, 2000), (ORANGE, 150), (PURPLE, 150)):
        assert _near(image, colour) >= least, colour
