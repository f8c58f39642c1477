"""The training process's book of batch leases, for workers it cannot trust to live (``worker_method="ray"``).

The training process owns the order. It draws each batch of indices from the epoch's index stream (the resume
cursor's, ``fastloader.loader.epoch_progress``), hands it out as a :class:`Lease` (the epoch, the batch's place
in the order, its indices), and delivers the results in the order the batches were drawn, as torch's loader
does with ``in_order=True``. The rules, each one a method:

* **bounded**: at most ``in_flight`` leases are out or done-but-not-delivered at once (:meth:`take` returns
  None past it), so a slow batch at the head of the order cannot make the others pile up without end;
* **re-issued**: a lease whose worker died (:meth:`lost`) goes back to the front of the queue, ahead of any
  new batch, and :meth:`take` hands it out again under a new ticket;
* **once**: a result is accepted only for a lease's live ticket (:meth:`done`): a late result of a ticket
  that was re-issued, or of a lease already done, is dropped and counted (``dropped``);
* **consumed when delivered**: :meth:`deliver` hands out the next batch in order; only then does the
  training loop (and the resume cursor, which counts what the loop received) see it. Leases out or done
  ahead of the loop are not consumed: a state saved now resumes before them.

A lease that killed ``max_deaths`` workers is the batch's fault, not the workers': :meth:`lost` raises
:class:`~fastloader.errors.BatchKillsWorkers` naming it. Pure Python: no Ray, no threads (one thread drives it).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

from fastloader.errors import BatchKillsWorkers


@dataclasses.dataclass(frozen=True)
class Lease:
    """One batch to make: its epoch, its place ``number`` in the epoch's order, and its indices."""

    epoch: int
    number: int | None  # the batch's place in the order (None: unknown, an IterableDataset's)
    indices: Any
    seq: int  # its place among the batches drawn in this iteration: the delivery order


class LeaseBook:
    """One iteration's leases (see the module docstring). ``batches`` yields ``(number, indices)``."""

    def __init__(
        self, epoch: int, batches: Iterator[tuple[int | None, Any]], in_flight: int, max_deaths: int = 2
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self.epoch = epoch
        self._batches = batches
        self.in_flight = in_flight
        self.max_deaths = max_deaths
        self._drawn = 0  # batches drawn from the stream
        self._exhausted = False
        self._retry: collections.deque[Lease] = collections.deque()  # lost leases, by seq
        self._out: dict[int, Lease] = {}  # live ticket -> lease
        self._done: dict[int, tuple[Lease, Any]] = {}  # seq -> the lease and its result, waiting for its turn
        self._next = 0  # the seq delivered next
        self._tickets = 0
        self.deaths: collections.Counter[int] = collections.Counter()  # seq -> workers it was out on when they died
        self.dropped = 0  # late or duplicate results dropped
        self.reissued = 0

    # --- handing out -----------------------------------------------------------------------------------

    def held(self) -> int:
        """Leases drawn and not delivered yet (out, queued again, or done ahead of the loop)."""
        return self._drawn - self._next

    def take(self) -> tuple[int, Lease] | None:
        """The next lease to hand out and its ticket: a lost one first, else a new batch; None when the
        bound is reached or there is nothing left to hand out."""
        if self._retry:
            lease = self._retry.popleft()
            self.reissued += 1
        else:
            if self._exhausted or self.held() >= self.in_flight:
                return None
            try:
                number, indices = next(self._batches)
            except StopIteration:
                self._exhausted = True
                return None
            lease = Lease(self.epoch, number, indices, self._drawn)
            self._drawn += 1
        self._tickets += 1
        self._out[self._tickets] = lease
        return self._tickets, lease

    def outstanding(self) -> int:
        """Tickets out now (handed to a worker, no result or loss recorded)."""
        return len(self._out)

    # --- results -------------------------------------------------------------------------------------

    def done(self, ticket: int, result: Any) -> bool:
        """A worker's result for ``ticket``: kept for delivery (True), or dropped as late or doubled (False)."""
        lease = self._out.pop(ticket, None)
        if lease is None or lease.seq < self._next or lease.seq in self._done:
            self.dropped += 1
            return False
        self._done[lease.seq] = (lease, result)
        return True

    def lost(self, ticket: int) -> Lease | None:
        """The worker holding ``ticket`` died: its lease goes out again (returned), unless a result of it
        is in already (None). BatchKillsWorkers once the lease was out on ``max_deaths`` dead workers."""
        lease = self._out.pop(ticket, None)
        if lease is None or lease.seq < self._next or lease.seq in self._done:
            return None
        self.deaths[lease.seq] += 1
        if self.deaths[lease.seq] >= self.max_deaths:
            raise BatchKillsWorkers(
                f"batch {lease.number} of epoch {lease.epoch} (sample indices {_short(lease.indices)}) was being made"
                f" by {self.deaths[lease.seq]} workers when each of them died: a sample of it kills its worker"
                " (a decoder crash, memory): find it with fastloader scan, or leave it out of the sampler"
            )
        # Back in the order of the batches: the head of the order is what the training loop waits for.
        position = sum(1 for queued in self._retry if queued.seq < lease.seq)
        self._retry.insert(position, lease)
        return lease

    def deliver(self) -> tuple[Lease, Any] | None:
        """The next batch in order and its result, when done; None while it is not."""
        done = self._done.pop(self._next, None)
        if done is not None:
            self._next += 1
        return done

    @property
    def finished(self) -> bool:
        """Every batch of the stream drawn and delivered."""
        return self._exhausted and not self._retry and self.held() == 0

    @property
    def delivered(self) -> int:
        return self._next


def _short(indices: Any, limit: int = 8) -> str:
    items = list(indices) if not isinstance(indices, (str, bytes)) else [indices]
    text = ", ".join(str(i) for i in items[:limit])
    return f"[{text}{', ...' if len(items) > limit else ''}]"
