"""``fastloader doctor PATH``: the whole check-up of a dataset on disk, as one result dict and as text.

It opens PATH as ``fastloader pack`` does (folder, file list, LMDB, RecordIO, TFRecord, tar shards),
builds the pipeline the flags describe (default: a train pipeline, RandomResizedCrop(224) + flip,
uint8 batches normalized after the copy, as DataLoaderX runs it), and measures in turn: the storage
(sequential and random reads), the loader (``diagnose``: stages, throughput, CPU, memory, GPU), and
the machine's traps (``environment``). The verdict closes the result.

Real datasets hold bad files: the dataset runs under ``on_error="replace"`` (a bad sample is replaced by
the next good one), and the result counts them (``bad_samples``, the first few in ``bad_examples``);
the storage test passes over files it cannot read (``unreadable``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

import fastloader
from fastloader.doctor.diagnose import diagnose
from fastloader.doctor.environment import environment
from fastloader.doctor.pipelines import MEAN, STD, bad_sample_lines, bad_samples_found, fastloader_transform
from fastloader.doctor.storage import read_speed


def checkup(
    path: str,
    *,
    src_format: str = "auto",
    root: str | None = None,
    batch_size: int = 64,
    num_workers: int | str = "auto",
    transform: str = "train",
    decode_on: str = "cpu",
    step_ms: float = 0.0,
    batches: int = 60,
    seconds: float = 60.0,
    storage: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Measure ``path`` with this pipeline; the result is what ``fastloader doctor --json`` prints.
    ``progress``: a bar of the measured batches on stderr."""
    from fastloader import DataLoaderX
    from fastloader.datasets import ImageDataset
    from fastloader.datasets.sources import open_source

    source, kind = open_source(path, src_format, root=root)
    if len(source) == 0:
        raise ValueError(f"{path}: the dataset is empty")
    cuda = torch.cuda.is_available()
    dataset: ImageDataset[Any] = ImageDataset(source, transform=fastloader_transform(transform))
    scratch = tempfile.TemporaryDirectory(prefix="fastloader-doctor-")  # the quarantine: bad samples counted there
    dataset.set_error_policy("replace", quarantine=os.path.join(scratch.name, "quarantine.tsv"))
    loader = DataLoaderX(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        pin_memory=cuda,
        normalize=(MEAN, STD),
        decode_on=decode_on,
    )
    reads = read_speed(source) if storage else None
    with scratch:
        result = diagnose(
            loader,
            batches=batches,
            seconds=seconds,
            step_ms=step_ms,
            small_files=kind in ("folder", "list"),
            progress=progress,
        )
        result.update(bad_samples_found(dataset.error_policy))
    env, traps = environment(_batch_bytes(batch_size), int(loader.num_workers), loader.prefetch_factor)
    return {
        "fastloader_version": fastloader.__version__,
        "created": result.pop("created"),
        "dataset": {"path": path, "format": kind, "images": len(source)},
        "config": {
            "batch_size": batch_size,
            "num_workers": int(loader.num_workers),
            "num_workers_asked": str(num_workers),
            "prefetch_factor": loader.prefetch_factor,
            "transform": transform,
            "decode_on": decode_on,
            "step_ms": step_ms,
            "pin_memory": loader.pin_memory,
            "device": str(loader.device),
        },
        "environment": env,
        "traps": traps,
        "storage": reads,
        **result,
    }


def _batch_bytes(batch_size: int) -> int:
    """Bytes of one uint8 224x224 RGB batch as the workers hand it over."""
    return batch_size * 3 * 224 * 224


def format_text(result: dict[str, Any]) -> str:
    """The check-up as a person reads it: the stage table, rates, traps, then the verdict and advice."""
    lines = []
    data, config = result["dataset"], result["config"]
    lines.append(
        f"fastloader doctor: {data['path']} ({data['format']}, {data['images']} images); batch {config['batch_size']},"
        f" {config['num_workers']} worker{'' if config['num_workers'] == 1 else 's'} ({config['num_workers_asked']}),"
        f" {config['transform']} pipeline,"
        f" step {config['step_ms']:g} ms, device {config['device']}"
    )
    lines.append("")
    header = f"{'stage':<10} {'where':<14} {'ms/image':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'total s':>8}"
    lines.append(header)
    for name, stage in result["stages"].items():
        per_batch = stage.get("per_batch_ms") or {}
        lines.append(
            f"{name:<10} {stage['where']:<14} {_num(stage.get('per_image_ms'), 3):>9} {_num(per_batch.get('p50')):>8}"
            f" {_num(per_batch.get('p90')):>8} {_num(per_batch.get('p99')):>8} {_num(stage.get('total_s'), 2):>8}"
        )
    rate = result["throughput"]
    lines.append("")
    lines.append(
        f"end to end: {_num(rate['images_per_s'], 0)} images/s ({rate['images']} images in {rate['seconds']:.1f} s);"
        f" the training loop waited {_percent(rate['wait_fraction'])} of its time"
    )
    storage = result.get("storage")
    if storage:
        for order in ("sequential", "random"):
            reads = storage[order]
            lines.append(
                f"storage, {order} reads: {_num(reads['mb_per_s'], 1)} MB/s, {_num(reads['files_per_s'], 0)} files/s"
            )
    cpu = result["cpu"]["per_core_percent_mean"]
    if cpu:
        lines.append("CPU per core: " + " ".join(f"{value:.0f}%" for value in cpu))
    if result["environment"].get("gil"):
        lines.append(f"GIL: {result['environment']['gil']}")
    if result.get("gpu"):
        lines.append(f"GPU: {result['gpu']['name']}, {result['gpu']['utilization_percent_mean']:.0f}% busy")
    tuned = result.get("autotune")
    if tuned:
        trials = ", ".join(f"{t['num_workers']}: {t['images_per_s']:.0f}/s" for t in tuned["trials"])
        lines.append(f"num_workers='auto' chose {tuned['num_workers']} ({trials})")
    lines += bad_sample_lines(result)
    for trap in result["traps"]:
        lines.append(f"warning: {trap['message']}\n  fix: {trap['fix']}")
    verdict = result["verdict"]
    lines.append("")
    lines.append(f"verdict: {verdict['summary']}")
    for advice in verdict["advice"]:
        lines.append(f"  -> {advice}")
    return "\n".join(lines)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
