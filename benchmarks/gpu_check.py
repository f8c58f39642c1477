"""The GPU checks: is fastloader's GPU path right, and is it fast? One step per process.

    python benchmarks/gpu_check.py STEP      # appends one JSON line {"step": STEP, ...} to $OUT/results.jsonl

``benchmarks/gpu_check.sh`` runs the steps in order, each in its own process (a sticky CUDA error or a
failed graph capture cannot poison the next) under its own time limit, within a total budget, most
valuable first; a run cut short keeps the lines of the steps that finished.

Steps (on the GPU machine: one CUDA GPU, 16 cores, no network):

* ``sample``: the sample ImageFolder (``fastloader.sample.make_sample_folder``, 4000 photos, ~1% grey,
  CMYK or PNG-named-.jpg, which GPU decode hands to the CPU).
* ``env``: versions, GPU, cores, whether the C JPEG extension and the carried packages import, and the
  JPEG decoder GPU decode chose (torchcodec, else torchvision; why when one is not usable).
* ``pytest``: ``tests/gpu``, ``tests/image/test_gpu_decode.py``, ``tests/image/test_gpu_jpeg.py``,
  ``tests/loader/test_normalize.py``
  (output in ``$OUT/pytest.txt``).
* ``decode_race``: ``decode_on="cuda"`` with an idle vs a busy (30 ms of queued GPU work per batch)
  training loop: per-image |GPU - CPU path| (levels; a corrupted image is > 8) and the count of images
  not bit-identical to the idle loop's GPU result (the sharp test: the same plans decode the same way).
* ``decode_equality``: GPU vs CPU path per image, for bilinear / bicubic / nearest in an eval
  (Resize + CenterCrop) and a train (RandomResizedCrop + flip) pipeline, with each JPEG decoder installed
  (torchcodec, torchvision) and the two against each other; also nvJPEG vs the CPU decoder through the same
  crop code, which separates the decoders from the crop / resize code.
* ``corrupt``: truncated and corrupt JPEGs inside a GPU batch (what each JPEG decoder, PIL and ``GpuDecoder``
  say),
  then a folder with bad files under the ``replace`` error policy: the epoch must complete, full size.
* ``rng``: ``random_flip`` reproducible under ``torch.manual_seed`` (and different for another seed or
  epoch), the global CUDA RNG state untouched by the loader, the loop's dropout masks reproducible.
* ``graph_thread_local``, ``graph_global``: CUDA-graph capture in the loop while the loader runs.
* ``copy_race``: side-stream copies under a busy consumer, on the default stream and another; every
  sample checked exactly.
* ``ring``: the batch ring off and on, A B A B (images/s, the hand-off / pin / copy stages, whether it is
  pinned, fallbacks), then 4 random images of every batch checked on the GPU while the loop keeps it busy.
* ``throughput``: images/s of the train pipeline, decode on cuda vs cpu (16 workers, and cuda with 4),
  the producer's ms per batch (each JPEG decoder alone, and the whole GpuDecoder), GPU memory.
* ``wait_fraction``: share of a fixed 30 ms GPU step spent waiting for data: torch's DataLoader
  (torchvision) vs DataLoaderX with CPU decode vs DataLoaderX with GPU decode (8 workers).
* ``scaling``: images/s of the CPU train pipeline at 1, 2, 4, 8, 16 workers, fastloader vs torch's loader
  (torchvision), and memory per worker process (USS / PSS, psutil).

Environment: ``OUT`` (results folder, default /tmp/glc_out), ``SAMPLE`` (sample folder, default
/tmp/fl_sample), ``GLC_DEVICE`` (default cuda:0 when CUDA is there, else cpu), ``GLC_SMALL=1`` (tiny
sizes: the CPU smoke run, ``GLC_SMALL=1 GLC_DEVICE=cpu``; steps that need CUDA then record
``{"skipped": "needs CUDA"}``). The C JPEG extension is built for this machine's Python and does not
travel: on the GPU machine the CPU path decodes through PIL unless it is built there (``env`` says), so
CPU-decode figures from there are a pessimistic baseline.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import io
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from fastloader import DataLoaderX
from fastloader import transforms as T

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT", "/tmp/glc_out"))
SAMPLE = os.environ.get("SAMPLE", "/tmp/fl_sample")
DEV = torch.device(os.environ.get("GLC_DEVICE") or ("cuda:0" if torch.cuda.is_available() else "cpu"))
CUDA = DEV.type == "cuda"
SMALL = os.environ.get("GLC_SMALL") == "1"
CORES = len(os.sched_getaffinity(0))
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NEEDS_CUDA = {"skipped": "needs CUDA"}

warnings.filterwarnings("ignore", message=".*pin_memory.*")  # pin_memory=True without CUDA (the smoke run)
warnings.filterwarnings("ignore", message=".*decode_on='cuda' but batches go to.*")  # the smoke run too
# The steps compare torchvision's deprecated decode_jpeg with torchcodec's on purpose: its warning is known.
warnings.filterwarnings("ignore", category=DeprecationWarning, module="torchvision")


def size(full: Any, small: Any) -> Any:
    """``full`` on the GPU machine, ``small`` in the smoke run."""
    return small if SMALL else full


def record(step: str, data: dict[str, Any]) -> None:
    """Append ``{"step": step, ...data}`` to ``$OUT/results.jsonl`` (numbers rounded to 3 decimals)."""

    def plain(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        return round(float(value), 3) if hasattr(value, "__float__") else str(value)

    line = json.dumps({"step": step, **data}, default=plain)
    with open(OUT / "results.jsonl", "a", encoding="utf-8") as file:
        file.write(line + "\n")
    print(line[:4000], flush=True)


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize(DEV)


_CYCLES_PER_MS: float | None = None


def gpu_sleep(ms: float) -> None:
    """Queue about ``ms`` ms of a spinning kernel on the current stream (a training step the host does
    not wait for); calibrated once. Without CUDA: nothing (the smoke run)."""
    global _CYCLES_PER_MS
    if not CUDA or ms <= 0:
        return
    if _CYCLES_PER_MS is None:
        with torch.cuda.stream(torch.cuda.default_stream(DEV)):
            torch.cuda._sleep(1000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(50_000_000)
            end.record()
            end.synchronize()
            _CYCLES_PER_MS = 50_000_000 / start.elapsed_time(end)
    torch.cuda._sleep(int(ms * _CYCLES_PER_MS))


def summary(values: Any) -> dict[str, Any]:
    """n, mean, p50, p99, max, and how many exceed 3 and 8 (levels, for per-image differences)."""
    t = torch.as_tensor(values, dtype=torch.float64).flatten().cpu()
    if t.numel() == 0:
        return {"n": 0}
    return {
        "n": t.numel(),
        "mean": t.mean().item(),
        "p50": t.quantile(0.5).item(),
        "p99": t.quantile(0.99).item(),
        "max": t.max().item(),
        "n_over_3": int((t > 3).sum()),
        "n_over_8": int((t > 8).sum()),
    }


def per_image(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean |a - b| of each image (N×C×H×W), in levels."""
    return (a.float() - b.float()).abs().flatten(1).mean(1)


