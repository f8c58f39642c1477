"""The examples run as users would run them: in a fresh interpreter, on a real ImageFolder of JPEGs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]


def make_image_folder(root: Path, classes: int = 3, per_class: int = 8, side: int = 48) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (side, side + 8 * c, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class_{c}" / f"{i:03d}.jpg", quality=90)
    return root


def run(script: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = run_child([sys.executable, str(script), *args], env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_imagefolder_example_runs_with_fastloader_and_with_the_stock_import(tmp_path: Path) -> None:
    data = make_image_folder(tmp_path / "data")
    script = ROOT / "examples" / "train_imagefolder.py"
    source = script.read_text()
    ours = "from fastloader import DataLoaderX as DataLoader"
    assert source.count(ours) == 1
    stock = tmp_path / "train_imagefolder_stock.py"
    stock.write_text(source.replace(ours, "from torch.utils.data import DataLoader"))
    for path in (script, stock):
        out = run(path, str(data), "--batch-size", "8", "--image-size", "32", "--max-steps", "2", "--workers", "2")
        assert "epoch 0: loss" in out


def test_clip_example_trains_on_image_text_shards(tmp_path: Path) -> None:
    out = run(
        ROOT / "examples" / "train_clip_tar.py",
        *("--make-sample", str(tmp_path / "captions"), "--sample-size", "96", "--batch-size", "16"),
        *("--image-size", "64", "--max-steps", "3", "--workers", "2"),
    )
    loss = float(out.split("epoch 0: loss ")[1].split()[0])
    assert np.isfinite(loss) and "after 3 steps" in out and "input pipeline:" in out


def test_detection_example_trains_on_boxes_and_masks(tmp_path: Path) -> None:
    out = run(
        ROOT / "examples" / "train_detection.py",
        *("--make-sample", str(tmp_path / "scenes"), "--sample-size", "16", "--batch-size", "4"),
        *("--image-size", "96", "--max-steps", "2", "--workers", "2"),
    )
    loss = float(out.split("epoch 0: loss ")[1].split()[0])
    assert np.isfinite(loss) and "after 2 steps" in out


def test_demo_says_what_the_machine_supports_instead_of_torch_warning(tmp_path: Path) -> None:
    """`make demo`'s job on a tiny sample: no "pin_memory ... no accelerator" warning mid-output without a GPU."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = ["--images", "48", "--batch-size", "16", "--workers", "1", "--data", str(tmp_path / "sample")]
    done = run_child(
        [sys.executable, str(ROOT / "examples" / "demo.py"), *args, "--report", str(tmp_path / "report.html")], env=env
    )
    assert done.returncode == 0, done.stderr
    assert "speed-up: x" in done.stdout and "verdict:" in done.stdout and (tmp_path / "report.html").exists()
    assert "pin_memory" not in done.stderr
    import torch

    if not torch.cuda.is_available():
        assert "to the CPU (no CUDA GPU here" in done.stdout
