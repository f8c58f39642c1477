"""The verdict: the grade from the wait, the limit by capacity, and one next step drawn from the figures."""

from __future__ import annotations

from typing import Any

import pytest

from fastloader.loader.verdict import HIGHLY, MODERATELY, NOT_BOUND, Setting, grade, judge


def summary(wait: float, **per_image_ms: float) -> dict[str, Any]:
    return {"wait_fraction": wait, "stages": {name: {"per_image_ms": ms} for name, ms in per_image_ms.items()}}


@pytest.mark.parametrize(
    ("wait", "level"), [(None, NOT_BOUND), (0.0, NOT_BOUND), (0.049, NOT_BOUND), (0.05, MODERATELY), (0.2, HIGHLY)]
)
def test_grades_are_tensorflows_thresholds(wait: float | None, level: str) -> None:
    assert grade(wait) == level


def test_not_input_bound_names_the_step() -> None:
    verdict = judge(summary(0.01, decode=3.0), Setting(num_workers=4, usable_cores=4))
    assert verdict.level == NOT_BOUND and verdict.bottleneck == "step"
    assert "keeps up" in verdict.advice[0]


GPU_OK = {"images": 1000, "on_gpu": 1000, "on_cpu": 0, "batch_retries": 0, "bad": 0}
GPU_CMYK = {"images": 1000, "on_gpu": 900, "on_cpu": 100, "batch_retries": 0, "bad": 0}
GPU_RETRIED = {"images": 1000, "on_gpu": 1000, "on_cpu": 0, "batch_retries": 3, "bad": 0}


@pytest.mark.parametrize(
    ("figures", "setting", "bottleneck", "advice"),
    [
        ({"read": 5.0, "decode": 1.0}, Setting(4, 4, small_files=True), "read", "fastloader pack"),
        ({"read": 5.0, "decode": 1.0}, Setting(4, 4, cores_busy=0.3), "read", "storage is the limit"),
        ({"decode": 3.0, "read": 0.1}, Setting(2, 8, cores_busy=0.3), "decode", "num_workers=8"),
        ({"decode": 3.0, "read": 0.1}, Setting(8, 8, cores_busy=0.97), "decode", "resize-max-side"),
        ({"transform": 3.0, "decode": 1.0}, Setting(8, 8, cores_busy=0.97), "transform", "fuse the crop"),
        ({"collate": 3.0, "decode": 1.0}, Setting(8, 8, cores_busy=0.97), "collate", "pre-assembled uint8"),
        # 8 workers make 1 ms/image of decode cost 0.125 ms: the 0.5 ms hand-off in the main process is the limit
        ({"decode": 1.0, "handoff": 0.5}, Setting(8, 8, cores_busy=0.9), "handoff", "uint8 batches"),
        ({"decode": 1.0, "h2d": 0.5}, Setting(8, 8, pin_memory=False, to_gpu=True), "h2d", "pin_memory=True"),
        ({"decode": 1.0, "h2d": 0.5}, Setting(8, 8, pin_memory=True, to_gpu=True), "h2d", "4x fewer bytes"),
        ({"decode": 3.0, "handoff": 0.0}, Setting(0, 4), "decode", "num_workers=4"),
        # decode_on="cuda": nvJPEG runs in the producer thread, timed as h2d
        ({"decode": 0.1, "h2d": 0.5}, Setting(8, 8, True, True, gpu_decode=GPU_OK), "h2d", "larger batches"),
        (
            {"decode": 0.1, "h2d": 0.5},
            Setting(8, 8, True, True, gpu_decode=GPU_CMYK),
            "h2d",
            "(10%) were decoded on the CPU",
        ),
        ({"decode": 0.1, "h2d": 0.5}, Setting(8, 8, True, True, gpu_decode=GPU_RETRIED), "h2d", "fastloader scan"),
    ],
)
def test_the_limit_and_its_next_step(figures: dict[str, float], setting: Setting, bottleneck: str, advice: str) -> None:
    verdict = judge(summary(0.5, **figures), setting)
    assert verdict.level == HIGHLY
    assert verdict.bottleneck == bottleneck
    assert advice in " ".join(verdict.advice), verdict.advice
    assert bottleneck in verdict.summary


