"""Samples with fields on the GPU path: nvJPEG decodes the image, masks and boxes follow the same plan,
normalize touches only the image."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import TarShardDataset
from fastloader.fields import Boxes, Mask
from fastloader.sample_shards import make_detection_shards

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

FIELDS = {
    "image": "jpg",
    "mask": Mask("seg.png"),
    "target": Boxes("json", path="annotations.*.bbox", format="xywh", labels="annotations.*.category_id"),
}


def test_gpu_decode_with_masks_and_boxes_equals_the_cpu_path(tmp_path: Path) -> None:
    shards = [str(path) for path in make_detection_shards(tmp_path, num_images=48, shard_size=24)]
    eval_tf = T.Compose([T.Resize(160), T.CenterCrop(128)])  # deterministic: the same plans on both paths
    gpu = DataLoaderX(TarShardDataset(shards, transform=eval_tf, fields=FIELDS), batch_size=16, decode_on="cuda")
    cpu = DataLoaderX(TarShardDataset(shards, transform=eval_tf, fields=FIELDS), batch_size=16, device="cpu")
    for ours, theirs in zip(gpu, cpu):
        assert ours["image"].device.type == "cuda" and ours["image"].shape == theirs["image"].shape
        assert (ours["image"].cpu().float() - theirs["image"].float()).abs().mean() < 3.0
        assert torch.equal(ours["mask"].cpu(), theirs["mask"])
        for got, expected in zip(ours["target"], theirs["target"]):
            assert torch.equal(got["boxes"].cpu(), expected["boxes"])
            assert torch.equal(got["labels"].cpu(), expected["labels"])


def test_normalize_on_the_gpu_leaves_masks_alone(tmp_path: Path) -> None:
    shards = [str(path) for path in make_detection_shards(tmp_path, num_images=16, shard_size=16)]
    train_tf = T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip()])
    loader = DataLoaderX(
        TarShardDataset(shards, transform=train_tf, fields=FIELDS),
        batch_size=8,
        local_rank=0,
        normalize=([0.5] * 3, [0.25] * 3),
    )
    for batch in loader:
        assert batch["image"].dtype == torch.float32 and batch["image"].device.type == "cuda"
        assert batch["mask"].dtype == torch.uint8 and batch["mask"].shape == (8, 128, 128)
        assert int(batch["mask"].max()) <= 4
