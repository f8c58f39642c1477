"""DataLoaderX against torch.utils.data.DataLoader: the same batches, the same signature, the same attributes."""

from __future__ import annotations

import copy
import inspect
import pickle
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from fastloader import DataLoaderX
from tests.toy_datasets import Counting, Epochs, Pair, RandomNoise, Sample, Squares, add_offset


def same(a: Any, b: Any) -> bool:
    """Deep equality for batches: tensors by value, dtype and shape; containers by type and content."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dataclass_fields__"):
        return all(same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return bool(a == b)


def collate_pairs(items: list[tuple[torch.Tensor, int]]) -> Pair:
    images, labels = zip(*items)
    return Pair(torch.stack(images), torch.tensor(labels))


def collate_dict(items: list[tuple[torch.Tensor, int]]) -> dict[str, Any]:
    images, labels = zip(*items)
    return {"image": torch.stack(images), "label": torch.tensor(labels), "keys": [f"k{i}" for i in labels]}


def collate_dataclass(items: list[tuple[torch.Tensor, int]]) -> Sample:
    images, labels = zip(*items)
    return Sample(torch.stack(images), len(labels), key="batch")


def epochs_of(loader: DataLoader[Any], epochs: int, seed: int) -> list[list[Any]]:
    torch.manual_seed(seed)
    out = []
    for epoch in range(epochs):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)  # type: ignore[union-attr]
        out.append(list(loader))
    return out


# Each case builds keyword arguments afresh (samplers and generators are stateful).
CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "defaults": lambda: {"dataset": Squares()},
    "shuffle_drop_last": lambda: {"dataset": Squares(), "batch_size": 7, "shuffle": True, "drop_last": True},
    "shuffle_workers": lambda: {"dataset": Squares(), "batch_size": 6, "shuffle": True, "num_workers": 2},
    "generator": lambda: {
        "dataset": Squares(),
        "batch_size": 5,
        "shuffle": True,
        "generator": torch.Generator().manual_seed(7),
    },
    "sampler": lambda: {
        "dataset": Squares(),
        "batch_size": 4,
        "sampler": SubsetRandomSampler(range(0, 50, 3), generator=torch.Generator().manual_seed(3)),
    },
    "weighted_sampler": lambda: {
        "dataset": Squares(),
        "batch_size": 8,
        "sampler": WeightedRandomSampler([1.0] * 25 + [3.0] * 25, 40, generator=torch.Generator().manual_seed(1)),
        "num_workers": 2,
    },
    "batch_sampler": lambda: {
        "dataset": Squares(),
        "batch_sampler": BatchSampler(RandomSampler(range(50)), batch_size=9, drop_last=False),
    },
    "batch_sampler_lists": lambda: {"dataset": Squares(), "batch_sampler": [[3, 1], [4, 1, 5], [9, 2, 6, 5]]},
    "no_auto_collation": lambda: {"dataset": Squares(), "batch_size": None, "shuffle": True},
    "collate_namedtuple": lambda: {"dataset": Squares(), "batch_size": 8, "collate_fn": collate_pairs},
    "collate_dict_workers": lambda: {
        "dataset": Squares(),
        "batch_size": 8,
        "collate_fn": collate_dict,
        "num_workers": 2,
    },
    "collate_dataclass": lambda: {"dataset": Squares(), "batch_size": 8, "collate_fn": collate_dataclass},
    "worker_init_fn": lambda: {"dataset": Squares(), "batch_size": 4, "num_workers": 2, "worker_init_fn": add_offset},
    "worker_rng": lambda: {"dataset": RandomNoise(), "batch_size": 4, "num_workers": 2},
    "iterable_workers": lambda: {"dataset": Counting(), "batch_size": 3, "num_workers": 3},
    "iterable_out_of_order": lambda: {"dataset": Counting(), "batch_size": 3, "num_workers": 2, "in_order": False},
    "persistent_workers": lambda: {
        "dataset": Squares(),
        "batch_size": 10,
        "shuffle": True,
        "num_workers": 2,
        "persistent_workers": True,
        "prefetch_factor": 3,
    },
    "pin_memory_timeout": lambda: {
        "dataset": Squares(),
        "batch_size": 10,
        "num_workers": 1,
        "pin_memory": True,
        "timeout": 30,
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_batches_as_torch(case: str) -> None:
    expected = epochs_of(DataLoader(**CASES[case]()), epochs=3, seed=1234)
    got = epochs_of(DataLoaderX(**CASES[case]()), epochs=3, seed=1234)
    if case == "iterable_out_of_order":  # order between workers is not defined with in_order=False
        expected = [sorted(torch.cat(e).tolist()) for e in expected]  # type: ignore[misc]
        got = [sorted(torch.cat(e).tolist()) for e in got]  # type: ignore[misc]
    assert len(got) == 3 and all(len(epoch) > 0 for epoch in got)
    assert same(got, expected)
    if "shuffle" in case:
        assert not same(got[0], got[1]), "shuffled epochs should differ"


def test_len_matches_torch() -> None:
    for case in ("defaults", "shuffle_drop_last", "batch_sampler_lists", "no_auto_collation"):
        loader, reference = DataLoaderX(**CASES[case]()), DataLoader(**CASES[case]())
        assert len(loader) == len(reference)
        assert len(iter(loader)) == len(iter(reference))


def test_signature_is_torchs_plus_keyword_only_extras() -> None:
    ours = inspect.signature(DataLoaderX.__init__).parameters
    theirs = inspect.signature(DataLoader.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for name, param in theirs.items():
        assert ours[name].kind == param.kind, name
        assert ours[name].default == param.default, name
    extras = {name: p for name, p in ours.items() if name not in theirs}
    assert set(extras) == {
        "local_rank",
        "device",
        "max_prefetch",
        "non_blocking",
        "normalize",
        "normalize_dtype",
        "channels_last",
        "random_flip",
        "decode_on",
        "distributed",
        "seed",
        "report_every",
        "stall_warning",
        "snapshot_every_n_steps",
        "ledger",
        "worker_method",
    }
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extras.values())


def test_every_argument_is_stored_under_its_own_name() -> None:
    sampler = SequentialSampler(range(50))
    kwargs: dict[str, Any] = {
        "dataset": Squares(),
        "batch_size": 5,
        "shuffle": False,
        "sampler": sampler,
        "num_workers": 2,
        "collate_fn": collate_pairs,
        "pin_memory": True,
        "drop_last": True,
        "timeout": 12.0,
        "worker_init_fn": add_offset,
        "multiprocessing_context": "fork",
        "generator": torch.Generator(),
        "prefetch_factor": 3,
        "persistent_workers": True,
        "in_order": False,
        "local_rank": 0,
        "max_prefetch": 4,
        "non_blocking": False,
    }
    loader = DataLoaderX(**kwargs)
    for name, value in kwargs.items():
        if name == "multiprocessing_context":
            assert loader.multiprocessing_context.get_start_method() == "fork"
        else:
            assert getattr(loader, name) is value or getattr(loader, name) == value, name
    assert loader.device == torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def test_rebuild_from_saved_args_like_lightning() -> None:
    args: tuple[Any, ...] = (Squares(), 6)
    kwargs: dict[str, Any] = {"shuffle": True, "num_workers": 2, "max_prefetch": 3, "local_rank": 0}
    loader = DataLoaderX(*args, **kwargs)
    rebuilt = type(loader)(*args, **kwargs)
    assert isinstance(rebuilt, DataLoaderX)
    assert (rebuilt.batch_size, rebuilt.max_prefetch, rebuilt.local_rank) == (6, 3, 0)
    assert len(list(rebuilt)) == len(loader)


def test_rebuild_from_vars_with_a_new_sampler() -> None:
    """What Lightning does without saved args: read each __init__ parameter off the instance."""
    loader = DataLoaderX(Squares(), batch_size=4, num_workers=1, max_prefetch=5, non_blocking=False)
    params = inspect.signature(type(loader).__init__).parameters
    attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
    attrs["multiprocessing_context"] = loader.multiprocessing_context
    kwargs = {name: attrs[name] for name in params if name in attrs}
    assert set(params) - {"self"} <= set(kwargs), "every parameter must be readable off the instance"
    kwargs.update(sampler=SequentialSampler(range(10)), batch_sampler=None, shuffle=False)
    rebuilt = type(loader)(**kwargs)
    assert (rebuilt.max_prefetch, rebuilt.non_blocking, rebuilt.num_workers) == (5, False, 1)
    assert torch.cat([labels for _, labels in rebuilt]).tolist() == list(range(10))


def test_lightning_update_dataloader_keeps_our_class_and_extras() -> None:
    lightning_data = pytest.importorskip("lightning.fabric.utilities.data")
    with lightning_data._replace_dunder_methods(DataLoader, "dataset"):
        loader = DataLoaderX(Squares(), batch_size=5, shuffle=True, num_workers=2, max_prefetch=3)
    sampler = SequentialSampler(range(20))
    rebuilt = lightning_data._update_dataloader(loader, sampler)
    assert type(rebuilt) is DataLoaderX
    assert (rebuilt.max_prefetch, rebuilt.num_workers, rebuilt.batch_size) == (3, 2, 5)
    assert torch.cat([labels for _, labels in rebuilt]).tolist() == list(range(20))


def test_lightning_update_dataloader_from_attributes() -> None:
    lightning_data = pytest.importorskip("lightning.fabric.utilities.data")
    loader = DataLoaderX(Squares(), batch_size=5, max_prefetch=4, non_blocking=False)
    rebuilt = lightning_data._update_dataloader(loader, SequentialSampler(range(10)))
    assert type(rebuilt) is DataLoaderX and (rebuilt.max_prefetch, rebuilt.non_blocking) == (4, False)
    assert len(list(rebuilt)) == 2


def test_deepcopy_and_pickle() -> None:
    loader = DataLoaderX(Squares(), batch_size=10)
    list(loader)  # make the per-loader state exist
    for clone in (copy.deepcopy(loader), pickle.loads(pickle.dumps(loader))):
        assert same(list(clone), list(loader))


def test_set_epoch_reaches_sampler_batch_sampler_and_dataset_once() -> None:
    class EpochSampler(SequentialSampler):
        def __init__(self, data: Any) -> None:
            super().__init__(data)
            self.epochs: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

    dataset = Epochs()
    sampler = EpochSampler(dataset)
    loader = DataLoaderX(dataset, sampler=sampler, batch_size=2)
    loader.set_epoch(3)
    assert sampler.epochs == [3] and dataset.epochs == [3]

    inner = EpochSampler(dataset)
    loader = DataLoaderX(dataset, batch_sampler=BatchSampler(inner, 2, False))
    loader.set_epoch(5)
    assert inner.epochs == [5] and dataset.epochs == [3, 5]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_bad_max_prefetch_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="max_prefetch"):
        DataLoaderX(Squares(), max_prefetch=bad)  # type: ignore[arg-type]


def test_torch_argument_errors_are_unchanged() -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoaderX(Squares(), shuffle=True, sampler=SequentialSampler(range(3)))
    with pytest.raises(ValueError, match="persistent_workers"):
        DataLoaderX(Squares(), persistent_workers=True)


def test_without_cuda_batches_stay_on_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    loader = DataLoaderX(Squares(), batch_size=10, local_rank=1, pin_memory=True)
    assert loader.device == torch.device("cpu")
    assert all(images.device.type == "cpu" for images, _ in loader)


class SizedCounting(IterableDataset[int]):
    """An IterableDataset whose ``len()`` is honest for one process, so that workers yield more."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def length_warnings(cls: type[DataLoader[Any]], workers: int) -> list[int]:
    """For each ``next()``: how many "more samples than len()" warnings it raised, in the caller's thread."""
    loader = cls(SizedCounting(20), num_workers=workers, batch_size=None)
    assert len(loader) == 20  # torch warns only once len() was asked
    iterator, counts = iter(loader), []
    while True:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                next(iterator)
            except StopIteration:
                return counts
        counts.append(sum("samples have been fetched" in str(warning.message) for warning in caught))


