"""Screenshot a `fastloader doctor --report` page for the docs: docs/doctor-report.png.

    fastloader doctor data/sample-2000.lmdb --report doctor-report.html    # (make demo writes it)
    python scripts/doctor_report_screenshot.py doctor-report.html [--out docs/doctor-report.png]

Needs Chromium (/usr/bin/chromium) and PIL.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from PIL import Image

WIDTH = 1100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="the HTML report to screenshot")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "doctor-report.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        page, shot = Path(args.report).resolve(), Path(tmp) / "shot.png"
        subprocess.run(
            [
                args.chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp}/profile",
                f"--screenshot={shot}",
                f"--window-size={WIDTH},4000",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        image = Image.open(shot).convert("RGB")
        # Crop the empty page background below the footer: the window is taller than the page.
        background = image.getpixel((2, image.height - 2))
        bottom = image.height
        while bottom > 1 and all(image.getpixel((x, bottom - 1)) == background for x in range(0, WIDTH, 4)):
            bottom -= 1
        image = image.crop((0, 0, WIDTH, min(bottom + 16, image.height)))
        # A 128-colour palette keeps the PNG small enough for the docs; the page uses few colours.
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
        print(f"{out}: {image.width}x{image.height}, {out.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
