"""The built wheel, installed in a fresh virtual environment, has everything a user needs: the
package, its data (the built-in sample's photographs) and the compiled JPEG extension."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_the_wheel_makes_the_sample_in_a_fresh_venv(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, ROOT],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("fastloader-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert sum(name.startswith("fastloader/sample_photos/") and name.endswith(".jpg") for name in names) >= 8
    assert any(name.startswith("fastloader/image/_jpeg") and name.endswith(".so") for name in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    # The dependencies (numpy, Pillow, torch) come from this environment's site-packages as a plain path:
    # its .pth files (the editable install of the checkout) are not processed, so the only fastloader
    # the fresh venv can import is the wheel's.
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel], check=True, cwd=tmp_path
    )
    script = (
        "import fastloader, sys; from fastloader.sample import make_sample_folder;"
        "from fastloader.image import jpeg_ext;"
        "root = make_sample_folder(sys.argv[1], 12, num_classes=3, workers=1);"
        "print(fastloader.__file__, jpeg_ext.AVAILABLE)"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    out = subprocess.run(
        [python, "-c", script, tmp_path / "sample"], check=True, cwd=tmp_path, capture_output=True, text=True, env=env
    ).stdout.split()
    assert out[0].startswith(str(site)) and out[1] == "True"
    assert len(list((tmp_path / "sample").rglob("*.jpg"))) == 12