def folder(transform: Any, root: str = SAMPLE) -> Any:
    from fastloader.datasets import ImageFolder

    return ImageFolder(root, transform=transform)


def photos(n: int) -> list[tuple[str, bytes]]:
    """The first ``n`` sample files, ``(path, bytes)``."""
    paths = sorted(glob.glob(os.path.join(SAMPLE, "*", "*.jpg")))[:n]
    return [(p, Path(p).read_bytes()) for p in paths]


def loader_figures(loader: DataLoaderX) -> dict[str, Any]:
    """What ``loader.stats()`` says about the GPU path: decode counts, bad samples, wait share, p50 ms
    per batch of each stage (the producer's decode and copy are in ``h2d``)."""
    stats = loader.stats()
    return {
        "gpu_decode": stats.get("gpu_decode"),
        "gpu_decoder": stats.get("gpu_decoder"),
        "bad_samples": stats.get("bad_samples"),
        "wait_fraction": stats.get("wait_fraction"),
        "p50_ms_per_batch": {
            stage: (figures.get("per_batch_ms") or {}).get("p50") for stage, figures in stats.get("stages", {}).items()
        },
    }


def jpeg_decoders() -> dict[str, str]:
    """Each JPEG decoder GPU decode knows, on DEV: ``"torchcodec 0.17.0"`` or why it is not usable."""
    from fastloader.image.gpu_jpeg import NAMES, JpegDecoderUnavailable, jpeg_decoder

    found = {}
    for name in NAMES:
        try:
            found[name] = str(jpeg_decoder(DEV, name))
        except JpegDecoderUnavailable as error:
            found[name] = f"unavailable: {error}"[:400]
    return found


def usable_decoders() -> list[str]:
    """The JPEG decoders that work on DEV, the one GPU decode chooses first."""
    from fastloader.image.gpu_decode import GpuDecoder

    chosen = GpuDecoder(DEV).jpeg.name
    others = [name for name, found in jpeg_decoders().items() if name != chosen and not found.startswith("unavailable")]
    return [chosen, *others]


def gpu_memory() -> dict[str, Any]:
    if not CUDA:
        return {}
    free, total = torch.cuda.mem_get_info(DEV)
    return {
        "max_allocated_mib": torch.cuda.max_memory_allocated(DEV) >> 20,
        "reserved_mib": torch.cuda.memory_reserved(DEV) >> 20,
        "device_used_mib": (total - free) >> 20,
    }


# ---------------------------------------------------------------- setup
def sample() -> dict[str, Any]:
    from fastloader.sample import make_sample_folder

    count = int(os.environ.get("GLC_N_SAMPLE", size(4000, 96)))
    make_sample_folder(SAMPLE, count, num_classes=10, workers=CORES)
    return {"images": len(glob.glob(os.path.join(SAMPLE, "*", "*.jpg"))), "root": SAMPLE}


