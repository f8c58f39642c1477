"""timm's ImageNet recipes through DataLoaderX, with torch's DataLoader as the control in the same test: the
train transform (RandAugment with ``mstd``, RandomErasing), the eval transform, mixup / cutmix in the training
loop and in the collate function; 2 workers, 2 epochs, every batch equal. And DataLoaderX's own promise, which
torch's loader does not make: a mid-epoch ``state_dict()`` resumes on the uninterrupted batches."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset

from fastloader import DataLoaderX
from fastloader.datasets import ImageFolder
from tests.images import write_image_folder

timm_data = pytest.importorskip("timm.data")

COUNT = 24  # 6 batches an epoch: a resume point mid-epoch with batches on both sides
BATCH = 4  # even: timm's mixup pairs each sample with its mirror in the batch
EPOCHS = 2
WORKERS = 2
# timm's ImageNet train recipe: RandAugment whose magnitude is drawn per image (random.gauss: an odd number of
# draws leaves a cached value in the workers' random state), RandomErasing a quarter of the images
RECIPE: dict[str, Any] = {"is_training": True, "auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25}
MIXUP: dict[str, Any] = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing": 0.1, "num_classes": 3}

Batch = Any


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("timm") / "train"
    write_image_folder(root, count=COUNT, classes=3)  # JPEGs and PNGs in the modes real folders hold
    return root


def run(
    loader_class: type[DataLoader[Any]],
    dataset: Dataset[Any],
    *,
    epochs: int = EPOCHS,
    each: Callable[[Batch], Batch] = lambda batch: batch,
    **options: Any,
) -> list[Batch]:
    """Every batch of ``epochs`` epochs, after the seeds a training script sets (``each`` is the loop's work)."""
    torch.manual_seed(0)
    np.random.seed(0)  # timm's Mixup draws from numpy's global generator, in the training process
    loader = loader_class(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, **options)
    return [each(batch) for _ in range(epochs) for batch in loader]


def assert_same(got: list[Batch], expected: list[Batch]) -> None:
    """Batch by batch, field by field: equal values, dtypes and shapes."""
    assert len(got) == len(expected) == EPOCHS * COUNT // BATCH
    for number, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        assert len(ours) == len(theirs)
        for field, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert a.dtype == b.dtype and a.shape == b.shape, (number, field)
            assert torch.equal(a, b), f"batch {number}, field {field} differs"


def assert_random(batches: list[Batch]) -> None:
    """The recipe drew: the second epoch is not the first replayed (a control that drew nothing proves nothing)."""
    half = len(batches) // 2
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(batches[:half], batches[half:], strict=True))


def test_train_recipe_over_torchvision_image_folder_matches_torch(folder: Path) -> None:
    dataset = torchvision.datasets.ImageFolder(str(folder), transform=timm_data.create_transform(224, **RECIPE))
    expected = run(DataLoader, dataset)
    assert_random(expected)
    assert_same(run(DataLoaderX, dataset), expected)


def test_train_recipe_over_fastloader_image_folder_matches_torch(folder: Path) -> None:
    # A transform that is not fastloader's own gets the decoded PIL image, as torchvision's ImageFolder gives it
    dataset = ImageFolder(str(folder), transform=timm_data.create_transform(224, **RECIPE))
    expected = run(DataLoader, dataset)
    assert_random(expected)
    assert_same(run(DataLoaderX, dataset), expected)


def test_eval_transform_matches_torch(folder: Path) -> None:
    dataset = torchvision.datasets.ImageFolder(str(folder), transform=timm_data.create_transform(224))
    assert_same(run(DataLoaderX, dataset), run(DataLoader, dataset))


def test_mixup_in_the_training_loop_matches_torch(folder: Path) -> None:
    dataset = torchvision.datasets.ImageFolder(str(folder), transform=timm_data.create_transform(224, **RECIPE))

    def mix(batch: Batch) -> Batch:
        return mixup(*batch)

    mixup = timm_data.Mixup(**MIXUP)
    expected = run(DataLoader, dataset, each=mix)
    assert expected[0][1].dtype == torch.float32 and expected[0][1].shape == (BATCH, 3)  # soft targets
    mixup = timm_data.Mixup(**MIXUP)
    assert_same(run(DataLoaderX, dataset, each=mix), expected)


def test_fast_collate_mixup_matches_torch(folder: Path) -> None:
    # use_prefetcher=True: uint8 CHW tensors, no normalization, what FastCollateMixup collates (in the workers)
    transform = timm_data.create_transform(224, use_prefetcher=True, **{**RECIPE, "re_prob": 0.0})
    dataset = torchvision.datasets.ImageFolder(str(folder), transform=transform)
    collate = timm_data.FastCollateMixup(**MIXUP)
    expected = run(DataLoader, dataset, collate_fn=collate)
    assert expected[0][0].dtype == torch.uint8 and expected[0][1].shape == (BATCH, 3)
    assert_random(expected)
    assert_same(run(DataLoaderX, dataset, collate_fn=collate), expected)


def recipe_loader_options(folder: Path, recipe: str) -> tuple[Dataset[Any], dict[str, Any]]:
    """The train recipe's dataset and loader options: mixup in the loop's hands or in the workers' collate."""
    if recipe == "randaugment":
        return torchvision.datasets.ImageFolder(str(folder), transform=timm_data.create_transform(224, **RECIPE)), {}
    transform = timm_data.create_transform(224, use_prefetcher=True, **{**RECIPE, "re_prob": 0.0})
    dataset = torchvision.datasets.ImageFolder(str(folder), transform=transform)
    return dataset, {"collate_fn": timm_data.FastCollateMixup(**MIXUP)}  # its numpy draws: the workers' generator


@pytest.mark.parametrize("recipe", ["randaugment", "fast_collate_mixup"])
@pytest.mark.parametrize("after", [1, 4])
def test_train_recipe_resumes_mid_epoch_on_the_uninterrupted_batches(folder: Path, recipe: str, after: int) -> None:
    dataset, options = recipe_loader_options(folder, recipe)
    full = run(DataLoaderX, dataset, **options)
    torch.manual_seed(0)
    np.random.seed(0)
    loader = DataLoaderX(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, **options)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(after)]
    state = json.loads(json.dumps(loader.state_dict()))  # through a checkpoint file's JSON
    del iterator, loader  # the job dies here
    torch.manual_seed(0)  # the restarted script seeds as it did
    np.random.seed(0)
    resumed = DataLoaderX(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, **options)
    resumed.load_state_dict(state)
    rest = [batch for _ in range(EPOCHS) for batch in resumed]  # the epoch's rest, then the next epoch
    assert_same(first + rest, full)