@pytest.mark.parametrize("workers", [0, 2])
def test_length_warning_comes_at_the_same_next_as_torchs(workers: int) -> None:
    expected = length_warnings(DataLoader, workers)
    assert sum(expected) == 20 * max(workers, 1) - 20  # the control warns once per batch past len()
    assert length_warnings(DataLoaderX, workers) == expected


def test_torchs_iterator_state_is_readable_on_ours() -> None:
    iterator = iter(DataLoaderX(SizedCounting(8), num_workers=2, batch_size=None))
    assert len(iterator._workers) == 2 and iterator._num_workers == 2  # as torch's own tests read them
    with pytest.raises(AttributeError):
        _ = iterator.no_such_attribute


def test_gpu_decode_is_per_loader_and_leaves_the_users_dataset_alone(tmp_path: Any) -> None:
    """decode_on="cuda" needs encoded items from the dataset: the loader switches its own copy."""
    from fastloader import transforms as T
    from fastloader.datasets import ImageFolder
    from fastloader.image.batching import EncodedImage
    from fastloader.loader.arguments import dataset_for_decode
    from fastloader.sample import make_sample_folder

    make_sample_folder(tmp_path / "sample", 8, num_classes=2)
    dataset = ImageFolder(tmp_path / "sample", transform=T.Compose([T.Resize(64), T.CenterCrop(48)]))
    own, gpu = dataset_for_decode(dataset, "cuda", torch.device("cuda"))  # what a CUDA loader does
    assert gpu and own is not dataset and own.decode_device == "cuda" and dataset.decode_device == "cpu"
    assert isinstance(own[0][0], EncodedImage) and own.source is dataset.source
    pixels = next(iter(DataLoaderX(dataset, batch_size=4)))[0]  # a second loader, on the CPU, same dataset
    assert pixels.dtype == torch.uint8 and pixels.shape == (4, 3, 48, 48)
    same, gpu = dataset_for_decode(dataset, "cpu", torch.device("cuda"))
    assert same is dataset and not gpu


