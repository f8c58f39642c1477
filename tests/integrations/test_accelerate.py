"""fastloader.integrations.accelerate in this process (one process, CPU), with accelerate's own prepare of
torch's DataLoader as the control where both apply. The 2-rank runs are in test_integrations.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Sampler

from fastloader import DataLoaderX
from fastloader.loader.resume_samplers import order_sampler
from fastloader.samplers import RandomSampler
from tests.integrations.common import BATCH, LENGTH, Items, reset_accelerate
from tests.toy_datasets import Counting

pytest.importorskip("accelerate")
from accelerate import Accelerator, DataLoaderConfiguration  # noqa: E402
from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402

from fastloader.integrations.accelerate import PreparedLoader, prepare, prepare_loader  # noqa: E402

Make = Callable[..., Accelerator]
FULL = -(-LENGTH // BATCH)  # 13 batches, the last of 5


@pytest.fixture
def accelerator_of() -> Iterator[Make]:
    """Accelerators on the CPU; accelerate's shared state is reset afterwards (DataLoaderX asks whether
    an accelerate state is initialised, so no other test may inherit one)."""
    yield lambda **config: Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
    reset_accelerate()


def loader(**kwargs: Any) -> DataLoaderX[Any]:
    return DataLoaderX(Items(), batch_size=BATCH, **{"shuffle": True, **kwargs})


def epoch(prepared: Any) -> list[list[int]]:
    return [indices.tolist() for _x, indices in prepared]


def test_dataloaderx_is_kept_and_the_rest_goes_to_accelerate(accelerator_of: Make) -> None:
    accelerator = accelerator_of()
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plain: DataLoader[Any] = DataLoader(Items(), batch_size=BATCH)
    model, optimizer, ours, plain = prepare(accelerator, model, optimizer, loader(), plain)
    assert isinstance(ours, PreparedLoader) and type(ours.base_dataloader) is DataLoaderX
    assert type(plain).__name__ == "DataLoaderShard" and isinstance(optimizer, AcceleratedOptimizer)
    assert [id(item) for item in accelerator._dataloaders] == [id(ours), id(plain)]
    assert accelerator.prepare(ours) is ours and prepare_loader(accelerator, ours) is ours
    assert [id(item) for item in accelerator._dataloaders] == [id(ours), id(plain)]  # kept, not added twice
    with pytest.raises(ValueError, match="prepare_loader needs a fastloader.DataLoaderX, got DataLoader"):
        prepare_loader(accelerator, DataLoader(Items()))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["torch", "fastloader"])
def test_gradient_state_sees_the_end_of_the_data(accelerator_of: Make, kind: str) -> None:
    accelerator = accelerator_of()
    if kind == "torch":  # the control: accelerate's DataLoaderShard
        prepared = accelerator.prepare(DataLoader(Items(), batch_size=BATCH, shuffle=True))
    else:
        prepared = prepare(accelerator, loader())
    state = accelerator.gradient_state
    seen = [(state.end_of_dataloader, state.remainder, state.active_dataloader is prepared) for _batch in prepared]
    assert seen == [(False, LENGTH % BATCH, True)] * (FULL - 1) + [(True, LENGTH % BATCH, True)]
    assert not state.in_dataloader


def test_set_epoch_reaches_the_sampler_inside_accelerates_batch_sampler(accelerator_of: Make) -> None:
    prepared = prepare(accelerator_of(), loader(seed=3))
    reference = RandomSampler(Items(), seed=3)
    for number in (4, 0):
        prepared.set_epoch(number)
        reference.set_epoch(number)
        order = list(reference)
        assert epoch(prepared) == [order[i : i + BATCH] for i in range(0, LENGTH, BATCH)]
    assert prepared.iteration == 1  # accelerate's own count goes on from the epoch set


def test_iterable_dataset_each_sample_once(accelerator_of: Make) -> None:
    accelerator = accelerator_of()
    prepared = prepare(accelerator, DataLoaderX(Counting(10), batch_size=4))
    batches = []
    for batch in prepared:
        batches.append((batch.tolist(), accelerator.gradient_state.end_of_dataloader))
    assert batches == [([0, 1, 2, 3], False), ([4, 5, 6, 7], False), ([8, 9], True)]


@pytest.mark.parametrize("kind", ["torch", "fastloader"])
def test_save_state_load_state_resume_mid_epoch(accelerator_of: Make, tmp_path: Path, kind: str) -> None:
    """One process: accelerate gives the sampler no generator, the order comes from torch's global RNG."""

    def make(seed: int) -> tuple[Accelerator, Any]:
        torch.manual_seed(seed)
        accelerator = accelerator_of()
        if kind == "torch":
            return accelerator, accelerator.prepare(DataLoader(Items(), batch_size=BATCH, shuffle=True, num_workers=2))
        return accelerator, prepare(accelerator, loader(num_workers=2))

    accelerator, prepared = make(0)
    full = epoch(prepared)  # epoch 0
    for step, (_x, indices) in enumerate(prepared):  # epoch 1, saved after its 5th batch
        full.append(indices.tolist())
        if step == 4:
            accelerator.save_state(str(tmp_path / "checkpoint"))
    accelerator, prepared = make(1)  # as after a crash: a new loader, another seed
    accelerator.load_state(str(tmp_path / "checkpoint"))
    rest = epoch(prepared)
    if kind == "torch":  # the control: a full epoch again, in another order
        assert len(rest) == FULL and rest != full[FULL + 5 :]
    else:
        assert rest == full[FULL + 5 :]


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_load_state_dict_on_the_same_loader(accelerator_of: Make, workers: int, persistent: bool) -> None:
    accelerator = accelerator_of()
    prepared = prepare(accelerator, loader(num_workers=workers, persistent_workers=persistent, seed=7))
    epoch(prepared)  # epoch 0
    taken = []
    for _x, indices in prepared:  # epoch 1: 3 batches, then a break
        taken.append(indices.tolist())
        if len(taken) == 3:
            break
    state = prepared.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (1, 3)
    prepared.load_state_dict(state)
    rest = epoch(prepared)
    uninterrupted = prepare(accelerator, loader(seed=7))
    uninterrupted.set_epoch(1)
    assert taken + rest == epoch(uninterrupted)


