"""Lightning and accelerate, run as users run them (real processes, gloo on CPU), with torch's own
DataLoader as the control in the same run: every sample exactly once per epoch across the ranks apart
from the framework's padding, and Lightning's mid-epoch checkpoint resuming with the uninterrupted batches."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import CHILD_TIMEOUT_S, run_child
from tests.integrations.common import BATCH, LENGTH, LIGHTNING_DDP_CONFIGS

pytest.importorskip("lightning")
pytest.importorskip("accelerate")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def run(args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    done = run_child([sys.executable, *args], cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def torchrun(script: str, outdir: Path, *args: str) -> None:
    # --standalone: torchrun binds its rendezvous port itself, where a free port picked here could be taken by
    # another job on the machine before torchrun binds it.
    run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script, str(outdir), *args])


def per_epoch(outdir: Path, config: str, kind: str) -> dict[str, list[list[int]]]:
    """{epoch: [indices of rank 0, indices of rank 1]}."""
    ranks = [json.loads((outdir / f"{config}_{kind}_rank{r}.json").read_text()) for r in range(2)]
    return {epoch: [rank[epoch] for rank in ranks] for epoch in ranks[0]}


def summary(epochs: dict[str, list[list[int]]]) -> list[dict[str, Any]]:
    return [
        {"per_rank": [len(part) for part in parts], "union": len(set(parts[0]) | set(parts[1]))}
        for parts in epochs.values()
    ]


def check_split(outdir: Path, config: str, padding: int, report: dict[str, Any]) -> None:
    """Both kinds: each epoch covers the dataset, ranks overlap only by ``padding`` samples, each rank's
    order changes between epochs; DataLoaderX's per-rank counts equal the control's."""
    control, ours = per_epoch(outdir, config, "torch"), per_epoch(outdir, config, "fastloader")
    report[config] = {"torch": summary(control), "fastloader": summary(ours)}
    print(config, json.dumps(report[config]))
    for epochs in (control, ours):
        assert sorted(epochs) == ["0", "1"]
        for parts in epochs.values():
            assert set(parts[0]) | set(parts[1]) == set(range(LENGTH))
            assert len(parts[0]) + len(parts[1]) == LENGTH + padding
            assert abs(len(parts[0]) - len(parts[1])) <= BATCH
        assert all(epochs["0"][rank] != epochs["1"][rank] for rank in range(2))
    assert report[config]["fastloader"] == report[config]["torch"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    figures: dict[str, Any] = {}
    yield figures
    (tmp_path_factory.getbasetemp() / "integrations.json").write_text(json.dumps(figures, indent=1))


# One launch per configuration, its two fits (torch's loader, DataLoaderX) in it: eight fits in one launch ran
# past the child guard on a loaded 2-core machine.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", sorted(LIGHTNING_DDP_CONFIGS))
def test_lightning_ddp_each_sample_once_per_epoch(tmp_path: Path, report: dict[str, Any], config: str) -> None:
    torchrun(str(HERE / "lightning_ddp.py"), tmp_path, config)
    # torch's DistributedSampler pads 101 to 102: one sample twice per epoch
    check_split(tmp_path, config, padding=1, report=report)


def read(outdir: Path, name: str) -> list[Any]:
    return [json.loads((outdir / f"{name}_rank{rank}.json").read_text()) for rank in range(2)]


def check_accelerate_run(outdir: Path, config: str, kind: str) -> dict[str, Any]:
    """The loop's view of one kind: gather_for_metrics, the batches, the prefetch thread, stats(); the
    per-rank figures."""
    seen = read(outdir, f"{config}_{kind}")
    figures: dict[str, Any] = {"gathered": [], "thread_at_first_batch": []}
    for rank, checks in enumerate(read(outdir, f"{config}_{kind}_checks")):
        # gather_for_metrics drops even_batches' padding: each sample exactly once per epoch
        assert all(sorted(gathered) == list(range(LENGTH)) for gathered in checks["gathered"].values())
        figures["gathered"].append([len(gathered) for gathered in checks["gathered"].values()])
        assert checks["as_expected"] and set(checks["devices"]) == {"cpu"}
        # at an epoch's first batch the producer has made at most 5 of its 7 or 13 batches (2 taken, the
        # look-ahead included, 2 queued: max_prefetch=2, 1 held): it is still running
        first_alive = [threads[0] for threads in checks["threads"].values()]
        figures["thread_at_first_batch"].append(first_alive)
        if kind == "torch":  # the control: accelerate's own loader, the raw uint8 images, no fastloader thread
            assert checks["type"] == "DataLoaderShard" and set(checks["dtypes"]) == {"torch.uint8"}
            assert not any(map(any, checks["threads"].values()))
        else:  # DataLoaderX's pipeline: its thread, normalize= applied, its stats
            assert checks["type"] == "PreparedLoader" and set(checks["dtypes"]) == {"torch.float32"}
            assert all(first_alive)
            batches = sum(len(threads) for threads in checks["threads"].values())
            samples = sum(len(indices) for indices in seen[rank].values())
            assert checks["stats"] == {"batches": batches, "images": samples}
    return figures


def check_accelerate_resume(outdir: Path, config: str, kind: str) -> None:
    for record in read(outdir, f"{config}_{kind}_resume"):
        full, saved_at = record["full"], record["saved_at"]
        if kind == "torch":  # the control: load_state does not bring its loader back to the saved batch
            assert record["rest"] != full["1"][saved_at:]
        else:  # save_state at batch 3 of epoch 1, a new loader, load_state: the uninterrupted batches
            assert record["rest"] == full["1"][saved_at:] and record["after"] == full["2"]
            assert (
                "skip_first_batches" in record["skip_refused"]
                and "accelerator.load_state(path)" in record["skip_refused"]
            )
        assert record["ends"] == [False] * (len(record["rest"]) - 1) + [True]  # the resumed epoch's end is seen


@pytest.mark.timeout(300)
def test_accelerate_runs_dataloaderx_with_accelerates_semantics(tmp_path: Path, report: dict[str, Any]) -> None:
    torchrun(str(HERE / "accelerate_ddp.py"), tmp_path)
    # even_batches: accelerate repeats samples until both ranks have the same number of full batches
    for config, padding in (("accelerate", 11), ("accelerate_split_batches", 3)):
        check_split(tmp_path, config, padding=padding, report=report)
        # the same global seed gives both accelerate's shuffling generator: DataLoaderX reads accelerate's batches
        assert per_epoch(tmp_path, config, "fastloader") == per_epoch(tmp_path, config, "torch")
        for kind in ("torch", "fastloader"):
            report[config][kind] = {"epochs": report[config][kind], **check_accelerate_run(tmp_path, config, kind)}
            check_accelerate_resume(tmp_path, config, kind)
        print(config, json.dumps(report[config]))
    for message in read(tmp_path, "refused"):  # a DataLoaderX that splits by itself is not split twice
        assert "already splits the data over the ranks (DistributedSampler)" in message


@pytest.mark.timeout(2 * CHILD_TIMEOUT_S + 60)  # two runs, each guarded by run_child: its timeout fails first
def test_lightning_mid_epoch_checkpoint_resumes_with_the_uninterrupted_batches(tmp_path: Path) -> None:
    run([str(HERE / "lightning_resume.py"), str(tmp_path), "first"])
    run([str(HERE / "lightning_resume.py"), str(tmp_path), "rest"])  # a new process, as after a crash
    for path in sorted(tmp_path.glob("*.json")):
        kind, seeding, k = path.stem.split("_")
        record = json.loads(path.read_text())
        full, resumed = record["full"], record["first"] + record["rest"]
        assert len(full) == 2 * -(-LENGTH // BATCH) and record["first"] == full[: int(k[1:])]
        if kind == "torch":  # the control: torch's loader restarts the epoch in a new order
            assert resumed != full, path.stem
        else:
            # generator=: its state travels in the checkpoint. Global seed: the epoch's seed does, and the
            # replay draws from torch's RNG what torch's sampler draws, so a script that seeds as the
            # interrupted one did goes on with the same numbers: every batch of both epochs is equal.
            assert resumed == full, path.stem


def check_cut_epoch(outdir: Path, ranks: int) -> list[str]:
    """After a checkpoint at the last batch of an epoch that ``limit_train_batches`` cut, the resumed run trains
    on the uninterrupted run's samples, epoch by epoch, on every rank. The variants checked."""
    names = sorted({path.stem.rsplit("_rank", 1)[0] for path in outdir.glob("*_rank0.json")})
    for name in names:
        for rank in range(ranks):
            record = json.loads((outdir / f"{name}_rank{rank}.json").read_text())
            full, first, rest = record["full"], record["first"], record["rest"]
            assert sorted(full) == ["0", "1", "2"] and first["0"] == full["0"], name
            kept = len(full["0"])
            assert kept == len(full["1"]) and kept < LENGTH // ranks, name  # each epoch cut to half its batches
            # nothing of the cut epoch's rest, nothing doubled or lost: the same samples in the same order
            assert rest == {"1": full["1"], "2": full["2"]}, (name, rank)
    return names


@pytest.mark.timeout(300)
def test_lightning_checkpoint_at_the_end_of_a_cut_epoch_resumes_into_the_next_epoch(tmp_path: Path) -> None:
    run([str(HERE / "lightning_cut_epoch.py"), str(tmp_path), "first"])
    run([str(HERE / "lightning_cut_epoch.py"), str(tmp_path), "rest"])  # a new process, as after a crash
    names = check_cut_epoch(tmp_path, ranks=1)
    # torch's loader (the control) for the order it resumes exactly, DataLoaderX for that and shuffle=True
    assert len(names) == 14 and sum("_torch_" in name for name in names) == 2


@pytest.mark.timeout(300)
def test_lightning_ddp_checkpoint_at_the_end_of_a_cut_epoch_resumes_into_the_next_epoch(tmp_path: Path) -> None:
    torchrun(str(HERE / "lightning_cut_epoch.py"), tmp_path, "first")
    torchrun(str(HERE / "lightning_cut_epoch.py"), tmp_path, "rest")
    names = check_cut_epoch(tmp_path, ranks=2)
    assert len(names) == 6 and sum("_torch_" in name for name in names) == 3