def test_capacity_counts_the_workers_in_parallel() -> None:
    verdict = judge(summary(0.3, decode=4.0, handoff=0.2), Setting(num_workers=4, usable_cores=4))
    assert verdict.capacity["workers"] == pytest.approx(1000.0)  # 4 workers at 4 ms per image
    assert verdict.capacity["main"] == pytest.approx(5000.0)
    assert verdict.bottleneck == "decode"


def test_workers_that_auto_measured_are_not_advised_up() -> None:
    """num_workers='auto' chose 1 of 2 cores because a second worker did not pay: the verdict must not tell the
    user to add workers, which the measurement contradicts."""
    figures = summary(0.5, decode=3.0, read=0.1)
    guessed = judge(figures, Setting(1, 2, cores_busy=0.5))
    measured = judge(figures, Setting(1, 2, cores_busy=0.5, measured_workers=True))
    assert "num_workers=2" in " ".join(guessed.advice)
    assert "num_workers=2" not in " ".join(measured.advice)
    assert "measured that more than 1 worker do not pay" in measured.advice[0], measured.advice


@pytest.mark.parametrize("wait", [0.5, 0.01])
def test_a_busy_machine_is_said_with_the_advice_a_quiet_one_is_not(wait: float) -> None:
    """Other work held 60% of the cores before the run: whatever the grade, the advice says its figures may not
    hold (num_workers='auto''s choice among them); at 10% it says nothing of the kind."""
    figures = summary(wait, decode=3.0, read=0.1)
    busy = judge(figures, Setting(1, 2, cores_busy=0.9, measured_workers=True, busy_before=0.6))
    quiet = judge(figures, Setting(1, 2, cores_busy=0.9, measured_workers=True, busy_before=0.1))
    assert busy.advice[-1].startswith("the machine was busy with other work (60% of the usable cores before the run)")
    assert "num_workers='auto''s choice among them" in busy.advice[-1]
    assert not any("busy with other work" in advice for advice in quiet.advice), quiet.advice


def _with_step(wait: float, step_p50_ms: float, **per_image_ms: float) -> dict[str, Any]:
    figures = summary(wait, **per_image_ms)
    figures["stages"]["step"] = {"per_image_ms": step_p50_ms / 32, "per_batch_ms": {"p50": step_p50_ms}}
    return figures


@pytest.mark.parametrize("wait", [0.01, 0.3])
def test_a_step_slowed_by_the_loader_names_the_subprocess_pipeline(wait: float) -> None:
    """The stage clock saw a 13 ms step where the step alone takes 10 ms: the loader's work in the training
    process slows it, whether or not the loop also waits for data."""
    setting = Setting(4, 4, worker_method="thread", step_alone_ms=10.0)
    verdict = judge(_with_step(wait, 13.0, decode=1.0), setting)
    assert any("worker_method='subprocess'" in line and "1.30x" in line for line in verdict.advice)
    if wait < 0.05:
        assert not any("keeps up" in line for line in verdict.advice)


@pytest.mark.parametrize(
    "setting",
    [
        Setting(4, 4, step_alone_ms=12.5),  # the step is as fast with the loader: 13 ms is within 10%
        Setting(4, 4, worker_method="subprocess", step_alone_ms=10.0),  # already there
        Setting(0, 4, step_alone_ms=10.0),  # no workers: the dataset runs in the loop itself
        Setting(4, 4),  # the step alone was not measured
    ],
)
def test_no_subprocess_advice_without_the_sign(setting: Setting) -> None:
    verdict = judge(_with_step(0.01, 13.0, decode=1.0), setting)
    assert not any("subprocess" in line for line in verdict.advice)