def test_use_seedable_sampler_resumes(accelerator_of: Make) -> None:
    """accelerate's SeedableRandomSampler replaces the loader's shuffling sampler (its order: data_seed + epoch)."""

    def make(seed: int) -> PreparedLoader:
        torch.manual_seed(seed)
        return prepare(accelerator_of(use_seedable_sampler=True, data_seed=11), loader())

    prepared = make(0)
    assert type(order_sampler(prepared.base_dataloader)).__name__ == "SeedableRandomSampler"
    first = epoch(prepared)  # epoch 0
    taken = []
    for _x, indices in prepared:  # epoch 1: 4 batches, then a break
        taken.append(indices.tolist())
        if len(taken) == 4:
            break
    state = prepared.state_dict()
    resumed = make(1)  # another global seed: the order is data_seed's
    resumed.load_state_dict(state)
    rest = epoch(resumed)
    prepared.set_epoch(1)
    whole = epoch(prepared)  # epoch 1 again, uninterrupted
    assert taken + rest == whole and whole != first


def test_a_state_after_the_last_batch_names_the_next_epoch(accelerator_of: Make) -> None:
    accelerator = accelerator_of()
    prepared = prepare(accelerator, loader(seed=5))
    for _batch in prepared:
        state = prepared.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (1, 0)
    assert (prepared.state_dict()["epoch"], prepared.state_dict()["batches_yielded"]) == (1, 0)
    resumed = prepare(accelerator, loader(seed=5))
    resumed.load_state_dict(state)
    assert epoch(resumed) == epoch(prepared)  # both epoch 1, from its start


class GlobalOrder(Sampler[int]):
    """An order from torch's global RNG that nothing records."""

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(LENGTH).tolist())

    def __len__(self) -> int:
        return LENGTH


def test_load_state_dict_refuses_what_it_cannot_resume(accelerator_of: Make) -> None:
    accelerator = accelerator_of()
    prepared = prepare(accelerator, loader(seed=1))
    with pytest.raises(ValueError, match=r"DataLoaderX state version None is not supported"):
        prepared.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match=r"not a fastloader.integrations.accelerate/1 loader state: expected the keys"):
        prepared.load_state_dict({"format": "fastloader.integrations.accelerate/1", "epoch": 0})
    other = prepare(accelerator, DataLoaderX(Items(), batch_size=4, seed=1, shuffle=True))
    batches = iter(other)
    for _ in range(3):
        next(batches)
    with pytest.raises(ValueError, match=r"stops at sample 12 of epoch 0, which is not at a batch of .*batch_size=8"):
        prepared.load_state_dict(other.state_dict())
    for made, problem in (
        (DataLoaderX(Items(), batch_size=BATCH, sampler=GlobalOrder()), "the order of tests.integrations"),
        (DataLoaderX(Items(), batch_size=BATCH, shuffle=True, generator=None), None),
    ):
        source = prepare(accelerator, made)
        fresh_state = source.state_dict()  # at the start of an epoch: always resumable
        next(iter(source))
        if problem is not None:
            with pytest.raises(ValueError, match=f"cannot resume this loader mid-epoch exactly: {problem}"):
                source.load_state_dict(source.state_dict())
        source.load_state_dict(fresh_state)