def test_with_num_workers_0_the_dataset_runs_in_the_loaders_device_context(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without workers the dataset and collate_fn run in the producer thread: a ``.cuda()`` there must
    # land on the loader's device (cuda:local_rank), so the thread runs inside ``on_device``. Recorded
    # here with a stand-in context, since this machine has no GPU (tests/gpu checks the real one).
    import contextlib
    import threading

    from fastloader.loader import epoch as module

    current = threading.local()

    @contextlib.contextmanager
    def recording(device: torch.device) -> Iterator[None]:
        current.device = device
        try:
            yield
        finally:
            current.device = None

    monkeypatch.setattr(module, "on_device", recording)
    seen: list[Any] = []

    def collate(batch: list[int]) -> list[int]:
        seen.append(("collate", getattr(current, "device", None), threading.current_thread().name))
        return batch

    list(DataLoaderX(Counting(6), batch_size=2, device="cpu", collate_fn=collate))
    assert seen == [("collate", torch.device("cpu"), "fastloader-dataloaderx")] * 3


def test_the_default_collate_fn_is_fastloaders_and_the_differences_page_says_so() -> None:
    """Every argument keeps its attribute, but collate_fn=None does not stay None nor become torch's
    default_collate: the page listing the differences from torch must name it."""
    from fastloader.image.batching import collate

    assert DataLoaderX(list(range(4)), batch_size=2, device="cpu").collate_fn is collate
    page = (Path(__file__).resolve().parents[2] / "docs" / "differences.md").read_text(encoding="utf-8")
    assert "`loader.collate_fn` is\n  `fastloader.image.batching.collate`, not torch's `default_collate`" in page
