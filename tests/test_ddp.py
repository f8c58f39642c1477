"""DataLoaderX under torchrun (gloo, CPU): automatic split and epochs, and resume at another world size."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
LENGTH, BATCH, K = 50, 4, 3

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="gloo on CPU under torchrun")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def packed_dataset(base: Path) -> Path:
    """A real LMDB of LENGTH small JPEGs, one class each: an item's label is its index."""
    from PIL import Image

    from fastloader.pack import pack

    for index in range(LENGTH):
        (base / "images" / f"c{index:03d}").mkdir(parents=True)
        Image.new("RGB", (12, 10), (index * 5 % 256, 0, 0)).save(base / "images" / f"c{index:03d}" / "0.jpg")
    pack(str(base / "images"), base / "train.lmdb", progress=False, workers=0)
    return base / "train.lmdb"


def torchrun(world: int, outdir: Path, *args: str) -> list[dict[str, Any]]:
    outdir.mkdir(parents=True)
    lmdb = outdir.parent / "train.lmdb"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", FASTLOADER_TEST_LMDB=str(lmdb))
    command = [str(TORCHRUN), "--nproc_per_node", str(world), "--master_port", str(free_port())]
    command += [str(ROOT / "tests" / "ddp_worker.py"), str(outdir), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
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
    two = torchrun(2, base / "two")
    return {
        "two": two,
        "two_again": torchrun(2, base / "two_again"),
        # three ranks: their own two epochs, then the rest of the two-rank run's epoch 2
        "three": torchrun(3, base / "three", str(base / "two" / "state.json")),
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
        command = [str(TORCHRUN), "--nproc_per_node", str(world), "--master_port", str(free_port())]
        command += [str(ROOT / "examples" / "train_ddp.py"), "--checkpoint", checkpoint, *extra]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    assert "stopped at step 5" in outputs[0]
    # 256 samples, 16 a batch: 5 steps at 2 ranks leave 96 samples, 2 steps at 3 ranks.
    assert "resumed at step 5, epoch 0" in outputs[1] and "epoch 0: loss" in outputs[1]
    assert outputs[1].count("epoch 0: loss") == 3 and ", step 7" in outputs[1]
