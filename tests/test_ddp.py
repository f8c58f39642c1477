"""DataLoaderX under torchrun (gloo, CPU): automatic split and epochs, and resume at another world size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, finish, kill, run_child

TORCHRUN = Path(sys.executable).parent / "torchrun"
LENGTH, BATCH, K = 50, 4, 3

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="gloo on CPU under torchrun")


def torchrun_command(world: int) -> list[str]:
    """torchrun on this machine alone: ``--standalone`` binds its rendezvous port itself (port 0), where a port
    picked here and released for torchrun to bind could be taken meanwhile by any other job on the machine."""
    return [str(TORCHRUN), "--standalone", "--nproc_per_node", str(world)]


def packed_dataset(base: Path) -> Path:
    """A real LMDB of LENGTH small JPEGs, one class each: an item's label is its index."""
    from PIL import Image

    from fastloader.pack import pack

    for index in range(LENGTH):
        (base / "images" / f"c{index:03d}").mkdir(parents=True)
        Image.new("RGB", (12, 10), (index * 5 % 256, 0, 0)).save(base / "images" / f"c{index:03d}" / "0.jpg")
    pack(str(base / "images"), base / "train.lmdb", progress=False, workers=0)
    return base / "train.lmdb"


def start_torchrun(world: int, outdir: Path, *args: str) -> subprocess.Popen[str]:
    """tests/ddp_worker.py under torchrun, ``world`` ranks, writing into ``outdir`` (in a session of its own, so
    that ``finish`` kills the ranks and their workers with it)."""
    outdir.mkdir(parents=True)
    lmdb = outdir.parent / "train.lmdb"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", FASTLOADER_TEST_LMDB=str(lmdb))
    command = [*torchrun_command(world), str(ROOT / "tests" / "ddp_worker.py"), str(outdir), *args]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True
    )


def rank_records(process: subprocess.Popen[str], outdir: Path, world: int) -> list[dict[str, Any]]:
    """What each rank of a torchrun started by ``start_torchrun`` saw, once it has exited with 0."""
    # Each rank and its workers' fork server import torch cold, and exit through a full interpreter teardown
    # (seconds under load, after the rank's last line): far from the work the test checks, so the shared guard.
    stdout, stderr = finish(process)
    assert process.returncode == 0, stdout + stderr
    return [json.loads((outdir / f"rank{rank}.json").read_text()) for rank in range(world)]


def check_split(parts: list[list[int]], world: int) -> None:
    """Equal parts whose union is the dataset; only torch's padding (the order's start) appears twice."""
    per_rank = -(-LENGTH // world)
    assert all(len(part) == per_rank for part in parts)
    counts = Counter(i for part in parts for i in part)
    assert set(counts) == set(range(LENGTH))
    assert sum(counts.values()) - LENGTH == per_rank * world - LENGTH  # the padding, no more
    assert all(n <= 2 for n in counts.values())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("ddp")
    packed_dataset(base)
    # The same two-rank run twice, at once: they share nothing (a rendezvous port each, their own output), and
    # each one's start-up and teardown, single-threaded, overlaps the other's.
    started = [start_torchrun(2, base / "two"), start_torchrun(2, base / "two_again")]
    try:
        two, two_again = rank_records(started[0], base / "two", 2), rank_records(started[1], base / "two_again", 2)
    finally:
        for process in started:  # where one failed, the other is not left running
            kill(process)
    three = start_torchrun(3, base / "three", str(base / "two" / "state.json"))
    return {
        "two": two,
        "two_again": two_again,
        # three ranks: their own two epochs, then the rest of the two-rank run's epoch 2
        "three": rank_records(three, base / "three", 3),
        "state": json.loads((base / "two" / "state.json").read_text()),
    }


@pytest.mark.parametrize("name", ["two", "three"])
def test_ranks_split_each_epoch_and_epochs_differ(runs: dict[str, Any], name: str) -> None:
    ranks = runs[name]
    for epoch in range(2):
        check_split([rank["epochs"][epoch] for rank in ranks], len(ranks))
    assert all(rank["epochs"][0] != rank["epochs"][1] for rank in ranks)


def test_same_seed_same_run(runs: dict[str, Any]) -> None:
    assert [r["epochs"] + [r["before"]] for r in runs["two"]] == [
        r["epochs"] + [r["before"]] for r in runs["two_again"]
    ]


def test_resume_at_another_world_size_loses_and_repeats_nothing(runs: dict[str, Any]) -> None:
    state = runs["state"]
    assert (state["epoch"], state["batches_yielded"], state["world_size"]) == (2, K, 2)
    before = [i for rank in runs["two"] for i in rank["before"]]
    after = [i for rank in runs["three"] for i in rank["rest"]]
    assert len(before) == len(set(before)) == 2 * K * BATCH
    assert not set(before) & set(after)
    assert set(before) | set(after) == set(range(LENGTH))
    rest = LENGTH - len(before)
    padding = -(-rest // 3) * 3 - rest  # the three ranks get equal parts: the rest's start pads it
    assert len(after) == rest + padding and len(after) - len(set(after)) == padding
    assert len({len(rank["rest"]) for rank in runs["three"]}) == 1


def test_train_ddp_example_stops_and_resumes_at_another_world_size(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    checkpoint = str(tmp_path / "checkpoint.pt")
    outputs = []
    for world, extra in ((2, ["--stop-after", "5"]), (3, [])):
        command = [*torchrun_command(world), str(ROOT / "examples" / "train_ddp.py"), "--checkpoint", checkpoint]
        done = run_child([*command, *extra], env=env, cwd=ROOT)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    assert "stopped at step 5" in outputs[0]
    # 256 samples, 16 a batch: 5 steps at 2 ranks leave 96 samples, 2 steps at 3 ranks.
    assert "resumed at step 5, epoch 0" in outputs[1] and "epoch 0: loss" in outputs[1]
    assert outputs[1].count("epoch 0: loss") == 3 and ", step 7" in outputs[1]
