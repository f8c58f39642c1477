"""The verdict: is training waiting for data, which stage is the limit, and what to do about it.

The grade comes from the training loop's wait fraction, with the thresholds of TensorFlow's input
pipeline analyser: under 5% of its time waiting, *not input-bound*; 5 to 20%, *moderately*; 20% or
more, *highly input-bound*.

The limit is found by capacity, not by the largest number: worker stages (read, decode, transform,
the rest of the dataset, collate) run in parallel on ``min(num_workers, usable cores)`` processes,
while the hand-off, pinning and the copy run one batch at a time in the main process. The side with
the lower images/s capacity is the limit; its slowest stage is named, with one next step drawn from
the figures.

Besides the wait, the step: a training step that is slower with the loader running than alone (the doctor times
it both ways; ``step_alone_ms``) is slowed by the loader's work in the training process (its threads, the
hand-off), which competes with the step's launches for the interpreter and the cores. The next step then is
``worker_method="subprocess"``, which leaves the training process only the taking of finished batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fastloader.timing import MAIN_STAGES, WORKER_STAGES

MODERATE, HIGH = 0.05, 0.20
NOT_BOUND, MODERATELY, HIGHLY = "not input-bound", "moderately input-bound", "highly input-bound"
BUSY = 0.85  # mean use of the usable cores above which "every core is busy"
# Mean use of the usable cores by other work, before the loader ran, above which its figures (and
# num_workers='auto''s trials) say more about the neighbours than about the pipeline.
NOISY = 0.25
SLOWED = 1.10  # the step with the loader running over the step alone, above which the loader slows the step


@dataclass(frozen=True)
class Setting:
    """What the verdict needs to know of the loader and the machine besides the stage times."""

    num_workers: int
    usable_cores: int
    pin_memory: bool = False
    to_gpu: bool = False
    cores_busy: float | None = None  # mean use of the usable cores, 0..1, over the measured time
    small_files: bool = False  # an image folder or file list: one file per image
    # decode_on="cuda": the decoder's counts (fastloader.image.gpu_decode.DecodeCounts); the decode then
    # runs in the producer thread and is timed as part of h2d
    gpu_decode: Mapping[str, int] | None = None
    # num_workers="auto" measured this number: more workers did not pay in its trials, so advising
    # more would contradict the measurement
    measured_workers: bool = False
    # mean use of the usable cores, 0..1, just before the loader started (other processes' work): the doctor's
    # measure of how far its figures can be trusted; None: not measured
    busy_before: float | None = None
    worker_method: str = "process"  # where the workers ran (DataLoaderX's worker_method)
    # the training step's time (ms) measured alone, with the loader idle (the doctor's real step); None: unknown
    step_alone_ms: float | None = None


@dataclass
class Verdict:
    level: str
    wait_fraction: float | None
    bottleneck: str | None
    summary: str
    advice: list[str] = field(default_factory=list)
    capacity: dict[str, float | None] = field(default_factory=dict)  # images/s the workers / main could give

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def grade(wait_fraction: float | None) -> str:
    if wait_fraction is None or wait_fraction < MODERATE:
        return NOT_BOUND
    return MODERATELY if wait_fraction < HIGH else HIGHLY


def judge(summary: Mapping[str, Any], setting: Setting) -> Verdict:
    """The verdict on ``summary`` (``StageStats.summary()``, or the doctor's)."""
    stages: Mapping[str, Any] = summary.get("stages", {})
    cost = {name: (stages.get(name) or {}).get("per_image_ms") or 0.0 for name in WORKER_STAGES + MAIN_STAGES}
    wait = summary.get("wait_fraction")
    level = grade(wait)
    parallel = max(1, min(setting.num_workers, setting.usable_cores))
    worker_ms = sum(cost[s] for s in WORKER_STAGES)
    main_ms = sum(cost[s] for s in MAIN_STAGES)
    if setting.num_workers == 0:  # everything runs one image at a time in the main process
        worker_capacity = main_capacity = _rate(worker_ms + main_ms)
    else:
        worker_capacity, main_capacity = _rate(worker_ms / parallel), _rate(main_ms)
    capacity = {"workers": worker_capacity, "main": main_capacity}
    side: tuple[str, ...]
    if setting.num_workers > 0 and main_ms > 0 and (worker_ms == 0 or main_ms > worker_ms / parallel):
        side = MAIN_STAGES
    else:
        side = WORKER_STAGES if setting.num_workers > 0 else WORKER_STAGES + MAIN_STAGES
    bottleneck = max(side, key=lambda s: cost[s]) if any(cost[s] > 0 for s in side) else None
    share = f"{100 * wait:.0f}%" if wait is not None else "an unknown share"
    caution = _caution(setting)
    slowed = _step_slowed(stages, setting)
    if level == NOT_BOUND:
        keeps_up = ["nothing to do on the input side: the loader keeps up"] if wait is not None else []
        return Verdict(
            level,
            wait,
            "step" if wait is not None else bottleneck,
            f"not input-bound: the training loop waits {share} of its time; the step is the limit",
            (slowed or keeps_up) + caution,
            capacity,
        )
    where = "in the main process" if bottleneck in MAIN_STAGES else "in the workers"
    text = f"{level}: the training loop waits {share} of its time"
    if bottleneck is not None:
        text += f"; {bottleneck} is the slowest stage ({cost[bottleneck]:.2f} ms/image {where})"
    return Verdict(level, wait, bottleneck, text, _advice(bottleneck, setting) + slowed + caution, capacity)


def _step_slowed(stages: Mapping[str, Any], setting: Setting) -> list[str]:
    """The subprocess pipeline, when the step (its median per batch, as the stage clock saw it) was more than
    :data:`SLOWED` times its time alone, and the loader's work ran in the training process."""
    alone = setting.step_alone_ms
    per_batch = (stages.get("step") or {}).get("per_batch_ms") or {}
    running = per_batch.get("p50")
    if not alone or running is None or setting.num_workers == 0 or setting.worker_method == "subprocess":
        return []
    if running <= SLOWED * alone:
        return []
    return [
        f"the training step takes {running / alone:.2f}x as long with the loader running ({running:.1f} ms) as"
        f" alone ({alone:.1f} ms): the loader's work in the training process competes with it;"
        " worker_method='subprocess' runs the whole pipeline in one child process, and only finished batches"
        " cross"
    ]


def _caution(setting: Setting) -> list[str]:
    """Said with any advice when other work kept the cores busy: the figures, and so the advice, may not hold."""
    if setting.busy_before is None or setting.busy_before <= NOISY:
        return []
    measured = ", num_workers='auto''s choice among them," if setting.measured_workers else ""
    return [
        f"the machine was busy with other work ({setting.busy_before:.0%} of the usable cores before the run):"
        f" these figures{measured} may not hold on a quiet machine; measure again when it is idle"
    ]


def _rate(ms_per_image: float) -> float | None:
    return 1000.0 / ms_per_image if ms_per_image > 0 else None


def _advice(bottleneck: str | None, setting: Setting) -> list[str]:
    cores = setting.usable_cores
    idle = setting.num_workers < cores or (setting.cores_busy is not None and setting.cores_busy < BUSY)
    idle = idle and not setting.measured_workers
    more_workers = (
        f"more workers: num_workers={max(cores, setting.num_workers + 1)} (or num_workers='auto', which measures)"
    )
    if bottleneck is None:
        return [more_workers] if idle else []
    if setting.num_workers == 0 and cores > 1:
        return [f"decode in parallel: num_workers={cores} (or 'auto'); now everything runs in the training process"]
    if bottleneck == "read":
        if setting.small_files:
            return ["many small files: `fastloader pack` them into an LMDB or tar shards (sequential reads)"]
        advice = ["storage is the limit: faster or local storage (copy the packed dataset to local disk)"]
        return advice + ([more_workers + " to hide read latency"] if idle else [])
    if bottleneck in ("decode", "transform", "dataset"):
        if idle:
            return [more_workers]
        workers = f"{setting.num_workers} worker{'' if setting.num_workers == 1 else 's'}"
        busy = (
            f"num_workers='auto' measured that more than {workers} do not pay here"
            if setting.measured_workers and setting.num_workers < cores
            else "every core is busy"
        )
        return [
            f"{busy}: pack with `fastloader pack --resize-max-side 256` (smaller JPEGs decode faster),"
            " or decode on the GPU with decode_on='cuda'"
            + ("; fastloader.transforms fuse the crop and resize with the decode" if bottleneck == "transform" else "")
        ]
    if bottleneck == "collate":
        return [
            "collate is the limit: fastloader datasets with fastloader.transforms hand over pre-assembled uint8"
            " batches (no per-sample tensors to stack)"
        ]
    if bottleneck in ("handoff", "pin"):
        return [
            "the hand-off to the training process is the limit: send uint8 batches (fastloader.transforms, and"
            " normalize=(mean, std) on DataLoaderX normalizes after the copy): 4x fewer bytes than float32"
        ]
    # h2d: the copy to the GPU (and, with decode_on="cuda", the decode)
    if setting.gpu_decode is not None:
        return [_gpu_decode_advice(setting.gpu_decode)]
    if not setting.pin_memory:
        return ["the copy is not overlapped: pin_memory=True lets it run on the side stream while the GPU computes"]
    return ["the copy to the GPU is the limit: send uint8 batches (4x fewer bytes than float32), normalize on the GPU"]


def _gpu_decode_advice(counts: Mapping[str, int]) -> str:
    """What to do when the GPU decode (nvJPEG, then crop and resize, in the producer thread) is the limit."""
    images = counts.get("images", 0)
    on_cpu = counts.get("on_cpu", 0) + counts.get("bad", 0)
    if images and on_cpu / images > 0.02:
        return (
            f"GPU decode: {on_cpu} of {images} images ({on_cpu / images:.0%}) were decoded on the CPU, one at a time"
            " in the training process (CMYK, PNG, truncated or refused by nvJPEG): re-encode them as plain JPEGs"
            " (`fastloader pack --quality 90` re-encodes every image)"
        )
    if counts.get("batch_retries", 0):
        return (
            f"GPU decode: {counts['batch_retries']} batches were retried image by image after nvJPEG failed them:"
            " `fastloader scan` lists the bad files, and an exclusion list skips them without reading"
        )
    return (
        "GPU decode is the limit (nvJPEG, crop and resize in the loader's thread, timed as h2d): larger batches"
        " amortise it; if the cores have room, decode_on='cpu' with more workers"
    )
