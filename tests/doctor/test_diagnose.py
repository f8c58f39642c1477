"""The doctor names the stage that was made slow, every time, and says "not input-bound" when the step dominates."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fastloader import DataLoaderX
from fastloader.doctor.diagnose import LOADER_ONLY, diagnose
from fastloader.loader.verdict import HIGHLY, NOT_BOUND
from fastloader.sample import make_sample_folder
from tests.doctor.pipelines import dataset, slow_collate
from tests.helpers import run_python


@pytest.mark.parametrize("slow", ["read", "decode", "transform", "collate"])
def test_the_injected_slow_stage_is_named(slow: str) -> None:
    collate = slow_collate if slow == "collate" else None
    loader = DataLoaderX(dataset(None if slow == "collate" else slow), batch_size=8, num_workers=2, collate_fn=collate)
    result = diagnose(loader, batches=10, step_ms=1.0)
    verdict = result["verdict"]
    assert verdict["bottleneck"] == slow, (verdict, result["stages"])
    assert verdict["level"] == HIGHLY  # 20 ms per image on two workers against a 1 ms step
    assert result["stages"][slow]["per_image_ms"] >= 15  # the injected 20 ms, measured where it was spent
    assert slow in verdict["summary"] and verdict["advice"]


def test_a_training_step_that_dominates_is_not_input_bound() -> None:
    loader = DataLoaderX(dataset(None), batch_size=8, num_workers=0)
    result = diagnose(loader, batches=12, step_ms=150.0)
    assert result["verdict"]["level"] == NOT_BOUND, result["verdict"]
    assert result["verdict"]["bottleneck"] == "step"
    assert result["throughput"]["wait_fraction"] < 0.05
    assert result["stages"]["step"]["per_batch_ms"]["p50"] >= 150


def test_without_a_step_the_loader_alone_is_measured() -> None:
    loader = DataLoaderX(dataset("read"), batch_size=8, num_workers=1)
    result = diagnose(loader, batches=4)
    assert result["verdict"]["level"] == LOADER_ONLY
    assert "images/s" in result["verdict"]["summary"] and result["verdict"]["bottleneck"] == "read"
    assert result["throughput"]["images"] == 32 and result["throughput"]["batches"] == 4


def test_diagnose_wants_a_dataloaderx() -> None:
    from torch.utils.data import DataLoader

    with pytest.raises(TypeError, match="DataLoaderX"):
        diagnose(DataLoader(dataset(None)))  # type: ignore[arg-type]


def test_one_allowed_core_every_core_busy_and_too_many_workers(tmp_path: Path) -> None:
    """On one core, a decode-bound pipeline with two workers: the doctor sees the core busy, says so, and
    names the trap of more workers than cores."""
    if len(os.sched_getaffinity(0)) < 1:
        pytest.skip("no CPU affinity here")
    folder = make_sample_folder(tmp_path / "photos", 48)
    code = (
        "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from fastloader.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    args = [str(folder), "--workers", "2", "--batch-size", "8", "--batches", "12", "--no-storage", "--step-ms", "1"]
    out = run_python(code, "doctor", *args, "--json")
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    assert result["environment"]["usable_cores"] == 1
    assert [trap["name"] for trap in result["traps"]] == ["workers_over_cores"]
    verdict = result["verdict"]
    assert verdict["bottleneck"] == "decode", verdict
    assert "every core is busy" in " ".join(verdict["advice"])
    assert len(result["cpu"]["per_core_percent_mean"]) == 1 and result["cpu"]["per_core_percent_mean"][0] > 80


def test_the_doctors_advice_follows_what_auto_measured_in_the_same_run() -> None:
    """The doctor's report once said num_workers='auto' chose 1 worker, then advised num_workers=2: the verdict
    did not know the number was measured. Given this run's own stats (auto tried 1 and 2 workers on 2 cores and
    kept 1), the doctor's verdict must not advise more workers; given the same number set by hand, it may."""
    from fastloader.doctor.diagnose import doctor_setting
    from fastloader.loader.verdict import judge

    trials = [{"num_workers": 1, "images_per_s": 100.0, "batches": 8}, {"num_workers": 2, "images_per_s": 104.0}]
    stats: dict[str, Any] = {
        "wait_fraction": 0.5,
        "num_workers": 1,
        "stages": {"decode": {"per_image_ms": 3.0}, "read": {"per_image_ms": 0.1}},
        "autotune": {"num_workers": 1, "prefetch_factor": 2, "trials": trials, "seconds": 2.0, "reason": "measured"},
    }
    loader = DataLoaderX(dataset(None), batch_size=8, num_workers=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("fastloader.world.cores_per_rank", lambda: 2)
        measured = judge(stats, doctor_setting(loader, stats, 0.5, False, busy_before=0.0))
        by_hand = judge(
            {**stats, "autotune": None}, doctor_setting(loader, stats | {"autotune": None}, 0.5, False, 0.0)
        )
    assert not any("num_workers=2" in advice for advice in measured.advice), measured.advice
    assert "num_workers='auto' measured that more than 1 worker do not pay" in measured.advice[0]
    assert "num_workers=2" in by_hand.advice[0], by_hand.advice


def _loader_threads() -> int:
    return sum(thread.name.startswith("fastloader-worker-") for thread in threading.enumerate())


def test_a_step_slowed_while_the_loader_runs_names_the_subprocess_pipeline() -> None:
    """A real step that costs 30 ms while thread workers run in this process and 5 ms once they are gone (the
    loader's share of the training process, made plain): the doctor times the step alone after the run and
    names worker_method="subprocess"."""

    def step(batch: Any) -> None:
        time.sleep(0.03 if _loader_threads() else 0.005)

    loader = DataLoaderX(dataset(None), batch_size=8, num_workers=2, worker_method="thread")
    result = diagnose(loader, batches=8, step=step)
    assert any("worker_method='subprocess'" in line for line in result["verdict"]["advice"]), result["verdict"]