def env() -> dict[str, Any]:
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    import PIL
    import torchvision

    from fastloader.image import jpeg_ext
    from fastloader.image.gpu_jpeg import ENV, JpegDecoderUnavailable, jpeg_decoder

    carried = ("lmdb", "crc32c", "psutil", "tqdm", "pytest")  # what fastloader and the steps need beyond torch
    found = {name: importlib.util.find_spec(name) is not None for name in carried}
    try:
        codec: str | None = version("torchcodec")
    except PackageNotFoundError:
        codec = None
    try:
        chosen = str(jpeg_decoder(DEV))
    except JpegDecoderUnavailable as error:
        chosen = f"none: {error}"[:400]
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "torchcodec": codec,
        "jpeg_decoder": chosen,  # what decode_on="cuda" runs here
        "jpeg_decoders": jpeg_decoders(),
        "jpeg_decoder_env": os.environ.get(ENV),
        "pil": PIL.__version__,
        "cuda": torch.version.cuda,
        "device": str(DEV),
        "gpu": torch.cuda.get_device_name(DEV) if CUDA else None,
        "gpus": torch.cuda.device_count(),
        "cores": CORES,
        "small": SMALL,
        "jpeg_ext": jpeg_ext.AVAILABLE,
        "modules": found,
    }


def pytest() -> dict[str, Any]:
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return {"skipped": "pytest is not installed: carry its wheels in .whl/ (see gpu_check.sh)"}
    targets = size(
        [
            "tests/gpu",
            "tests/image/test_gpu_decode.py",
            "tests/image/test_gpu_jpeg.py",
            "tests/loader/test_normalize.py",
        ],
        ["tests/gpu"],
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--durations=5", *targets]
    limit = float(os.environ.get("GLC_PYTEST_S", 150))
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=limit)
        output, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:  # partial output, maybe bytes
        streams = (expired.output, expired.stderr)
        parts = [p.decode(errors="replace") if isinstance(p, bytes) else p or "" for p in streams]
        output, rc = "\n".join([*parts, f"TIMED OUT after {limit:.0f}s"]), None
    (OUT / "pytest.txt").write_text(output, encoding="utf-8")
    lines = [line for line in output.splitlines() if line.strip()]
    failed = [line[:300] for line in lines if line.startswith(("FAILED", "ERROR"))]
    return {"rc": rc, "summary": lines[-1] if lines else "", "failed": failed[:30], "targets": targets}


# ---------------------------------------------------------------- nvJPEG decode under a busy consumer stream
def decode_race() -> dict[str, Any]:
    tf = T.Compose([T.Resize(256), T.CenterCrop(224)])  # deterministic: the same plans on both paths
    n, batch = size(1024, 24), size(64, 8)
    cpu = DataLoaderX(folder(tf), batch_size=batch, sampler=range(n), num_workers=size(min(14, CORES), 2), device="cpu")
    reference = torch.cat([images for images, _ in cpu]).to(DEV)
    scale = torch.tensor(STD, device=DEV).view(1, 3, 1, 1) * 255
    shift = torch.tensor(MEAN, device=DEV).view(1, 3, 1, 1) * 255
    results: dict[str, Any] = {"images": n, "note": "per-image mean |GPU - CPU path|; a corrupted image is > 8"}
    gpu_reference: torch.Tensor | None = None
    cases = [("idle", 0.0, False), ("busy_30ms", 30.0, False), ("busy_30ms_sync_each_step", 30.0, True)]
    for name, step_ms, step_sync in cases:
        for normalize in (None, (MEAN, STD)):
            loader = DataLoaderX(
                folder(tf), batch_size=batch, sampler=range(n), num_workers=size(6, 2), pin_memory=True,
                decode_on="cuda", max_prefetch=3, normalize=normalize, device=DEV,
            )  # fmt: skip
            vs_cpu, vs_gpu = [], []
            for _epoch in range(2):
                delivered = []
                for images, _labels in loader:
                    gpu_sleep(step_ms)  # the training step; the host does not wait for it (unless step_sync)
                    pixels = images.float() * scale + shift if normalize else images
                    delivered.append(pixels)
                    if step_sync:
                        sync()
                got = torch.cat(delivered)
                vs_cpu.append(per_image(got, reference))
                if gpu_reference is None:
                    gpu_reference = got.clone()  # the idle loop's first epoch, uint8
                # normalized images come back as floats: a level is 1.0, float rounding 1e-4
                vs_gpu.append((got.float() - gpu_reference.float()).abs().flatten(1).amax(1) > 0.5)
            results[f"{name}_{'normalized' if normalize else 'uint8'}"] = {
                "vs_cpu_path": summary(torch.cat(vs_cpu)),
                "images_not_identical_to_idle_gpu": int(torch.cat(vs_gpu).sum()),
                **loader_figures(loader),
            }
            del loader
    return results


