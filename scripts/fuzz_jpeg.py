"""Mutation fuzzing of the JPEG extension (fastloader/image/_jpeg.c, _resample.c) under AddressSanitizer and
UndefinedBehaviorSanitizer: ``python scripts/fuzz_jpeg.py [N] [--seed S]`` (``make fuzz`` runs it).

The extension is compiled again with ``-fsanitize=address,undefined`` into a temporary directory, and a child
Python process (ASan's runtime preloaded, as an uninstrumented interpreter needs it first) feeds it N JPEGs
mutated from the photographs in ``fastloader/sample_photos/``: bits flipped, the file cut short, a marker's
type or length changed, a segment dropped or repeated, bytes inserted. Each goes through every entry point:
the header (``info``), a whole decode and a region decode at a drawn scale, ``decode_resized`` into a slot and
``decode_resized_batch`` on two threads. A refusal (CorruptJPEGError, UnsupportedJPEGError, a ValueError) is
what bad data should get; any sanitizer report, crash or other exception fails the run, the input that caused
it kept and named. The same seed draws the same inputs.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCES = [REPO / "fastloader" / "image" / name for name in ("_jpeg.c", "_resample.c")]
PHOTOS = REPO / "fastloader" / "sample_photos"
FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
MARKERS_WITH_LENGTH = set(range(0xC0, 0xD0)) - {0xC8} | set(range(0xDB, 0xE0)) | set(range(0xE0, 0xF0)) | {0xFE}


def build(directory: Path) -> Path:
    """The extension compiled with the sanitizers into ``directory`` (its path)."""
    compiler = os.environ.get("CC", "gcc")
    target = directory / f"_jpeg{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = [
        compiler,
        *FLAGS,
        "-shared",
        "-fPIC",
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{SOURCES[0].parent}",
        *map(str, SOURCES),
        "-ljpeg",
        "-lm",
        "-lpthread",
        "-o",
        str(target),
    ]
    subprocess.run(command, check=True)
    return target


def sanitizer_env(directory: Path) -> dict[str, str]:
    compiler = os.environ.get("CC", "gcc")
    libasan = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True)
    return {
        **os.environ,
        "LD_PRELOAD": libasan.stdout.strip(),
        # Python's allocations are not freed at exit, by design: leaks say nothing about the extension.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "PYTHONPATH": str(REPO),
        "FUZZ_JPEG_WORK": str(directory),
    }


# -- the mutations (the child's) -------------------------------------------------------------------------


def markers(data: bytes) -> list[int]:
    """Where the marker segments of ``data`` start (the 0xFF of each marker with a length)."""
    found, at = [], 2
    while at + 4 <= len(data):
        if data[at] != 0xFF or data[at + 1] not in MARKERS_WITH_LENGTH:
            break
        found.append(at)
        if data[at + 1] == 0xDA:  # the entropy-coded data follows: no more segment headers to walk
            break
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return found


def mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.choice(("flip", "flip", "cut", "marker", "length", "drop", "repeat", "insert"))
        segments = markers(bytes(out))
        if kind == "flip" or (kind in ("marker", "length", "drop", "repeat") and not segments):
            for _ in range(rng.randint(1, 8)):
                out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif kind == "cut":
            del out[rng.randrange(2, len(out)) :]
        elif kind == "insert":
            at = rng.randrange(len(out))
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            at = rng.choice(segments)
            length = int.from_bytes(out[at + 2 : at + 4], "big")
            if kind == "marker":
                out[at + 1] = rng.choice(sorted(MARKERS_WITH_LENGTH | {0xD8, 0xD9, 0x01}))
            elif kind == "length":
                new = rng.choice((0, 1, 2, length - 1, length + 1, 0xFFFF, rng.randrange(0x10000)))
                out[at + 2 : at + 4] = (new % 0x10000).to_bytes(2, "big")
            elif kind == "drop":
                del out[at : at + 2 + length]
            else:
                out[at:at] = out[at : at + 2 + length]
        if len(out) < 4:
            break
    return bytes(out)


def exercise(ext: Any, data: bytes, rng: random.Random) -> None:
    """Every entry point of the extension on ``data``; the refusals bad data should get are swallowed."""
    import numpy as np

    from fastloader.errors import CorruptJPEGError, UnsupportedJPEGError

    refused = (CorruptJPEGError, UnsupportedJPEGError, ValueError)
    try:
        width, height, _ = ext.jpeg_info(data)
    except refused:
        return
    scale = rng.choice((1, 2, 4, 8))
    fast = rng.random() < 0.5
    x0, y0 = rng.randrange(max(1, width)), rng.randrange(max(1, height))
    box = (x0, y0, min(width, x0 + rng.randint(1, 512)), min(height, y0 + rng.randint(1, 512)))
    calls = [
        lambda: ext.decode(data, scale, fast),
        lambda: ext.decode_region(data, box, scale, fast, rng.random() < 0.5),
    ]
    side = rng.choice((16, 64, 224))
    out = np.zeros((2, side, side, 3), np.uint8)
    source = (box[0] / scale, box[1] / scale, box[2] / scale, box[3] / scale)
    filter_code = rng.randrange(5)
    calls.append(
        lambda: ext.decode_resized(data, box, scale, fast, source, False, out[0], rng.random() < 0.5, filter_code)
    )
    job = (data, box, scale, source, False, 1, (0, 0, side, side), False, filter_code)
    calls.append(lambda: ext.decode_resized_batch([job, (*job[:5], 0, *job[6:])], out, fast, 2))
    for call in calls:
        try:
            call()
        except refused:
            pass


def child(count: int, seed: int) -> int:
    import importlib.util

    import fastloader.image.jpeg_ext as jpeg_ext

    work = Path(os.environ["FUZZ_JPEG_WORK"])
    path = next(work.glob("_jpeg*.so"))
    spec = importlib.util.spec_from_file_location("fastloader.image._jpeg", path)
    assert spec is not None and spec.loader is not None
    sanitized = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sanitized)
    jpeg_ext._ext = sanitized  # every wrapper calls the instrumented build from here on
    photos = [photo.read_bytes() for photo in sorted(PHOTOS.glob("*.jpg"))]
    current = work / "current.jpg"
    rng = random.Random(seed)
    for case in range(count):
        data = mutate(rng.choice(photos), rng)
        current.write_bytes(data)  # what a crash leaves for the parent to keep
        (work / "case").write_text(str(case))
        exercise(jpeg_ext, data, random.Random(rng.random()))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "n", nargs="?", type=int, default=int(os.environ.get("N", "1500")), help="inputs (default 1500)"
    )
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED", "0")))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.n, args.seed)
    work = Path(tempfile.mkdtemp(prefix="fuzz-jpeg-"))
    try:
        build(work)
        began = time.monotonic()
        run = subprocess.run(
            [sys.executable, __file__, str(args.n), "--seed", str(args.seed), "--child"], env=sanitizer_env(work)
        )
        took = time.monotonic() - began
        if run.returncode != 0:
            case = (work / "case").read_text() if (work / "case").exists() else "?"
            kept = Path.cwd() / f"fuzz-jpeg-seed{args.seed}-case{case}.jpg"
            if (work / "current.jpg").exists():
                shutil.copyfile(work / "current.jpg", kept)
            print(f"fuzz_jpeg: FAILED at input {case} of seed {args.seed} (exit {run.returncode}); input kept: {kept}")
            return 1
        print(f"fuzz_jpeg: {args.n} mutated JPEGs (seed {args.seed}) in {took:.0f} s: no sanitizer report")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
