"""``fastloader info`` names what is active, through the real console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import PIL
import pytest

from fastloader import __version__
from fastloader.info import _ranges, collect


def test_info_report_names_every_piece() -> None:
    report = collect()
    for key in ("fastloader", "GIL", "torch", "cuda", "PIL", "jpeg", "cpu count", "cpu affinity"):
        assert key in report
    assert report["GIL"].startswith("on (") or report["GIL"].startswith("off (")
    assert report["fastloader"] == __version__
    assert report["PIL"].endswith(PIL.__version__)
    assert report["PIL"].split()[0] in ("Pillow", "Pillow-SIMD")
    assert report["cpu affinity"].startswith(f"{len(os.sched_getaffinity(0))} cores")
    from fastloader.image import jpeg_ext

    assert report["jpeg extension"].startswith("built" if jpeg_ext.AVAILABLE else "not built")


def test_console_script_prints_json() -> None:
    exe = shutil.which("fastloader", path=os.path.dirname(sys.executable))
    assert exe is not None, "the console script is installed with the package"
    out = subprocess.run([exe, "info", "--json"], check=True, capture_output=True, text=True).stdout
    assert json.loads(out)["fastloader"] == __version__


def test_cpu_ranges() -> None:
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert _ranges([3]) == "3"


def test_fields_lists_names_kinds_and_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastloader.cli import main
    from fastloader.sample_shards import make_caption_shards

    shard = str(make_caption_shards(tmp_path, num_images=3, shard_size=3)[0])
    assert main(["fields", shard, "--items", "1"]) == 0
    text = capsys.readouterr().out
    assert "3 items; the image is image / jpg" in text and "the label label / cls" in text
    assert "  json  json\n  txt   text" in text and "captions-000000.tar:000000000 (label" in text
    assert main(["fields", shard, "--json", "--items", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fields"] == {"json": "json", "txt": "text"} and len(report["samples"]) == 3
    assert report["samples"][2]["fields"]["txt"].startswith("'a ")


def test_info_names_an_unknown_gpu_jpeg_decoder_and_the_valid_ones() -> None:
    exe = shutil.which("fastloader", path=os.path.dirname(sys.executable))
    assert exe is not None
    env = {**os.environ, "FASTLOADER_JPEG_DECODER": "nvjpeg"}
    done = subprocess.run([exe, "info"], check=True, capture_output=True, text=True, env=env)
    warning = "$FASTLOADER_JPEG_DECODER='nvjpeg' names no JPEG decoder: it must be one of torchcodec, torchvision"
    assert warning in done.stderr and "warning" in done.stderr
    assert "gpu jpeg decoder" in done.stdout and warning in done.stdout
    env["FASTLOADER_JPEG_DECODER"] = "torchvision"
    done = subprocess.run([exe, "info", "--json"], check=True, capture_output=True, text=True, env=env)
    assert json.loads(done.stdout)["gpu jpeg decoder"] == "torchvision ($FASTLOADER_JPEG_DECODER)"
    assert "warning" not in done.stderr
