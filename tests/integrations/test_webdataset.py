"""webdataset's pipelines as users write them, given to DataLoaderX and to torch's DataLoader (the control) in the
same test: ``WebDataset(...).decode("pil").to_tuple(...).map_tuple(...)`` and a ``DataPipeline`` split by worker,
2 workers, 2 epochs, every sample equal. And a mid-epoch ``state_dict()`` of DataLoaderX resumes on the
uninterrupted samples (a webdataset pipeline has no state of its own: each worker makes its batches again)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset
from torchvision import transforms

from fastloader import DataLoaderX
from tests.images import photo

wds = pytest.importorskip("webdataset")

SHARDS = 4  # 2 a worker: split_by_worker gives worker w the shards w, w + 2
PER_SHARD = 6
BATCH = 4
EPOCHS = 2
WORKERS = 2

Sample = tuple[torch.Tensor, int]


def identity(value: Any) -> Any:
    return value


# Random crops and flips drawn from the workers' torch generators: equal samples mean equal seeds, epoch by epoch
TRANSFORM = transforms.Compose(
    [transforms.RandomResizedCrop(32), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
)


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Shards written by webdataset's own TarWriter, of real JPEGs of varied sizes, labelled."""
    root = tmp_path_factory.mktemp("wds")
    paths = []
    for shard in range(SHARDS):
        path = root / f"train-{shard:04d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for item in range(PER_SHARD):
                index = shard * PER_SHARD + item
                image = photo(width=48 + 4 * index, height=40 + 2 * index, seed=index)
                sink.write({"__key__": f"{index:06d}", "jpg": image, "cls": index})
        paths.append(str(path))
    return paths


def web_dataset(urls: list[str]) -> IterableDataset[Any]:
    return wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("jpg", "cls").map_tuple(TRANSFORM, identity)


def data_pipeline(urls: list[str]) -> IterableDataset[Any]:
    return wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.decode("pil"),
        wds.to_tuple("jpg", "cls"),
        wds.map_tuple(TRANSFORM, identity),
    )


PIPELINES: dict[str, Callable[[list[str]], IterableDataset[Any]]] = {
    "WebDataset": web_dataset,
    "DataPipeline": data_pipeline,
}


def samples(batches: list[Any]) -> list[Sample]:
    return [(image, int(label)) for images, labels in batches for image, label in zip(images, labels, strict=True)]


def run(loader_class: type[DataLoader[Any]], dataset: IterableDataset[Any]) -> list[Any]:
    torch.manual_seed(0)
    loader = loader_class(dataset, batch_size=BATCH, num_workers=WORKERS)
    return [batch for _ in range(EPOCHS) for batch in loader]


def assert_same(got: list[Sample], expected: list[Sample]) -> None:
    assert [label for _, label in got] == [label for _, label in expected]
    for number, ((ours, _), (theirs, _)) in enumerate(zip(got, expected, strict=True)):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), f"sample {number} differs"


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_pipeline_gives_dataloaderx_the_samples_it_gives_torch(urls: list[str], pipeline: str) -> None:
    dataset = PIPELINES[pipeline](urls)
    expected = samples(run(DataLoader, dataset))
    # every sample once an epoch (the shards split over the workers, nothing twice), new crops the next epoch
    half = len(expected) // 2
    assert sorted(label for _, label in expected) == sorted(2 * list(range(SHARDS * PER_SHARD)))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(expected[:half], expected[half:], strict=True))
    assert_same(samples(run(DataLoaderX, dataset)), expected)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("after", [1, 4])
def test_pipeline_resumes_mid_epoch_on_the_uninterrupted_samples(urls: list[str], pipeline: str, after: int) -> None:
    dataset = PIPELINES[pipeline](urls)
    full = samples(run(DataLoaderX, dataset))
    torch.manual_seed(0)
    loader = DataLoaderX(dataset, batch_size=BATCH, num_workers=WORKERS)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(after)]
    state = json.loads(json.dumps(loader.state_dict()))  # through a checkpoint file's JSON
    del iterator, loader  # the job dies here
    torch.manual_seed(0)  # the restarted script seeds as it did
    resumed = DataLoaderX(PIPELINES[pipeline](urls), batch_size=BATCH, num_workers=WORKERS)
    resumed.load_state_dict(state)
    rest = [batch for _ in range(EPOCHS) for batch in resumed]  # the epoch's rest, then the next epoch
    assert_same(samples(first + rest), full)
