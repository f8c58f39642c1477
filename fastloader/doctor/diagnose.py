"""Run a loader for a while and say where its time goes: the measurement behind ``fastloader doctor``.

:func:`diagnose` drives a :class:`~fastloader.DataLoaderX` for a number of batches, with a simulated
training step when asked (``step_ms``: the CPU waits as it would for the GPU; or any ``step(batch)``),
while a sampling thread records each usable core's use, the memory of the training process and its
workers, and the GPU's use (NVML, when CUDA and ``pynvml`` are present). The loader's own stage
clock gives the stages (``loader.stats()``); the verdict comes from ``fastloader.loader.verdict``.

With a real ``step``, it is timed again once the loader is idle (:func:`_step_alone_ms`): a step slower with the
loader running than alone is the verdict's sign that the loader's work in the training process slows it.

Without a training step the loop only waits, so the grade says nothing; the result then says what
the loader alone delivers, and how long a step may be before training stops waiting for data.
"""

from __future__ import annotations

import datetime
import sys
import threading
import time
from collections.abc import Callable
from statistics import median
from typing import Any

from fastloader import world
from fastloader.loader.cpu_use import CpuMeter, mean
from fastloader.loader.dataloader import DataLoaderX
from fastloader.loader.verdict import Setting, judge

LOADER_ONLY = "loader only (no training step)"
SAMPLE_S = 0.25  # how often CPU, memory and GPU use are sampled
BEFORE_S = 0.5  # how long the cores' use by other work is read before the loader starts
STEP_ALONE_RUNS = 5  # runs of the real training step on a kept batch, the loader idle (the median is taken)


class _Sampler(threading.Thread):
    """Samples per-core CPU use, memory and GPU use every ``SAMPLE_S`` seconds until stopped."""

    def __init__(self) -> None:
        super().__init__(name="fastloader-doctor-sampler", daemon=True)
        import psutil

        self._psutil = psutil
        self._stop_event = threading.Event()
        self._meter = CpuMeter()
        self.started_at = time.monotonic()
        self.cpu: list[dict[str, Any]] = []
        self.gpu: list[dict[str, float]] = []
        self.peak_rss = 0

    def run(self) -> None:
        while not self._stop_event.wait(SAMPLE_S):
            t = time.monotonic() - self.started_at
            per_core = [100 * share for share in self._meter.read()]
            if per_core:
                self.cpu.append({"t": t, "per_core": per_core})
            self.peak_rss = max(self.peak_rss, self._rss())
            utilization = _gpu_utilization()
            if utilization is not None:
                self.gpu.append({"t": t, "utilization_percent": utilization})

    def _rss(self) -> int:
        me = self._psutil.Process()
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except self._psutil.Error:
                pass
        return int(total)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _gpu_utilization() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return float(torch.cuda.utilization())
    except Exception:  # noqa: BLE001 - NVML (pynvml) missing or not answering: no GPU figures
        return None


