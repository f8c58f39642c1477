"""``fastloader bench PATH``: torch's stock pipeline against DataLoaderX on the user's own data, as a ratio.

::

    from fastloader.doctor.bench import bench, format_text
    result = bench("imagenet/train", num_workers=8)
    print(format_text(result))  # DataLoaderX: x1.83 the images/s of torch's DataLoader (...)

The two pipelines (the same geometry, batch size, workers, order and ``pin_memory``):

* stock, what users run today: ``torchvision.datasets.ImageFolder`` for an image folder; for every other
  format (torchvision reads none of them) a plain ``Dataset`` over fastloader's source doing
  ``PIL.Image.open(bytes).convert("RGB")``; then torchvision's transforms, ``ToTensor`` and ``Normalize``,
  through ``torch.utils.data.DataLoader`` (batches moved to the GPU in the loop, when there is one).
* fastloader: ``ImageDataset`` / ``ImageFolder`` with the same ``fastloader.transforms`` geometry (decoded
  at the size it needs, uint8 batches) through ``DataLoaderX(normalize=(mean, std))``.

Real datasets hold bad files: both pipelines replace a sample that cannot be read or decoded by the next
good one (fastloader's ``on_error="replace"``; the same rule wrapped around the stock dataset), and the
result counts them (``bad_samples``, the first few named in ``bad_examples``). FIFOs, devices and sockets
in an image folder are samples of neither (fastloader's ImageFolder skips them, torchvision's is given a
filter that does): opening one would wait forever.

Method (as ``benchmarks/bench_pipeline.py``): one untimed round of both (page cache, indexes, lazily
built state), then ``repeats`` rounds, stock then fastloader; medians. A run creates its loader, takes
one warm-up batch (it pays the worker start-up: reported as the first-batch latency, not counted in the
rate), then times ``batches`` batches, sleeping ``step_ms`` after each as a GPU step makes the CPU
wait. Each run reads its own indices (a fresh shuffle, or in order from its own offset): on a dataset
larger than the page cache no run reads images an earlier run left in memory. A dataset smaller than a
run is read epoch after epoch without a break (the indices of one run, concatenated), so that worker
start-up is paid once per run, by the warm-up batch.
"""

from __future__ import annotations

import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from fastloader.datasets.folder_index import IMG_EXTENSIONS
from fastloader.doctor.pipelines import (
    MEAN,
    PIPELINES,
    STD,
    bad_sample_lines,
    bad_samples_found,
    fastloader_transform,
    torchvision_geometry,
)

_NEEDS_TORCHVISION = "fastloader bench needs torchvision: pip install fastloader[vision]"