def test_a_state_of_the_former_accelerate_format_still_loads(accelerator_of: Make) -> None:
    """States saved before the prepared loader's state was DataLoaderX's own are converted."""
    accelerator = accelerator_of()
    reference = prepare(accelerator, loader(seed=1))
    reference.set_epoch(1)
    whole = epoch(reference)
    prepared = prepare(accelerator, loader(seed=1))
    old = {
        "format": "fastloader.integrations.accelerate/1",
        "epoch": 1,
        "batches_yielded": 3,
        "num_processes": 1,
        "total_batch_size": BATCH,
        "rng": "",
        "seed": -1,
    }
    prepared.load_state_dict(old)
    assert prepared.iteration == 1 and epoch(prepared) == whole[3:]


def test_an_iterable_dataset_resumes_mid_epoch_as_a_dataloaderx_does(accelerator_of: Make) -> None:
    prepared = prepare(accelerator_of(), DataLoaderX(Counting(10), batch_size=4))
    batches = iter(prepared)
    assert next(batches).tolist() == [0, 1, 2, 3]
    state = prepared.state_dict()
    resumed = prepare(accelerator_of(), DataLoaderX(Counting(10), batch_size=4))
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == [[4, 5, 6, 7], [8, 9]]


def test_dispatch_batches_is_refused(accelerator_of: Make) -> None:
    with pytest.raises(ValueError, match=r"dispatch_batches=True \(DataLoaderConfiguration\): rank 0 would read"):
        prepare(accelerator_of(dispatch_batches=True), loader())


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_skip_first_batches_starts_the_epoch_set_next_at_that_batch(
    accelerator_of: Make, workers: int, persistent: bool
) -> None:
    """As Trainer's resume calls it: skip_first_batches, then set_epoch, then iter(); the batches left
    out are never read, the end is seen at the last batch, and the epoch after is whole."""
    accelerator = accelerator_of()
    reference = prepare(accelerator, loader(seed=4))
    reference.set_epoch(1)
    epoch_one, epoch_two = epoch(reference), epoch(reference)
    prepared = prepare(accelerator, loader(seed=4, num_workers=workers, persistent_workers=persistent))
    dataset = prepared.base_dataloader.dataset
    assert prepared.skip_first_batches(3) is prepared
    assert prepared.state_dict()["batches_yielded"] == 3  # saved before the iteration: still at batch 3
    prepared.set_epoch(1)
    before = prepared.stats()["images"]
    rest, ends = [], []
    for _x, indices in prepared:
        rest.append(indices.tolist())
        ends.append(accelerator.gradient_state.end_of_dataloader)
    assert rest == epoch_one[3:] and ends == [False] * (FULL - 4) + [True]
    assert prepared.stats()["images"] - before == LENGTH - 3 * BATCH  # the skipped samples were not loaded
    assert epoch(prepared) == epoch_two and dataset is prepared.dataset


def test_skip_first_batches_of_an_iterable_dataset_reads_past_them(accelerator_of: Make) -> None:
    prepared = prepare(accelerator_of(), DataLoaderX(Counting(10), batch_size=4))
    assert [batch.tolist() for batch in prepared.skip_first_batches(1)] == [[4, 5, 6, 7], [8, 9]]
    assert [batch.tolist() for batch in prepared] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_skip_first_batches_refuses_what_is_not_a_batch_of_the_epoch(accelerator_of: Make) -> None:
    prepared = prepare(accelerator_of(), loader(seed=2))
    with pytest.raises(ValueError, match=rf"skip_first_batches\({FULL + 1}\): the epoch has {FULL} batches"):
        prepared.skip_first_batches(FULL + 1)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="num_batches"):
            prepared.skip_first_batches(bad)  # type: ignore[arg-type]
    assert [len(batch) for batch in prepared.skip_first_batches(FULL)] == []  # all of them: an empty epoch