def diagnose(
    loader: DataLoaderX[Any],
    *,
    batches: int = 60,
    seconds: float = 60.0,
    step_ms: float = 0.0,
    step: Callable[[Any], None] | None = None,
    small_files: bool | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``loader`` for ``batches`` batches (more epochs if needed; at most ``seconds``) and measure it.

    ``step_ms`` simulates a training step per batch; ``step(batch)`` runs a real one instead.
    ``small_files``: one file per image (an image folder or a file list); None: told by the dataset.
    ``progress``: a bar of the measured batches on stderr (the run takes up to ``seconds``).
    Returns the doctor's result (the dict ``fastloader doctor --json`` prints; see ``doctor.schema``).
    """
    if not isinstance(loader, DataLoaderX):
        raise TypeError(f"diagnose needs a fastloader.DataLoaderX (its stage clock), got {type(loader).__name__}")
    if batches < 1:
        raise ValueError(f"batches must be >= 1, got {batches}")
    from tqdm import tqdm

    busy_before = _busy_before()  # before iter(): num_workers='auto' measures there, and needs quiet cores
    bar = tqdm(total=batches, unit="batch", desc="doctor", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    sampler = _Sampler()
    sampler.start()
    began = time.perf_counter()
    done = 0
    kept: Any = None
    try:
        while done < batches and time.perf_counter() - began < seconds:
            for batch in loader:
                if step is not None:
                    step(batch)
                    kept = batch
                elif step_ms:
                    time.sleep(step_ms / 1000)
                done += 1
                bar.update(1)
                if done >= batches or time.perf_counter() - began >= seconds:
                    break
    finally:
        bar.close()
        sampler.stop()
    wall = time.perf_counter() - began
    step_alone_ms = _step_alone_ms(step, kept) if step is not None and kept is not None else None
    stats = loader.stats()
    per_core_mean = _per_core_mean(sampler.cpu)
    busy = mean(per_core_mean)
    if small_files is None:
        small_files = type(getattr(loader.dataset, "source", None)).__name__ in ("FolderSource", "FileListSource")
    setting = doctor_setting(
        loader, stats, busy / 100 if busy is not None else None, small_files, busy_before, step_alone_ms
    )
    verdict = judge(stats, setting).to_dict()
    if step is None and not step_ms:
        verdict["level"] = LOADER_ONLY
        verdict["summary"] = _loader_only(stats, verdict)
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "stages": stats["stages"],
        "throughput": {
            "images_per_s": stats["images_per_s"],  # the training loop's rate (an autotune before is not in it)
            "batches": stats["batches"],
            "images": stats["images"],
            "seconds": wall,
            "wait_fraction": stats["wait_fraction"],
        },
        "timeline": _since(stats["timeline"], sampler.started_at - loader._stage_stats.started),
        "queues": stats["queues"],
        "cpu": {
            "per_core_percent_mean": per_core_mean,
            "timeline": sampler.cpu,
            "rss_bytes": sampler.peak_rss,
            "busy_before_percent": 100 * busy_before if busy_before is not None else None,
        },
        "gpu": _gpu_summary(sampler.gpu),
        "autotune": stats.get("autotune"),
        "bad_samples": stats.get("bad_samples", 0),
        "verdict": verdict,
    }


def doctor_setting(
    loader: DataLoaderX[Any],
    stats: dict[str, Any],
    cores_busy: float | None,
    small_files: bool,
    busy_before: float | None,
    step_alone_ms: float | None = None,
) -> Setting:
    """What the verdict weighs, from this run's own measurement (``loader.stats()``): the workers it ran, and
    whether num_workers='auto' chose them by its trials."""
    return Setting(
        num_workers=int(stats.get("num_workers", loader.num_workers)),
        usable_cores=world.cores_per_rank(),
        pin_memory=loader.pin_memory,
        to_gpu=loader.device.type == "cuda",
        cores_busy=cores_busy,
        small_files=small_files,
        measured_workers=measured_by_auto(stats.get("autotune")),
        busy_before=busy_before,
        worker_method=str(getattr(loader, "worker_method", "process")),
        step_alone_ms=step_alone_ms,
    )


def _step_alone_ms(step: Callable[[Any], None], batch: Any, runs: int = STEP_ALONE_RUNS) -> float:
    """The median time (ms) of ``step(batch)`` once the loader is idle (its epoch over or broken off): what the
    stage clock's step time is compared with, to see whether the loader slows the step."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step(batch)
        times.append(1000 * (time.perf_counter() - start))
    return float(median(times))


def measured_by_auto(autotune: dict[str, Any] | None) -> bool:
    """Whether num_workers='auto' chose the number by its trials (``stats()["autotune"]``): then more workers
    did not pay in this run, and the advice must not say they would."""
    return autotune is not None and str(autotune.get("reason", "")).startswith("measured")


def _busy_before() -> float | None:
    """The usable cores' mean use (0..1) over ``BEFORE_S`` while fastloader does nothing: other work's share."""
    meter = CpuMeter()
    time.sleep(BEFORE_S)
    return mean(meter.read())


def _since(points: list[dict[str, float]], origin: float) -> list[dict[str, float]]:
    """The loader's timeline on the sampler's clock (both count from their own start, in monotonic time)."""
    return [{**point, "t": point["t"] - origin} for point in points]


def _per_core_mean(samples: list[dict[str, Any]]) -> list[float]:
    rows = [row["per_core"] for row in samples if row["per_core"]]
    if not rows:
        return []
    width = min(len(row) for row in rows)
    return [sum(row[i] for row in rows) / len(rows) for i in range(width)]


def _gpu_summary(samples: list[dict[str, float]]) -> dict[str, Any] | None:
    if not samples:
        return None
    import torch

    values = [row["utilization_percent"] for row in samples]
    return {
        "name": torch.cuda.get_device_name(),
        "utilization_percent_mean": sum(values) / len(values),
        "timeline": samples,
    }


def _loader_only(stats: dict[str, Any], verdict: dict[str, Any]) -> str:
    rate, batches, images = stats.get("images_per_s"), stats.get("batches") or 0, stats.get("images") or 0
    if not rate or not batches:
        return "the loader delivered no batch"
    batch_ms = 1000 * images / batches / rate
    text = (
        f"the loader alone delivers {rate:.0f} images/s, a batch every {batch_ms:.1f} ms: a training step longer"
        " than that does not wait for data (pass --step-ms for a verdict on your step)"
    )
    if verdict.get("bottleneck"):
        cost = (stats["stages"].get(verdict["bottleneck"]) or {}).get("per_image_ms")
        where = (stats["stages"].get(verdict["bottleneck"]) or {}).get("where", "")
        text += f"; {verdict['bottleneck']} is the slowest stage" + (
            f" ({cost:.2f} ms/image in the {where})" if cost is not None else ""
        )
    return text
