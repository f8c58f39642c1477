"""What fastloader relies on in torch's private internals, pinned on the installed torch (fastloader.torch_internals).

Each test exercises one group of them the way fastloader uses them, with real worker processes: after a torch
upgrade, a failure here names the internal that moved.
"""

from __future__ import annotations

import gc
import inspect
import multiprocessing
import queue
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, get_worker_info

from fastloader import torch_internals as internals

_DEADLINE_S = 60.0  # how long a test waits for worker processes to reach a state before it fails


class Numbers(Dataset[int]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return index


class WorkerIds(Dataset[int]):
    """Each item is the id of the worker that made it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        info = get_worker_info()
        return info.id if info is not None else -1


class Gated(Dataset[int]):
    """Item 0 waits for ``gate``: the batch holding it stays with its worker until the test opens it."""

    def __init__(self, gate: Any) -> None:
        self.gate = gate

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if index == 0:
            self.gate.wait()
        return index


class Counted(IterableDataset[int]):
    """Says it has 2 items and yields 4."""

    def __len__(self) -> int:
        return 2

    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


def _wait_for(condition: Any) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the workers did not get there in time")
        time.sleep(0.02)


def test_the_loader_internals() -> None:
    made: list[Any] = []

    class Recording(DataLoader[int]):
        def _get_iterator(self) -> Any:  # torch's __iter__ makes each iterator with it
            made.append(super()._get_iterator())
            return made[-1]

    assert isinstance(DataLoader.__dict__["_index_sampler"], property)
    batched = Recording(Numbers(), batch_size=2, num_workers=1, persistent_workers=True)
    assert internals.index_sampler(batched) is batched.batch_sampler
    unbatched = DataLoader(Numbers(), batch_size=None)
    assert internals.index_sampler(unbatched) is unbatched.sampler
    assert internals.persistent_iterator(batched) is None
    assert [batch.tolist() for batch in batched] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert internals.persistent_iterator(batched) is made[0]  # kept for the next epoch
    assert len(list(batched)) == 4 and len(made) == 1  # the same iterator, reset
    workers = internals.worker_processes(made[0])
    internals.drop_persistent_iterator(batched)
    assert internals.persistent_iterator(batched) is None and not any(process.is_alive() for process in workers)
    list(batched)
    assert len(made) == 2  # a new iterator, new workers


class Viewed(DataLoader[int]):
    """Its iterators are made from a view: the batches [[7, 6], [5]] and a collate that tags them."""

    def _get_iterator(self) -> Any:
        view = internals.LoaderView(self, [[7, 6], [5]], collate_fn=lambda items: ("viewed", items))
        if self.num_workers:
            return internals.MultiProcessIterStartingAt(view, lambda: 0)
        return internals.SingleProcessIterWith(view, lambda inner, dataset: inner)


@pytest.mark.parametrize("workers", [0, 1])
def test_torchs_iterator_takes_what_it_runs_from_the_view(workers: int) -> None:
    loader = Viewed(Numbers(), batch_size=2, num_workers=workers)
    assert list(loader) == [("viewed", [7, 6]), ("viewed", [5])]
    assert internals.index_sampler(loader) is loader.batch_sampler  # the loader's own are untouched


def test_the_iterator_internals() -> None:
    generator = torch.Generator().manual_seed(7)
    expected_seed = int(torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(7)).item())
    gate = multiprocessing.get_context("fork").Event()
    loader = DataLoader(Gated(gate), batch_size=2, num_workers=2, generator=generator)
    iterator = iter(loader)
    try:
        assert internals.base_seed(iterator) == expected_seed
        workers = internals.worker_processes(iterator)
        assert len(workers) == 2 and all(process.is_alive() and process.pid for process in workers)
        assert internals.awaited_batch(iterator) == (0, 0)  # batch 0 ([0, 1]) waits in worker 0
        _wait_for(lambda: internals.batches_in_workers(iterator) >= 1)  # worker 1 finished batch 1
        gate.set()
        assert [batch.tolist() for batch in iterator] == [[0, 1], [2, 3]]
    finally:
        gate.set()
        internals.shutdown_workers(iterator)
    assert not any(process.is_alive() for process in workers)
    assert internals.awaited_batch(iter(DataLoader(Numbers()))) is None  # no workers
    internals.shutdown_workers(iter(DataLoader(Numbers())))  # nothing to stop: no error


def test_the_length_check_can_be_taken_over() -> None:
    loader = DataLoader(Counted(), batch_size=None, num_workers=1)
    assert len(loader) == 2
    iterator = iter(loader)
    reported, dataset, workers = internals.take_reported_length(iterator)
    assert (reported, workers) == (2, 1) and isinstance(dataset, Counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's own "Length of IterableDataset" warning is gone
        assert [int(item) for item in iterator] == [0, 1, 2, 3]
    assert internals.take_reported_length(iter(DataLoader(Counted(), batch_size=None)))[0] is None  # len() not asked


class Events:
    """What an iterator tells: where each batch of indices went, and its workers once they had been shut down."""

    def __init__(self, stopped: list[list[bool]]) -> None:
        self.stopped = stopped
        self.sent_to: list[int | None] = []
        self.lost: list[int] = []

    def sent(self, worker: int | None) -> None:
        self.sent_to.append(worker)

    def worker_lost(self, worker: int) -> None:
        self.lost.append(worker)

    def workers_stopped(self, iterator: Any) -> None:
        self.stopped.append([process.is_alive() for process in internals.worker_processes(iterator)])


class Watched(DataLoader[int]):
    """Its iterator tells :class:`Events` what it does."""

    def __init__(self, stopped: list[list[bool]], persistent: bool) -> None:
        super().__init__(Numbers(), batch_size=2, num_workers=2, persistent_workers=persistent)
        self.events = Events(stopped)

    def _get_iterator(self) -> Any:
        return internals.MultiProcessIterStartingAt(self, lambda: 0, events=self.events)


def test_the_iterator_calls_back_once_its_workers_are_shut_down() -> None:
    stopped: list[list[bool]] = []
    assert len(list(Watched(stopped, persistent=False))) == 4
    gc.collect()
    assert stopped == [[False, False]]  # at the end of the epoch (torch shuts them down), not again when collected
    watched = Watched(stopped, persistent=False)
    list(watched)
    assert watched.events.sent_to[:4] == [0, 1, 0, 1] and set(watched.events.sent_to[4:]) == {None}  # none left
    assert watched.events.lost == []
    stopped.pop()
    persistent = Watched(stopped, persistent=True)
    assert len(list(persistent)) == 4 and len(stopped) == 1  # persistent workers stay
    internals.drop_persistent_iterator(persistent)
    assert stopped == [[False, False], [False, False]]


class StartingAt(DataLoader[int]):
    def __init__(self, first: list[int]) -> None:
        super().__init__(WorkerIds(), batch_size=None, num_workers=2, persistent_workers=True)
        self.first = first

    def _get_iterator(self) -> Any:
        return internals.MultiProcessIterStartingAt(self, lambda: self.first[0])


def test_the_round_of_requests_starts_at_the_worker_asked_each_epoch() -> None:
    first = [1]
    loader = StartingAt(first)
    assert [int(item) for item in loader] == [1, 0, 1, 0, 1, 0, 1, 0]
    first[0] = 0
    assert [int(item) for item in loader] == [0, 1, 0, 1, 0, 1, 0, 1]  # torch's _reset, persistent workers


class WrappingFetcher(DataLoader[int]):
    def _get_iterator(self) -> Any:
        return internals.SingleProcessIterWith(self, Tagged)


class Tagged:
    """A fetcher wrapping torch's: each batch comes with the indices it was made of."""

    def __init__(self, inner: Any, dataset: Any) -> None:
        self.inner = inner
        self.dataset = dataset

    def fetch(self, index: Any) -> Any:
        return index, self.inner.fetch(index)


def test_the_single_process_iterator_takes_a_wrapped_fetcher() -> None:
    loader = WrappingFetcher(Numbers(), batch_size=3, collate_fn=default_collate)
    iterator = iter(loader)
    fetcher = internals.fetcher_of(iterator)
    assert isinstance(fetcher, Tagged) and fetcher.dataset is loader.dataset
    assert [(indices, batch.tolist()) for indices, batch in iterator] == [
        ([0, 1, 2], [0, 1, 2]),
        ([3, 4, 5], [3, 4, 5]),
        ([6, 7], [6, 7]),
    ]
    with pytest.raises(ValueError, match="timeout=0 and num_workers=0"):
        internals.SingleProcessIterWith(DataLoader(Numbers(), timeout=1), Tagged)


class FromWorker(Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> dict[str, Any]:
        info = get_worker_info()
        return {"seed": info.seed if info is not None else None}


def _tagging(original: Any) -> Any:
    def create_fetcher(kind: Any, dataset: Any, auto_collation: bool, collate_fn: Any, drop_last: bool) -> Any:
        return Tagged(original(kind, dataset, auto_collation, collate_fn, drop_last), dataset)

    return create_fetcher


def _worker_init(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    seeded = np.random.get_state(legacy=True)[1]  # what torch's worker loop seeded numpy with
    np.random.seed(internals.numpy_seed(info.seed - worker_id, worker_id))
    if not np.array_equal(np.random.get_state(legacy=True)[1], seeded):
        raise RuntimeError("numpy_seed is not how torch's worker loop seeds numpy")
    internals.set_worker_seed(1234)
    internals.install_fetcher_factory(_tagging(internals.torch_fetcher_factory()))


def test_the_worker_internals() -> None:
    loader = DataLoader(FromWorker(), batch_size=None, num_workers=1, worker_init_fn=_worker_init)
    assert list(loader) == [(0, {"seed": 1234}), (1, {"seed": 1234})]  # the installed factory made the fetcher
    factory = internals.torch_fetcher_factory()
    parameters = ["kind", "dataset", "auto_collation", "collate_fn", "drop_last"]
    assert list(inspect.signature(factory).parameters) == parameters
    with pytest.raises(RuntimeError, match="worker processes only"):
        internals.set_worker_seed(1)


class Pinnable:
    def __init__(self) -> None:
        self.pinned = False

    def pin_memory(self) -> Pinnable:
        self.pinned = True
        return self


def test_the_tensor_and_profiler_internals() -> None:
    item = Pinnable()
    pinned = internals.pin_memory({"batch": [item, 3], "name": "x"})
    assert pinned == {"batch": [item, 3], "name": "x"} and item.pinned  # objects with pin_memory are asked
    storage = internals.shared_storage(64)
    assert storage.is_shared() and storage.nbytes() == 64
    tensor = torch.zeros(8)
    ref = internals.storage_ref(tensor)
    view = tensor[2:]
    tensor.share_memory_()  # the storage's data moves; the storage stays
    assert view.is_shared() and not internals.storage_gone(ref)
    del tensor, view
    assert internals.storage_gone(ref)
    internals.drop_storage_ref(ref)
    assert not internals.profiler_enabled()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert internals.profiler_enabled()
    assert not internals.profiler_enabled()
    samples = [(torch.tensor([1, 2]), 3), (torch.tensor([4, 5]), 6)]
    expected = default_collate(samples)
    collated = internals.collate_with(samples, collate_fn_map=internals.default_collate_fn_map)
    assert torch.equal(collated[0], expected[0]) and torch.equal(collated[1], expected[1])
    assert torch.Tensor in internals.default_collate_fn_map


class Recorded:
    """A recovery that keeps the WorkerSet it is given and lets torch's own wait run (``get`` is not called
    while ``active`` is False); each batch of indices passes through ``filtered``."""

    made: list[Recorded] = []

    def __init__(self, workers: internals.WorkerSet) -> None:
        self.workers = workers
        self.filtered_indices: list[Any] = []
        Recorded.made.append(self)

    def get(self, timeout: float) -> tuple[bool, Any]:
        try:
            return True, self.workers.receive(timeout)
        except Exception:  # noqa: BLE001 - torch's contract: (False, None) on a timeout
            return False, None

    def filtered(self, index: Any) -> Any:
        self.filtered_indices.append(list(index))
        return index


class Results:
    """A result queue's stand-in: what the worker's ``put`` gets goes into a real pipe, read by ``get``."""

    def __init__(self) -> None:
        self.reader, self.writer = multiprocessing.Pipe(duplex=False)
        self.woken: list[Any] = []
        self.closed = False

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        if torch.utils.data.get_worker_info() is None:
            self.woken.append(obj)  # torch, in the loader's process
        else:
            self.writer.send(("piped", obj))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not self.reader.poll(timeout):
            raise queue.Empty
        tag, obj = self.reader.recv()
        assert tag == "piped"
        return obj

    def qsize(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


class PipedResults(DataLoader[int]):
    """torch's loader whose worker hands its results to ``Results.put`` (send_results_with, in worker_init_fn),
    read by the iterator through ``Results.get`` (read_results_from)."""

    def __init__(self, results: Results) -> None:
        self.results = results
        super().__init__(Numbers(), batch_size=2, num_workers=1, persistent_workers=True, worker_init_fn=self.start)

    def start(self, worker_id: int) -> None:
        internals.send_results_with(self.results.put)

    def _get_iterator(self) -> Any:
        def recovery(workers: internals.WorkerSet) -> Recorded:
            workers.read_results_from(self.results)
            return Recorded(workers)

        return internals.MultiProcessIterStartingAt(self, lambda: 0, recovery=recovery)


def test_a_worker_loop_hands_its_results_to_the_put_it_is_given_and_the_iterator_reads_them_where_it_is_told() -> None:
    """What fastloader.loader.result_pipes relies on: torch's worker loop calls its result queue's ``put`` (the
    local ``data_queue``) for each result and for its answer to torch's reset; the iterator reads the results
    through its result queue's ``get``, puts into it to wake the pin-memory thread and closes it at shutdown."""
    results = Results()
    loader = PipedResults(results)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # the reset answered so too
    iterator = internals.persistent_iterator(loader)
    assert internals.batches_in_workers(iterator) == 0  # the stand-in's qsize
    internals.drop_persistent_iterator(loader)
    assert not results.woken  # no pin-memory thread to wake


class WithRecovery(DataLoader[int]):
    def __init__(self) -> None:
        super().__init__(Numbers(), batch_size=2, num_workers=1, persistent_workers=True)

    def _get_iterator(self) -> Any:
        return internals.MultiProcessIterStartingAt(self, lambda: 0, recovery=Recorded)


def test_a_dead_worker_can_be_replaced_through_the_worker_set() -> None:
    """What fastloader.loader.worker_restart uses: torch's SIGCHLD handler no longer watches the workers (a
    SIGKILL raises nothing here), a worker started in place of the dead one answers tasks put into a new
    queue, torch's reset message comes back tagged, and each batch of indices passes through the recovery
    before it is sent."""
    Recorded.made.clear()
    loader = WithRecovery()
    iterator = iter(loader)
    assert next(iterator).tolist() == [0, 1]
    [recorded] = Recorded.made
    workers = recorded.workers
    assert recorded.filtered_indices[:2] == [[0, 1], [2, 3]]
    assert not iterator._worker_pids_set  # torch's SIGCHLD handler would end the run for a dead worker
    [process] = workers.processes
    # Its two results written and read: killed idle (torch's feeder thread, killed mid-write, would keep the
    # result queue's lock, and no worker could write any more: what fastloader.loader.result_pipes is for).
    assert sorted(workers.receive(_DEADLINE_S)[0] for _ in range(2)) == [1, 2]
    process.kill()
    process.join(_DEADLINE_S)  # the SIGCHLD handler ran before join returned (it raises nothing now)
    assert not process.is_alive() and process.exitcode == -9
    worker_loop = torch.utils.data._utils.worker._worker_loop
    assert inspect.signature(worker_loop).parameters.keys() >= {"init_fn", "data_queue"}  # the result queue
    assert workers.outstanding(1) and not workers.outstanding(0)
    new = workers.new_queue()
    workers.set_index_queue(0, new)
    replacement = workers.start(0, new, workers.init_fn)
    assert workers.processes == [replacement] and replacement.is_alive()
    workers.guard_results(lambda error: "unreadable")  # a dead worker's batch: its tensors went with it
    new.put((1, [6, 7]))  # the lost task, sent again (other samples, to tell it apart)
    task, data = workers.receive(_DEADLINE_S)
    assert task == 1 and data.tolist() == [6, 7]
    tagged = internals.TaggedResume(7, worker=0)
    assert internals.resume_message(tagged) and not internals.resume_message((0, [1]))
    new.put(tagged)
    answer, _ = workers.receive(_DEADLINE_S)
    assert answer == tagged and answer.worker == 0
    internals.drop_persistent_iterator(loader)
    assert workers.shut_down