# ---------------------------------------------------------------- nvJPEG + GPU crop vs the CPU path, per image
def decode_equality() -> dict[str, Any]:
    from fastloader.image.batching import EncodedImage
    from fastloader.image.decode import decode_plan, read_header
    from fastloader.image.geometry import visible_region, whole_box
    from fastloader.image.gpu_decode import GpuDecoder

    torch.set_num_threads(min(8, CORES))
    files = photos(size(512, 16))
    headers = [read_header(data, path) for path, data in files]
    names = usable_decoders()  # the one decode_on="cuda" chooses first
    results: dict[str, Any] = {"images": len(files), "decoders": names}
    for pipeline in ("eval", "train"):
        for interpolation in ("bilinear", "bicubic", "nearest"):
            if pipeline == "eval":
                tf = T.Compose([T.Resize(256, interpolation=interpolation), T.CenterCrop(224)])
            else:
                tf = T.Compose([T.RandomResizedCrop(224, interpolation=interpolation), T.RandomHorizontalFlip()])
            generator = torch.Generator().manual_seed(0)
            items = [
                EncodedImage(data, tf.plan(h.width, h.height, generator), path, h, i)
                for i, ((path, data), h) in enumerate(zip(files, headers))
            ]
            whole = []
            for item, h in zip(items, headers):
                region = visible_region(item.plan, h.width, h.height)
                whole.append(region is not None and whole_box(region[0]) is not None)
            on_gpu = {name: GpuDecoder(DEV, jpeg=name) for name in names}
            on_cpu = GpuDecoder(torch.device("cpu"))  # same crop code, CPU decoder
            vs_cpu_path, vs_same_code, max_vs_cpu_path = [], [], []
            others: dict[str, list[torch.Tensor]] = {name: [] for name in names[1:]}
            for start in range(0, len(items), 128):
                chunk = items[start : start + 128]
                gpu = on_gpu[names[0]].decode(chunk)[0].cpu()
                cpu_path = torch.stack(
                    [torch.from_numpy(decode_plan(i.data, i.plan, i.key)).permute(2, 0, 1) for i in chunk]
                )
                same_code, _ = on_cpu.decode(chunk)
                vs_cpu_path.append(per_image(gpu, cpu_path))
                max_vs_cpu_path.append((gpu.float() - cpu_path.float()).abs().flatten(1).amax(1))
                vs_same_code.append(per_image(gpu, same_code))
                for name in others:  # the other decoder on the device, image by image against the first
                    others[name].append(per_image(gpu, on_gpu[name].decode(chunk)[0].cpu()))
            d, mask = torch.cat(vs_cpu_path), torch.tensor(whole)
            results[f"{pipeline}_{interpolation}"] = {
                "decoder": str(on_gpu[names[0]].jpeg),
                "vs_cpu_path": summary(d),
                "max_abs_per_image_vs_cpu_path": summary(torch.cat(max_vs_cpu_path)),
                "nvjpeg_vs_cpu_decoder_same_crop_code": summary(torch.cat(vs_same_code)),
                "whole_pixel_box_images": int(mask.sum()),
                "vs_cpu_path_whole_pixel_boxes": summary(d[mask]),
                "vs_cpu_path_fractional_boxes": summary(d[~mask]),
                **{f"{names[0]}_vs_{name}": summary(torch.cat(diffs)) for name, diffs in others.items()},
                "counts": {name: decoder.counts.to_dict() for name, decoder in on_gpu.items()},
            }
    return results


