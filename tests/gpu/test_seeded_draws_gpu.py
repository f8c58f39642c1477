"""With seed=, random_flip on the GPU (after the side-stream copy) flips the samples the CPU path flips: the flips
travel with each batch from the worker that fetched it (fastloader.sample_seeds), so the pixels are the same at
any num_workers and on either device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fastloader import DataLoaderX
from fastloader.sample import make_sample_folder
from tests.loader.test_seeded_draws import MEAN_STD, SEED, train_folder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def images(root: Path, workers: int, device: str) -> list[torch.Tensor]:
    loader = DataLoaderX(
        train_folder(root),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        seed=SEED,
        normalize=MEAN_STD,
        random_flip=0.5,
        device=device,
    )
    out: list[Any] = []
    for _ in range(2):
        out += [batch[0].cpu() for batch in loader]
    return out


def test_random_flip_on_the_gpu_is_the_cpus_at_any_num_workers(tmp_path: Path) -> None:
    root = make_sample_folder(tmp_path / "images", 12, num_classes=3)
    on_cpu = images(root, 0, "cpu")
    for workers in (0, 2):
        on_gpu = images(root, workers, "cuda")
        assert len(on_gpu) == len(on_cpu)
        for gpu, cpu in zip(on_gpu, on_cpu):
            torch.testing.assert_close(gpu, cpu)