class RunIndices(Sampler[int]):
    """The ``count`` dataset indices of run number ``run``: torch's shuffle (``randperm`` per epoch,
    epochs back to back) seeded by the run, or the dataset in order starting where run ``run - 1``
    stopped. Given to both loaders, so that both shuffle the same way."""

    def __init__(self, size: int, count: int, shuffle: bool, run: int) -> None:
        self.size, self.count, self.shuffle, self.run = size, count, shuffle, run

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            start = self.run * self.count
            return ((start + i) % self.size for i in range(self.count))
        generator = torch.Generator().manual_seed(self.run)
        epochs = -(-self.count // self.size)
        order = torch.cat([torch.randperm(self.size, generator=generator) for _ in range(epochs)])
        return iter(order[: self.count].tolist())

    def __len__(self) -> int:
        return self.count


class StockDataset(Dataset[tuple[Any, int]]):
    """What a user writes for a format torchvision cannot read: bytes -> PIL -> torchvision transforms."""

    def __init__(self, source: Any, transform: Callable[[Any], Any]) -> None:
        self.source = source
        self.transform = transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        image = Image.open(io.BytesIO(self.source.read(index))).convert("RGB")
        return self.transform(image), self.source.label(index)


class Replacing(Dataset[Any]):
    """The stock dataset with a bad sample replaced by the next good one, as fastloader's ``replace``
    does (index + 1, + 2, ...): one bad file must end neither pipeline's run."""

    def __init__(self, dataset: Any, tries: int = 16) -> None:
        self.dataset, self.tries = dataset, tries

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        for step in range(self.tries):
            try:
                return self.dataset[(index + step) % len(self.dataset)]
            except Exception:  # noqa: BLE001 - any failure of one sample is that sample's, as under replace
                pass
        return self.dataset[(index + self.tries) % len(self.dataset)]  # the last try raises, naming its file


def regular_image_file(path: str) -> bool:
    """torchvision's ImageFolder filter (its extensions), FIFOs, devices and sockets left out."""
    return path.lower().endswith(IMG_EXTENSIONS) and os.path.isfile(path)


def _versions() -> tuple[str, str]:
    try:
        import torchvision
    except ImportError as error:
        raise RuntimeError(_NEEDS_TORCHVISION) from error
    return torch.__version__, torchvision.__version__


def _datasets(path: str, src_format: str, root: str | None, pipeline: str) -> tuple[str, Any, Any, str, str]:
    """(source kind, stock dataset, fastloader dataset, and how each is built, in words)."""
    import torchvision
    from torchvision import transforms as tv

    from fastloader.datasets import ImageDataset, ImageFolder
    from fastloader.datasets.sources import open_source

    source, kind = open_source(path, src_format, root=root)  # names the path when it cannot be read
    ours = fastloader_transform(pipeline)
    theirs = tv.Compose([*torchvision_geometry(pipeline), tv.ToTensor(), tv.Normalize(MEAN, STD)])
    if kind == "folder":
        stock = torchvision.datasets.ImageFolder(path, transform=theirs, is_valid_file=regular_image_file)
        return kind, stock, ImageFolder(path, transform=ours), "torchvision ImageFolder", "fastloader ImageFolder"
    return kind, StockDataset(source, theirs), ImageDataset(source, transform=ours), "PIL Dataset", "ImageDataset"


def _run(
    make_loader: Callable[[Sampler[int]], Any], indices: Sampler[int], batches: int, step_s: float
) -> dict[str, float]:
    """One run: a new loader, one warm-up batch, then ``batches`` timed batches."""
    device = torch.device("cuda") if torch.cuda.is_available() else None
    start = time.perf_counter()
    iterator = iter(make_loader(indices))
    next(iterator)  # pays worker start-up (and CUDA set-up): the first-batch latency
    first = time.perf_counter() - start
    seen = 0
    start = time.perf_counter()
    for _ in range(batches):
        images, _ = next(iterator)
        if device is not None:
            images = images.to(device, non_blocking=True)  # DataLoaderX's are there already: a no-op
        seen += images.shape[0]
        if step_s:
            time.sleep(step_s)
    if device is not None:
        torch.cuda.synchronize()  # both copies finished, not only queued
    elapsed = time.perf_counter() - start
    for _ in iterator:  # nothing is left (the sampler holds exactly the run): the loader ends its workers
        pass
    return {"images_per_s": seen / elapsed, "first_batch_s": first, "images": seen}


def _median(runs: list[dict[str, float]], name: str) -> dict[str, Any]:
    return {
        "loader": name,
        "images_per_s": statistics.median(run["images_per_s"] for run in runs),
        "first_batch_s": statistics.median(run["first_batch_s"] for run in runs),
        "runs": runs,
    }


def bench(
    path: str,
    *,
    src_format: str = "auto",
    root: str | None = None,
    batch_size: int = 64,
    num_workers: int | None = None,
    pipeline: str = "train",
    batches: int = 20,
    repeats: int = 2,
    step_ms: float = 0.0,
) -> dict[str, Any]:
    """Measure torch's stock pipeline and DataLoaderX on ``path`` (see the module docstring).

    Returns the settings, ``stock`` and ``fastloader`` (median ``images_per_s`` and ``first_batch_s``,
    and every run) and ``ratio`` (fastloader's images/s over stock's).
    """
    from fastloader import DataLoaderX
    from fastloader.world import suggested_num_workers, usable_cpus

    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {', '.join(PIPELINES)}, got {pipeline!r}")
    for name, value in (("batch_size", batch_size), ("batches", batches), ("repeats", repeats)):
        if value < 1:
            raise ValueError(f"{name} must be 1 or more, got {value}")
    if step_ms < 0:
        raise ValueError(f"step_ms must be 0 or more, got {step_ms}")
    workers = suggested_num_workers() if num_workers is None else num_workers
    if workers < 0:
        raise ValueError(f"num_workers must be 0 or more, got {workers}")
    torch_version, torchvision_version = _versions()
    kind, stock_dataset, our_dataset, stock_name, our_name = _datasets(path, src_format, root, pipeline)
    size = len(our_dataset)
    if size == 0:
        raise ValueError(f"{path}: no images to read")

    shuffle, pin_memory = pipeline == "train", torch.cuda.is_available()

    stock_dataset = Replacing(stock_dataset)
    scratch = tempfile.TemporaryDirectory(prefix="fastloader-bench-")  # the quarantine: bad samples counted there
    our_dataset.set_error_policy("replace", quarantine=os.path.join(scratch.name, "quarantine.tsv"))

    def stock(indices: Sampler[int]) -> DataLoader[Any]:
        return DataLoader(
            stock_dataset, batch_size=batch_size, sampler=indices, num_workers=workers, pin_memory=pin_memory
        )

    def fast(indices: Sampler[int]) -> DataLoaderX[Any]:
        return DataLoaderX(
            our_dataset,
            batch_size=batch_size,
            sampler=indices,
            num_workers=workers,
            pin_memory=pin_memory,
            normalize=(MEAN, STD),
        )

    count = (batches + 1) * batch_size  # + the warm-up batch
    step_s = step_ms / 1000
    runs: dict[str, list[dict[str, float]]] = {"stock": [], "fastloader": []}
    with scratch:
        for round_ in range(repeats + 1):  # round 0: untimed warm-up
            for number, (name, make) in enumerate((("stock", stock), ("fastloader", fast))):
                indices = RunIndices(size, count, shuffle, run=2 * round_ + number)
                run = _run(make, indices, batches, step_s)
                if round_:
                    runs[name].append(run)
        bad = bad_samples_found(our_dataset.error_policy)

    stock_row = _median(runs["stock"], f"torch DataLoader + {stock_name}")
    our_row = _median(runs["fastloader"], f"DataLoaderX + {our_name}")
    return {
        "dataset": path,
        "format": kind,
        "images": size,
        "epochs_per_run": count / size,  # over 1: a small dataset, read again within the run
        "batch_size": batch_size,
        "num_workers": workers,
        "pipeline": pipeline,
        "shuffle": shuffle,
        "pin_memory": pin_memory,
        "device": "cuda" if pin_memory else "cpu",
        "batches": batches,
        "repeats": repeats,
        "step_ms": step_ms,
        "torch": torch_version,
        "torchvision": torchvision_version,
        "usable_cores": usable_cpus(),
        "stock": stock_row,
        "fastloader": our_row,
        "ratio": our_row["images_per_s"] / stock_row["images_per_s"],
        **bad,
    }


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def format_text(result: dict[str, Any]) -> str:
    """The two-row table and the one-line verdict ``fastloader bench`` prints."""
    rows = [result["stock"], result["fastloader"]]
    width = max(len("loader"), *(len(row["loader"]) for row in rows))
    lines = [
        f"{result['dataset']}: {result['format']}, {result['images']} images",
        f"{'loader':<{width}}  {'images/s':>9}  {'first batch':>11}",
        *(f"{row['loader']:<{width}}  {row['images_per_s']:>9.1f}  {row['first_batch_s']:>10.2f}s" for row in rows),
    ]
    step = f", {result['step_ms']:g} ms step" if result["step_ms"] else ""
    lines.append(
        f"DataLoaderX: x{result['ratio']:.2f} the images/s of torch's DataLoader ({result['pipeline']} pipeline, "
        f"batch {result['batch_size']}, {_count(result['num_workers'], 'worker')}, "
        f"{_count(result['usable_cores'], 'usable core')}, "
        f"{result['device']}{step}; median of {result['repeats']} x {result['batches']} batches)"
    )
    lines += bad_sample_lines(result)
    return "\n".join(lines)