# ---------------------------------------------------------------- bad JPEGs in a GPU-decode batch
def corrupt() -> dict[str, Any]:
    from PIL import Image

    from fastloader.image.batching import EncodedImage
    from fastloader.image.decode import read_header
    from fastloader.image.gpu_decode import GpuDecoder

    good = [(p, d, h) for p, d in photos(200) if (h := read_header(d, p)).plain_jpeg][:66]
    truncated = good[0][1][: len(good[0][1]) * 6 // 10]
    body = bytearray(good[1][1])
    for j in range(len(body) // 2, len(body) // 2 + 600, 5):  # scribble on entropy-coded data, never on a marker
        if body[j] != 0xFF and body[j - 1] != 0xFF and body[j] + 0x31 < 0xFF:
            body[j] += 0x31
    bad_files = {"truncated_60pct": (truncated, good[0][2]), "corrupt_body": (bytes(body), good[1][2])}
    tf = T.Compose([T.Resize(256), T.CenterCrop(224)])
    clean = [EncodedImage(d, tf.plan(h.width, h.height), p, h, i) for i, (p, d, h) in enumerate(good[2:65])]
    if len(clean) < 8:
        return {"skipped": f"the sample holds {len(good)} plain JPEGs in its first 200 files; needs 10"}
    results: dict[str, Any] = {"decoder": str(GpuDecoder(DEV).jpeg)}
    reference, _ = GpuDecoder(DEV).decode(clean)
    jpegs = [GpuDecoder(DEV, jpeg=name).jpeg for name in usable_decoders()]
    for name, (data, header) in bad_files.items():
        r: dict[str, Any] = {}
        for jpeg in jpegs:  # what each decoder says of the file alone, without GpuDecoder's checks
            try:
                image = jpeg.decode([torch.frombuffer(bytearray(data), dtype=torch.uint8)], DEV)[0]
                sync()
                bottom = image[:, image.shape[1] * 2 // 3 :].float().mean()  # grey (~128) where data ran out
                r[f"{jpeg.name}_alone"] = f"no error; bottom third mean {bottom:.1f}"
            except Exception as error:  # noqa: BLE001
                r[f"{jpeg.name}_alone"] = f"{type(error).__name__}: {str(error)[:160]}"
        try:
            Image.open(io.BytesIO(data)).convert("RGB")
            r["pil"] = "no error"
        except Exception as error:  # noqa: BLE001
            r["pil"] = f"{type(error).__name__}: {str(error)[:120]}"
        decoder = GpuDecoder(DEV)
        items = [*clean, EncodedImage(data, tf.plan(header.width, header.height), f"bad/{name}.jpg", header, 999)]
        start = time.perf_counter()
        try:
            out, bad = decoder.decode(items)
            sync()
            r["decoder_good_plus_1_bad"] = {
                "bad_rows": [(row, f"{type(error).__name__}: {str(error)[:160]}") for row, error in bad],
                "good_rows_max_diff_to_clean_batch": (out[: len(clean)].float() - reference.float()).abs().max(),
            }
        except Exception as error:  # noqa: BLE001
            r["decoder_good_plus_1_bad"] = f"RAISED {type(error).__name__}: {str(error)[:200]}"
        r["decode_s"] = time.perf_counter() - start
        r["counts"] = decoder.counts.to_dict()
        results[name] = r
    # the whole loader: the replace policy must complete the epoch at full size
    root = Path(tempfile.mkdtemp(prefix="glc_bad_"))  # not under $OUT: only 8 files come back from there
    (root / "class_00").mkdir()
    for i, (_p, d, _h) in enumerate(good[2:62]):
        (root / "class_00" / f"{i:04d}.jpg").write_bytes(d)
    (root / "class_00" / "9996.jpg").write_bytes(truncated)
    (root / "class_00" / "9997.jpg").write_bytes(bytes(body))
    (root / "class_00" / "9998.jpg").write_bytes(b"not an image at all" * 50)
    (root / "class_00" / "9999.jpg").write_bytes(good[2][1][:300])  # the header alone
    files = len(list((root / "class_00").iterdir()))
    for decode_on in ("cpu", "cuda"):
        dataset = folder(tf, str(root))
        dataset.set_error_policy("replace", quarantine=root / f"quarantine_{decode_on}.txt")
        loader = DataLoaderX(dataset, batch_size=32, num_workers=2, decode_on=decode_on, device=DEV)
        key = f"loader_replace_decode_on_{decode_on}"
        try:
            images = sum(batch[0].shape[0] for batch in loader)
            results[key] = {"files": files, "images": images, **loader_figures(loader)}
        except Exception as error:  # noqa: BLE001
            results[key] = f"RAISED {type(error).__name__}: {str(error)[:300]}"
    for path in glob.glob(f"{root}*"):  # the folder and the index ImageFolder wrote beside it
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return results


# ---------------------------------------------------------------- random_flip and the global CUDA RNG
class Asymmetric(Dataset[tuple[torch.Tensor, int]]):
    """Images that differ from their mirror image (so a flip shows), a function of the index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        columns = torch.arange(16, dtype=torch.int64).view(1, 1, 16).expand(3, 16, 16)
        return ((columns * 7 + i) % 256).to(torch.uint8), i


def rng() -> dict[str, Any]:
    n = size(1024, 64)

    def run(seed: int, flip: float, draw: bool) -> tuple[list[torch.Tensor], list[int]]:
        torch.manual_seed(seed)
        loader = DataLoaderX(
            Asymmetric(n), batch_size=16, num_workers=2, normalize=(MEAN, STD), random_flip=flip, device=DEV,
            max_prefetch=4,
        )  # fmt: skip
        x = torch.ones(1 << 14, device=DEV)
        jitter = random.Random()  # unseeded: only the thread timing differs between runs
        epochs, masks = [], []
        for _epoch in range(2):
            images = []
            for batch, _labels in loader:
                time.sleep(jitter.random() * 0.002)
                images.append(batch.cpu())
                if draw:
                    masks.append(int((torch.nn.functional.dropout(x, 0.5) != 0).nonzero().sum()))
            epochs.append(torch.cat(images))
        return epochs, masks

    torch.manual_seed(0)
    before = torch.cuda.get_rng_state(DEV) if CUDA else None
    run(0, 0.5, draw=False)  # seeds 0 again, then only the loader runs: the CUDA generator must not move
    after = torch.cuda.get_rng_state(DEV) if CUDA else None
    a, masks_a = run(0, 0.5, draw=True)
    b, masks_b = run(0, 0.5, draw=True)
    other, _ = run(1, 0.5, draw=False)
    plain, _ = run(0, 0.0, draw=False)
    flipped = (a[0] == plain[0].flip(-1)).flatten(1).all(1)
    return {
        "flips_reproducible": all(torch.equal(x, y) for x, y in zip(a, b)),
        "flips_differ_for_another_seed": not torch.equal(a[0], other[0]),
        "flips_differ_between_epochs": not torch.equal(a[0], a[1]),
        "flipped_share": flipped.float().mean(),
        "cuda_rng_untouched_by_loader": torch.equal(before, after) if CUDA else None,
        "loop_dropout_masks_reproducible": masks_a == masks_b,
        "steps": len(masks_a),
    }


def graph(mode: str) -> dict[str, Any]:
    if not CUDA:
        return NEEDS_CUDA
    results: dict[str, Any] = {"mode": mode}
    for flip in (0.0, 0.5):  # the control first: a failed capture can poison the process state
        loader = DataLoaderX(
            Asymmetric(4096), batch_size=16, num_workers=2, normalize=(MEAN, STD), random_flip=flip, device=DEV,
            max_prefetch=2,
        )  # fmt: skip
        iterator = iter(loader)
        x = torch.ones(1 << 20, device=DEV)
        warm = torch.cuda.Stream(DEV)
        warm.wait_stream(torch.cuda.current_stream(DEV))
        with torch.cuda.stream(warm):
            for _ in range(3):
                torch.nn.functional.dropout(x, 0.1)
        torch.cuda.current_stream(DEV).wait_stream(warm)
        ok, errors = 0, []
        for _trial in range(30):
            try:
                next(iterator), next(iterator)  # frees queue slots: the producer copies, normalizes, flips now
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, capture_error_mode=mode):
                    y = x
                    for _ in range(200):
                        y = torch.nn.functional.dropout(y, 0.1)
                g.replay()
                sync()
                ok += 1
            except Exception as error:  # noqa: BLE001
                errors.append(f"{type(error).__name__}: {str(error)[:240]}")
                break
        results[f"random_flip_{flip}"] = {"ok_captures": ok, "errors": errors}
        del iterator, loader
    return results


# ---------------------------------------------------------------- stream races on the copy path
def pattern(idx: Any, numel: int, device: Any = "cpu") -> torch.Tensor:
    """Images that are a function of their index: recomputed on the GPU to check every delivered sample exactly."""
    ar = torch.arange(numel, dtype=torch.int64, device=device).view(1, -1)
    idx = torch.as_tensor(idx).to(device=device, dtype=torch.int64).view(-1, 1)
    return (((ar * (2 * idx + 1) + idx * 7919) >> 3) & 255).to(torch.uint8)


class Pattern(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int, side: int) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return pattern(i, 3 * self.side * self.side).view(3, self.side, self.side), i


def copy_race() -> dict[str, Any]:
    side, n, workers = size((384, 64 * 48, min(12, CORES - 2)), (32, 128, 1))
    other = torch.cuda.Stream(DEV) if CUDA else None
    variants = {
        # iterator and loop on the default stream (what the tests do)
        "default_stream": dict(pin=True, other=False, before=0.0, after=2.0, prefetch=2),
        # iterator made on the default stream, loop on another stream: the side stream then waits on the idle
        # default stream, so only wait_event + record_stream protect the data
        "other_stream_read_at_once": dict(pin=True, other=True, before=0.0, after=0.3, prefetch=1),
        "other_stream_free_while_queued": dict(pin=True, other=True, before=3.0, after=0.0, prefetch=3),
        # pin_memory=False (torch's default): non_blocking from pageable memory
        "pageable_default_stream": dict(pin=False, other=False, before=0.0, after=2.0, prefetch=2),
    }
    results: dict[str, Any] = {}
    for name, v in variants.items():
        loader = DataLoaderX(
            Pattern(n, side), batch_size=64, num_workers=workers, pin_memory=v["pin"], max_prefetch=v["prefetch"],
            device=DEV,
        )  # fmt: skip
        iterator = iter(loader)  # the consumer stream is captured here: the default stream
        start, batches = time.perf_counter(), 0
        with torch.cuda.stream(other) if v["other"] and other is not None else contextlib.nullcontext():
            bad = torch.zeros((), dtype=torch.int64, device=DEV)  # made on the stream that updates it
            for images, labels in iterator:
                gpu_sleep(v["before"] * 2 * random.random())
                expected = pattern(labels, images[0].numel(), device=images.device)
                bad += (images.reshape(images.shape[0], -1) != expected).any(1).sum()
                del images, labels, expected  # freed while the check is still queued
                gpu_sleep(v["after"] * 2 * random.random())
                batches += 1
        sync()
        results[name] = {"batches": batches, "corrupted_samples": int(bad), "s": time.perf_counter() - start}
        del iterator, loader
    return results


# ---------------------------------------------------------------- the batch ring: pinned slots, reused, A B A B
class Indexed:
    """The sample folder's images, image i labelled i: a batch names its samples, each can be checked."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def read(self, index: int) -> bytes:
        return self.source.read(index)

    def label(self, index: int) -> int:
        return index

    def key(self, index: int) -> str:
        return self.source.key(index)


def ring() -> dict[str, Any]:
    """Ring off / on, A B A B (images/s, the pin and copy stages, the ring's counts), then every batch of an
    epoch checked (4 random images each, on the GPU) while the loop keeps the GPU busy, slots reused."""
    import dataclasses

    from fastloader.datasets.base import ImageDataset

    dataset = ImageDataset(Indexed(folder(None).source), transform=T.Compose([T.Resize(256), T.CenterCrop(224)]))
    batch, workers, epochs = size((256, CORES, 2), (8, 2, 1))

    def loader(on: bool, **extra: Any) -> DataLoaderX:
        made = DataLoaderX(dataset, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=True,
                           persistent_workers=True, device=DEV, **extra)  # fmt: skip
        made._plan = dataclasses.replace(made._plan, batch_ring=on)
        return made

    results: dict[str, Any] = {"off": [], "on": []}
    for _ in range(2):
        for side in ("off", "on"):
            timed = loader(side == "on")
            for _images, _labels in timed:  # warm-up: the workers start, the ring's slots are touched
                pass
            sync()
            start, count = time.perf_counter(), 0
            for _ in range(epochs):
                for images, _labels in timed:
                    count += images.shape[0]
            sync()
            figures = loader_figures(timed)
            results[side].append({
                "images_per_s": count / (time.perf_counter() - start),
                "p50_ms_per_batch": {k: figures["p50_ms_per_batch"].get(k) for k in ("handoff", "pin", "h2d", "wait")},
                "batch_ring": timed.stats()["batch_ring"],
            })  # fmt: skip
            del timed
            gc.collect()
    checked = loader(True, max_prefetch=1)
    bad = torch.zeros((), dtype=torch.int64, device=DEV)
    samples = 0
    for images, labels in checked:
        gpu_sleep(5.0)  # the loop's work: copies queue behind it while the workers refill the ring
        rows = random.sample(range(images.shape[0]), k=min(4, images.shape[0]))
        expected = torch.stack([dataset[int(labels[row])][0] for row in rows]).to(images.device)
        bad += (images[rows] != expected).flatten(1).any(1).sum()
        samples += len(rows)
    sync()
    results["checked"] = {
        "samples": samples,
        "corrupted_samples": int(bad),
        "batch_ring": checked.stats()["batch_ring"],
    }
    return results


# ---------------------------------------------------------------- throughput and GPU memory
def throughput() -> dict[str, Any]:
    from fastloader.image.batching import EncodedImage
    from fastloader.image.decode import read_header
    from fastloader.image.gpu_decode import GpuDecoder

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    batch = size(256, 16)
    # the producer thread's time per batch: nvJPEG alone, then decode + crop + resize + flip (GpuDecoder)
    files = photos(batch)
    headers = [read_header(d, p) for p, d in files]
    items = [EncodedImage(d, tf.plan(h.width, h.height), p, h, i) for i, ((p, d), h) in enumerate(zip(files, headers))]
    decoder = GpuDecoder(DEV)
    timings: dict[str, Any] = {"decoder": str(decoder.jpeg)}
    runs: list[tuple[str, Callable[[], Any]]] = []
    for name in usable_decoders():  # each decoder alone, on the bytes GpuDecoder gives it
        jpeg = GpuDecoder(DEV, jpeg=name).jpeg
        prepared = [jpeg.prepare(d) for (_p, d), h in zip(files, headers) if h.plain_jpeg]
        encoded = [data for data in prepared if data is not None]
        runs.append((f"{name}_decode_only", partial(jpeg.decode, encoded, DEV)))
    runs.append(("gpu_decoder_total", lambda: decoder.decode(items)))
    for label, fn in runs:
        for _ in range(2):
            fn()
        sync()
        start = time.perf_counter()
        for _ in range(3):
            fn()
        sync()
        timings[f"{label}_ms_per_{batch}"] = (time.perf_counter() - start) / 3 * 1000
    results: dict[str, Any] = {"batch_size": batch, "producer": timings}
    configs = size(
        [("cpu", CORES), ("cuda", CORES), ("cuda", 4)],
        [("cpu", 2), ("cuda", 2)],
    )
    for decode_on, workers in configs:
        if CUDA:
            torch.cuda.reset_peak_memory_stats(DEV)
        loader = DataLoaderX(
            folder(tf), batch_size=batch, num_workers=workers, pin_memory=True, persistent_workers=True,
            drop_last=True, normalize=(MEAN, STD), decode_on=decode_on, device=DEV,
        )  # fmt: skip
        rates = []
        for _epoch in range(2):  # the first starts the workers
            sync()
            start, count = time.perf_counter(), 0
            for images, _labels in loader:
                count += images.shape[0]
            sync()
            rates.append(count / (time.perf_counter() - start))
        results[f"decode_on_{decode_on}_w{workers}"] = {
            "images_per_s_by_epoch": rates,
            **gpu_memory(),
            **loader_figures(loader),
        }
        del loader
        gc.collect()
    return results


# ---------------------------------------------------------------- fraction of a fixed GPU step spent waiting for data
def wait_fraction() -> dict[str, Any]:
    import torchvision
    from torchvision import transforms as tv

    step_ms = float(os.environ.get("GLC_STEP_MS", size(30.0, 5.0)))
    workers = size(min(8, CORES), 2)
    common: dict[str, Any] = dict(
        batch_size=size(256, 16), num_workers=workers, pin_memory=True, persistent_workers=True, drop_last=True
    )
    tv_tf = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(), tv.Normalize(MEAN, STD)])
    fl_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    loaders: dict[str, Callable[[], Any]] = {
        "torch_dataloader_torchvision": lambda: DataLoader(torchvision.datasets.ImageFolder(SAMPLE, tv_tf), **common),
        "dataloaderx_decode_cpu": lambda: DataLoaderX(folder(fl_tf), normalize=(MEAN, STD), device=DEV, **common),
        "dataloaderx_decode_cuda": lambda: DataLoaderX(
            folder(fl_tf), normalize=(MEAN, STD), decode_on="cuda", device=DEV, **common
        ),
    }

    def step(images: torch.Tensor) -> None:
        images = images.to(DEV, non_blocking=True)
        if CUDA:
            gpu_sleep(step_ms)
            images.float().mean().item()  # the loop waits for each step (loss.item()): waiting in next() is data time
        else:
            time.sleep(step_ms / 1000)

    results: dict[str, Any] = {"step_ms": step_ms, "num_workers": workers}
    for name, make in loaders.items():
        loader = make()
        for _ in loader:  # warm-up epoch: workers, page cache
            pass
        waited, count, start = 0.0, 0, time.perf_counter()
        iterator = iter(loader)
        while True:
            asked = time.perf_counter()
            try:
                images, _labels = next(iterator)
            except StopIteration:
                break
            waited += time.perf_counter() - asked
            count += images.shape[0]
            step(images)
        epoch = time.perf_counter() - start
        results[name] = {"wait_fraction": waited / epoch, "images_per_s": count / epoch, "epoch_s": epoch}
        if isinstance(loader, DataLoaderX):
            results[name]["loader_stats_with_warm_up"] = loader_figures(loader)
        del iterator, loader
        gc.collect()
    return results


# ---------------------------------------------------------------- CPU pipeline scaling over workers
def worker_memory() -> dict[str, Any]:
    """Mean USS / PSS (MiB) of this process's child processes (the loader's workers)."""
    try:
        import psutil
    except ImportError:
        return {"worker_memory": "psutil missing"}
    uss, pss = [], []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            info = child.memory_full_info()
            uss.append(info.uss / 2**20)
            pss.append(info.pss / 2**20)
    if not uss:
        return {"workers_seen": 0}
    return {"workers_seen": len(uss), "worker_uss_mib": sum(uss) / len(uss), "worker_pss_mib": sum(pss) / len(pss)}


def scaling() -> dict[str, Any]:
    import torchvision
    from torchvision import transforms as tv

    batch = size(64, 8)
    counts = size([w for w in (1, 2, 4, 8, 16) if w <= CORES], [1, 2])
    tv_tf = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.PILToTensor()])
    fl_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    results: dict[str, Any] = {"batch_size": batch, "pipeline": "RandomResizedCrop(224) + flip, uint8, on the CPU"}
    for workers in counts:
        sampler = range(batch * max(4, 3 * workers))  # each worker makes 3 batches: the tail stays small
        common: dict[str, Any] = dict(batch_size=batch, num_workers=workers, sampler=sampler, persistent_workers=True)
        for name in ("torch", "fastloader"):
            if name == "torch":
                loader: Any = DataLoader(torchvision.datasets.ImageFolder(SAMPLE, tv_tf), **common)
            else:
                loader = DataLoaderX(folder(fl_tf), device="cpu", **common)
            for _ in loader:  # warm-up epoch: starts the workers
                pass
            start, count = time.perf_counter(), 0
            for images, _labels in loader:
                count += images.shape[0]
            rate = count / (time.perf_counter() - start)
            results[f"{name}_w{workers}"] = {"images_per_s": rate, **worker_memory()}
            del loader
            gc.collect()
    return results


STEPS: dict[str, Callable[[], dict[str, Any]]] = {
    "sample": sample,
    "env": env,
    "pytest": pytest,
    "decode_race": decode_race,
    "decode_equality": decode_equality,
    "corrupt": corrupt,
    "rng": rng,
    "graph_thread_local": lambda: graph("thread_local"),
    "graph_global": lambda: graph("global"),
    "copy_race": copy_race,
    "ring": ring,
    "throughput": throughput,
    "wait_fraction": wait_fraction,
    "scaling": scaling,
}


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in STEPS:
        print(f"usage: python {sys.argv[0]} STEP   (one of: {', '.join(STEPS)})", file=sys.stderr)
        return 2
    name = sys.argv[1]
    OUT.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        data = STEPS[name]()
    except Exception:  # noqa: BLE001
        record(name, {"crashed": traceback.format_exc()[-3000:], "s": time.perf_counter() - start})
        return 1
    record(name, {**data, "s": time.perf_counter() - start})
    return 0


if __name__ == "__main__":
    sys.exit(main())
