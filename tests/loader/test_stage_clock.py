"""The stage clock: each stage measured where it is spent, nothing changed for the training loop."""

from __future__ import annotations

import pickle
import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from fastloader import DataLoaderX
from fastloader.loader.stage_clock import BatchTiming, StampedIndices, TimedBatch, TimedCollate
from fastloader.loader.stage_stats import StageStats, percentiles
from fastloader.timing import tally
from tests.doctor.pipelines import dataset
from tests.toy_datasets import Slow, Squares, add_offset


def collate_pairs(samples: list[Any]) -> Any:
    return default_collate(samples)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fastloader_dataset_reports_read_decode_collate_and_the_loop(workers: int) -> None:
    loader = DataLoaderX(dataset(None), batch_size=8, num_workers=workers)
    for _ in loader:
        time.sleep(0.005)
    stats = loader.stats()
    stages = stats["stages"]
    assert stats["batches"] == 12 and stats["images"] == 96
    for name in ("read", "decode", "collate", "dataset", "wait", "step"):
        assert name in stages, name
    assert stages["decode"]["total_s"] > 0 and stages["read"]["total_s"] > 0
    assert stages["step"]["per_batch_ms"]["p50"] >= 5  # the sleep between batches
    assert stages["decode"]["where"] == "workers" and stages["wait"]["where"] == "training loop"
    assert (stages["handoff"]["total_s"] > 0) == (workers > 0)  # unpickled from a worker, or no hand-off at all
    assert 0 <= stats["wait_fraction"] <= 1 and stats["images_per_s"] > 0
    assert stats["timeline"] and {"t", "images_per_s", "prefetch_queue", "worker_queue"} <= set(stats["timeline"][0])
    assert stats["epoch"] == 0 and stats["batches_yielded"] == 12 and stats["bad_samples"] == 0  # the fields of before


def test_any_dataset_shows_its_time_as_dataset() -> None:
    loader = DataLoaderX(Slow(16, 0.01), batch_size=4, num_workers=2)
    assert len(list(loader)) == 4
    dataset_stage = loader.stats()["stages"]["dataset"]
    assert dataset_stage["per_image_ms"] >= 9  # the 10 ms sleep of each item, measured in the workers
    assert "read" not in loader.stats()["stages"] or loader.stats()["stages"]["read"]["total_s"] == 0


def test_the_users_collate_and_worker_init_stay_the_loaders_attributes() -> None:
    loader = DataLoaderX(Squares(), batch_size=5, num_workers=2, collate_fn=collate_pairs, worker_init_fn=add_offset)
    ours = [batch for batch in loader]
    assert loader.collate_fn is collate_pairs and loader.worker_init_fn is add_offset
    theirs = list(
        DataLoader(Squares(), batch_size=5, num_workers=2, collate_fn=collate_pairs, worker_init_fn=add_offset)
    )
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_profiler_trace_shows_the_stages_by_name() -> None:
    ds = dataset(None)
    loader = DataLoaderX(ds, batch_size=8, num_workers=0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        list(loader)  # the training loop's thread: its waits
        TimedCollate(default_collate)(ds.__getitems__([0, 1, 2]))  # the dataset's stages, where they run
    names = {event.key for event in profile.key_averages()}
    assert {"fastloader.wait", "fastloader.read", "fastloader.decode", "fastloader.collate"} <= names


def test_timed_batch_travels_and_times_its_arrival() -> None:
    timing_batch = TimedCollate(default_collate)([torch.ones(3), torch.zeros(3)])
    assert isinstance(timing_batch, TimedBatch) and timing_batch.timing.images == 2
    arrived = pickle.loads(pickle.dumps(timing_batch))
    assert torch.equal(arrived.batch, torch.stack([torch.ones(3), torch.zeros(3)]))
    assert 0 <= arrived.timing.handoff < 1 and arrived.timing.collate >= 0


def test_stamped_indices_arrive_as_a_plain_list_and_mark_the_fetch() -> None:
    tally().fetch_start = None
    indices = pickle.loads(pickle.dumps(StampedIndices([3, 1, 2])))
    assert type(indices) is list and indices == [3, 1, 2]
    assert tally().fetch_start is not None and tally().fetch_start <= time.perf_counter()


def test_a_summary_since_a_mark_covers_only_what_came_after() -> None:
    stats = StageStats()
    for decode in (1.0, 1.0):
        stats.add_batch(BatchTiming(images=4, decode=decode, collate=0.1))
        stats.add_delivery(0.5, 0.5, 4, 0, 0)
    mark = stats.mark()
    stats.add_batch(BatchTiming(images=4, decode=0.2, collate=0.1))
    stats.add_delivery(0.1, 0.9, 4, 0, 0)
    window, everything = stats.summary(since=mark), stats.summary()
    assert window["batches"] == 1 and window["images"] == 4 and everything["batches"] == 3
    assert window["stages"]["decode"]["total_s"] == pytest.approx(0.2)
    assert window["stages"]["decode"]["per_image_ms"] == pytest.approx(50.0)  # 0.2 s over 4 images
    assert window["stages"]["decode"]["per_batch_ms"]["p99"] == pytest.approx(200.0)  # not the earlier 1 s
    assert window["wait_fraction"] == pytest.approx(0.1) and everything["wait_fraction"] == pytest.approx(1.1 / 3)


def test_percentiles() -> None:
    assert percentiles([]) is None
    assert percentiles([5.0]) == {"p50": 5.0, "p90": 5.0, "p99": 5.0}
    values = [float(v) for v in range(101)]
    assert percentiles(values) == {"p50": 50.0, "p90": 90.0, "p99": 99.0}


def test_report_every_logs_the_verdict(caplog: pytest.LogCaptureFixture) -> None:
    loader = DataLoaderX(dataset(None), batch_size=8, num_workers=0, report_every=5)
    with caplog.at_level("INFO", logger="fastloader"):
        list(loader)
    reports = [r.getMessage() for r in caplog.records if "images/s over" in r.getMessage()]
    assert len(reports) == 2  # batches 5 and 10 of 12
    assert "input-bound" in reports[0] and all("over the last 5 batches" in r for r in reports)
    with pytest.raises(ValueError, match="report_every"):
        DataLoaderX(dataset(None), report_every=0)
