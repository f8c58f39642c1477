"""One rank of the DDP tests (tests/test_ddp.py); run by torchrun, never collected by pytest.

    torchrun --nproc_per_node N tests/ddp_worker.py OUTDIR [STATE_JSON]

Two full epochs of ``DataLoaderX(LMDBDataset($FASTLOADER_TEST_LMDB), batch_size=4, shuffle=True, local_rank=...)``
(50 images whose labels are their indices) with no ``set_epoch``
(automatic epochs), then: without STATE_JSON, K batches of epoch 2 and rank 0 saves the loader state
to OUTDIR/state.json; with STATE_JSON, the state is loaded and the rest of that epoch is read. Each rank
writes what it saw to OUTDIR/rank<r>.json.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
from fastloader.samplers import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import DDP_WORKER_CONTEXT, preload_worker_modules  # noqa: E402

K = 3


def collate_labels(items: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """Only the labels (= indices) matter here; the images are decoded all the same."""
    if any(image.shape != (3, 8, 8) for image, _ in items):
        raise RuntimeError("an image was not decoded to 3x8x8")
    return torch.tensor([label for _, label in items])


def main() -> None:
    preload_worker_modules()
    outdir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = LMDBDataset(os.environ["FASTLOADER_TEST_LMDB"], transform=T.Compose([T.CenterCrop(8)]))
    # Without local_rank= (or distributed=True) DataLoaderX does not split: frameworks that split by
    # themselves must see torch's behaviour, every sample on every rank.
    unsplit = DataLoaderX(dataset, batch_size=4, shuffle=True, collate_fn=collate_labels)
    if isinstance(unsplit.sampler, DistributedSampler) or len(unsplit) != -(-len(dataset) // 4):
        raise RuntimeError(f"split without being asked: {unsplit.sampler!r}")
    loader = DataLoaderX(
        dataset,
        batch_size=4,
        shuffle=True,
        num_workers=1,
        collate_fn=collate_labels,
        local_rank=int(os.environ["LOCAL_RANK"]),
        multiprocessing_context=DDP_WORKER_CONTEXT,
    )
    if not isinstance(loader.sampler, DistributedSampler) or loader.sampler.num_replicas != dist.get_world_size():
        raise RuntimeError(f"local_rank= did not split: {loader.sampler!r}")
    seen: dict[str, object] = {"epochs": [sum((b.tolist() for b in loader), []) for _ in range(2)]}
    if len(sys.argv) > 2:
        loader.load_state_dict(json.loads(Path(sys.argv[2]).read_text()))
        seen["rest"] = sum((b.tolist() for b in loader), [])
    else:
        seen["before"] = sum((b.tolist() for b in itertools.islice(iter(loader), K)), [])
        state = loader.state_dict()
        if rank == 0:
            (outdir / "state.json").write_text(json.dumps(state))
    (outdir / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