def test_the_trainer_mixin_resumes_a_prepared_loader_and_refuses_an_unprepared_one(accelerator_of: Make) -> None:
    """ExactResumeMixin's hook, as Trainer calls it (the real Trainer: test_trainer.py); other loaders
    go to the Trainer's own get_resumed_dataloader."""
    from fastloader.integrations.transformers import ExactResumeMixin

    class Base:
        def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
            return ("the trainer's own", num_batches)

    class Mixed(ExactResumeMixin, Base):
        pass

    prepared = prepare(accelerator_of(), loader(seed=1))
    assert Mixed().get_resumed_dataloader(prepared, 2) is prepared and prepared.state_dict()["batches_yielded"] == 2
    plain: DataLoader[Any] = DataLoader(Items())
    assert Mixed().get_resumed_dataloader(plain, 2) == ("the trainer's own", 2)
    with pytest.raises(ValueError, match="a DataLoaderX it did not prepare: the Trainer cannot resume it mid-epoch"):
        Mixed().get_resumed_dataloader(loader(), 2)


def test_accelerates_skip_first_batches_of_an_iterable_dataset_is_refused(accelerator_of: Make) -> None:
    """accelerate rebuilds the loader as its SkipDataLoader over the dataset: refused at its first batch,
    naming the loader's own method, which does the same exactly."""
    accelerator = accelerator_of()
    prepared = prepare(accelerator, DataLoaderX(Counting(10), batch_size=4))
    with pytest.raises(ValueError, match=r"Call loader\.skip_first_batches\(n\) \(the loader's own method\)"):
        next(iter(accelerator.skip_first_batches(prepared, 1)))
    assert [batch.tolist() for batch in prepared.skip_first_batches(1)] == [[4, 5, 6, 7], [8, 9]]


def test_a_resume_in_a_later_epoch_without_a_generator_goes_on_with_new_orders(accelerator_of: Make) -> None:
    """shuffle=True on one process, no generator: each epoch's order is a draw of torch's global RNG. A state
    taken in epoch 1 and loaded after a restart (another global seed) gives the rest of epoch 1 and then the
    uninterrupted run's epochs 2 and 3, never epoch 1's order again."""

    def make(seed: int) -> PreparedLoader:
        torch.manual_seed(seed)
        return prepare(accelerator_of(), loader(num_workers=2))

    prepared = make(0)
    uninterrupted = [epoch(prepared) for _ in range(4)]
    prepared = make(0)
    epoch(prepared)
    taken = []
    for _x, indices in prepared:  # epoch 1: 3 batches, then the crash
        taken.append(indices.tolist())
        if len(taken) == 3:
            break
    state = prepared.state_dict()
    resumed = make(1)
    resumed.load_state_dict(state)
    assert taken + epoch(resumed) == uninterrupted[1]
    assert [epoch(resumed), epoch(resumed)] == uninterrupted[2:]


@pytest.mark.parametrize("seed", [7, None])
def test_a_prepared_loader_and_a_plain_dataloaderx_resume_each_others_state(accelerator_of: Make, seed: Any) -> None:
    """One resume implementation: the prepared loader's state is DataLoaderX's own, so a plain DataLoaderX over
    the same data (one process: accelerate's shard is the whole order) continues it identically, and the
    prepared loader continues the plain loader's state."""

    def plain() -> DataLoaderX[Any]:
        torch.manual_seed(3)
        return loader(seed=seed)

    def prepared_loader() -> PreparedLoader:
        torch.manual_seed(3)
        return prepare(accelerator_of(), loader(seed=seed))

    reference = plain()
    uninterrupted = [epoch(reference) for _ in range(3)]
    assert uninterrupted == [epoch(made) for made in [prepared_loader()] for _ in range(3)]
    for source, target in ((prepared_loader, plain), (plain, prepared_loader)):
        interrupted = source()
        epoch(interrupted)
        taken = []
        for _x, indices in interrupted:
            taken.append(indices.tolist())
            if len(taken) == 5:
                break
        state = interrupted.state_dict()
        torch.manual_seed(9)  # as after a restart: the order does not come from the global RNG now
        resumed = target()
        resumed.load_state_dict(state)
        assert taken + epoch(resumed) == uninterrupted[1]
        assert epoch(resumed) == uninterrupted[2]
