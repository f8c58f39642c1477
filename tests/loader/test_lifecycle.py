"""DataLoaderX lifecycle with real worker processes: errors, early exits, leaks, killed workers, Ctrl-C."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from fastloader import DataLoaderX
from tests.helpers import child_processes, pid_alive, prefetch_threads, wait_until
from tests.toy_datasets import Failing, Pids, Slow, Squares

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def settled(before_threads: int, timeout: float = 5.0) -> bool:
    """No extra producer threads and no worker processes within ``timeout`` seconds."""
    gc.collect()
    return wait_until(lambda: prefetch_threads() <= before_threads and child_processes() == 0, timeout)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_exception_arrives_at_its_batch_and_everything_stops(num_workers: int) -> None:
    before = prefetch_threads()
    loader = DataLoaderX(Failing(40, bad=13), batch_size=4, num_workers=num_workers)
    got = []
    with pytest.raises(ValueError, match="bad sample 13"):
        for batch in loader:
            got.append(batch)
    assert torch.cat(got).tolist() == list(range(12))  # batches 0..2, then batch 3 (items 12..15) fails
    del got
    assert settled(before)


def outcomes(loader: DataLoader[Any]) -> list[Any]:
    """Every ``next()`` of one iteration: the batch, or the error it raised, until StopIteration."""
    iterator, seen = iter(loader), []
    while True:
        try:
            seen.append(torch.as_tensor(next(iterator)).tolist())
        except ValueError as error:
            seen.append(str(error).strip().splitlines()[-1])  # with workers, torch adds the worker's traceback
        except StopIteration:
            return seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_epoch_goes_on_after_a_failed_batch_as_with_torch(num_workers: int) -> None:
    """torch's iterator stays usable after a batch raises (torch's own test_error relies on it)."""
    expected = outcomes(DataLoader(Failing(40, bad=13), batch_size=4, num_workers=num_workers))
    assert expected[3].endswith("bad sample 13") and len(expected) == 10
    assert outcomes(DataLoaderX(Failing(40, bad=13), batch_size=4, num_workers=num_workers)) == expected


def broken_collate(items: list[Any]) -> Any:
    if 20 in items:
        raise RuntimeError("collate failed on a batch holding 20")
    return torch.tensor(items)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_exception_arrives_and_everything_stops(num_workers: int) -> None:
    before = prefetch_threads()
    loader = DataLoaderX(Failing(40, bad=-1), batch_size=5, num_workers=num_workers, collate_fn=broken_collate)
    seen = 0
    with pytest.raises(RuntimeError, match="collate failed"):
        for _ in loader:
            seen += 1
    assert seen == 4
    assert settled(before)


@pytest.mark.parametrize("persistent", [False, True])
def test_early_break_stops_thread_and_workers_within_5s(persistent: bool) -> None:
    before = prefetch_threads()
    loader = DataLoaderX(Slow(delay=0.02), batch_size=4, num_workers=2, persistent_workers=persistent)
    for epoch in range(3):
        for i, _ in enumerate(loader):
            if i == 2:
                break
        if not persistent:
            assert settled(before), f"epoch {epoch}: workers or thread still alive 5 s after break"
    # persistent workers stay for the loader's lifetime, and go with it
    assert wait_until(lambda: prefetch_threads() <= before, 5.0)
    del loader
    assert settled(before)


def test_persistent_workers_survive_partial_epochs_with_correct_data() -> None:
    loader = DataLoaderX(Squares(), batch_size=5, num_workers=2, persistent_workers=True)
    for _ in zip(range(3), loader):
        pass
    full = [labels.tolist() for _, labels in loader]
    assert sum(full, []) == list(range(50))


def test_a_thousand_abandoned_iterators_leave_no_thread() -> None:
    before = prefetch_threads()
    loader = DataLoaderX(Squares(), batch_size=2)
    for _ in range(1000):
        iterator = iter(loader)
        next(iterator)
    del iterator
    assert settled(before, timeout=10.0)


def test_abandoned_iterators_with_workers_leave_no_process() -> None:
    before = prefetch_threads()
    loader = DataLoaderX(Slow(delay=0.01), batch_size=2, num_workers=2)
    for _ in range(20):
        iterator = iter(loader)
        next(iterator)
    del iterator
    assert settled(before, timeout=10.0)


def test_killed_worker_gives_torchs_error_not_a_hang() -> None:
    before = prefetch_threads()
    loader = DataLoaderX(Pids(), batch_size=2, num_workers=2)
    iterator = iter(loader)
    victim = int(next(iterator)[0])
    assert victim != os.getpid()
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(?s?\)? .*\) .*(killed|exited)"):
        for _ in iterator:
            pass
    assert time.monotonic() - start < 30.0  # torch checks worker health every 5 s: an error, not a hang
    del iterator
    # the producer thread may be inside torch's 5 s wait for the dead worker's batch when the loop leaves
    assert settled(before, timeout=8.0)


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from fastloader import DataLoaderX
    from tests.toy_datasets import Slow
    loader = DataLoaderX(Slow(delay=0.05), batch_size=2, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    print(" ".join(str(w.pid) for w in iterator._source._workers), flush=True)
    for _ in iterator:
        time.sleep(0.01)
    """
)


def _sigint_as_in_a_terminal() -> None:
    """Run in the child before exec: SIGINT back to its default disposition.

    A process started in the background by a non-interactive shell (``make test &``, many CI runners)
    inherits SIGINT *ignored*, and Python installs its KeyboardInterrupt handler only when SIGINT is at
    its default: the child would then ignore Ctrl-C, as it should under ``nohup``. A user at a
    terminal has the default; so does this child, whatever launched pytest.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_keyboard_interrupt_stops_everything_within_5s() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT.format(root=ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )
    try:
        assert child.stdout is not None
        worker_pids = [int(pid) for pid in child.stdout.readline().split()]
        assert len(worker_pids) == 2
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        start = time.monotonic()
        _, stderr = child.communicate(timeout=60)
        assert time.monotonic() - start < 15.0  # at the signal: the rest of the run would take 25 s
        assert "KeyboardInterrupt" in stderr
        assert wait_until(lambda: not any(pid_alive(pid) for pid in worker_pids), 5.0)
    finally:
        child.kill()


class StallsAt(Slow):
    """Item ``stall`` never comes back (a hung network filesystem)."""

    def __init__(self, stall: int) -> None:
        super().__init__(n=20, delay=0.0)
        self.stall = stall

    def __getitem__(self, i: int) -> int:
        if i == self.stall:
            time.sleep(60)
        return i


def test_a_stalled_worker_with_timeout_is_an_error_within_timeout_plus_1s() -> None:
    before = prefetch_threads()
    loader = DataLoaderX(StallsAt(5), batch_size=1, num_workers=1, timeout=2)
    seen, last = [], time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 2 seconds"):
        for batch in loader:
            seen.append(int(batch))
            last = time.monotonic()
    # after the last item: torch's timeout, not the 60 s stall (the bound leaves a loaded machine room)
    assert 2 <= time.monotonic() - last < 2 + 20
    assert seen == [0, 1, 2, 3, 4]
    assert settled(before, timeout=8.0)  # torch gives a stuck worker 5 s to exit before terminating it
