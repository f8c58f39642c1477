"""A worker killed by a signal costs one batch, not the run: dead workers restarted under on_error="skip"/"replace".

C code decodes untrusted bytes in every worker, and the kernel's OOM killer picks processes: a worker can die
by a signal (SIGKILL, SIGSEGV, ...). torch's loader then ends the run. Under a dataset whose error policy
(``dataset.error_policy``, ``fastloader.datasets.error_policy``) is ``"skip"`` or ``"replace"``, a DataLoaderX
over a map-style dataset with batches of indices restarts the worker instead (:class:`WorkerRestarts`, which
takes over torch's wait for results, ``fastloader.torch_internals.MultiProcessIterStartingAt``). Under
``"raise"`` (the default), with an IterableDataset or with ``batch_size=None`` nothing here runs: torch's error.

The protocol, all of it in the loader's process (the workers only mark what they fetch):

1. *Who was making what.* Each worker writes the place of the batch it is fetching into shared memory right
   before the fetch and clears it right after (``worker_state.FetchMarks``). Every index queue is wrapped
   (:class:`_HeldQueue`) to keep each task torch sends (torch keeps only its worker), until its result
   arrives. torch's SIGCHLD handler, which would end the run in the main thread, no longer watches these
   workers. Each worker writes its results, in the thread that made them, into a pipe of its own
   (``fastloader.loader.result_pipes``, in place of torch's one queue under a lock every worker shares): a worker
   killed while it writes (the OOM killer's usual victim, blocked there whenever training is slower than
   loading) holds up no other worker, and a result is handed on only once its whole message is read.
2. *Death.* Each wait for a result looks at every worker (``is_alive``: ``waitpid``, no timing involved) and
   polls the results at most :data:`_POLL_S` at a time (a message half written never blocks the wait). A dead
   worker's mark names the batch that killed it (its kill count goes up), or nothing (it died between batches,
   or writing a result: more than :data:`_UNEXPLAINED` in an epoch and the run ends as torch's would). Its index
   queue is now *held*: what torch sends it waits in the loader.
3. *Drain.* A marker is queued behind the dead worker's pipe: once it is dead nothing more comes into the
   pipe, so every whole result it wrote comes out ahead of the marker (the pin-memory thread passes them on in
   order), and a result it did not finish writing is dropped with the pipe, as never received. When the marker
   comes out, each task sent to the dead worker is either received or lost, never both: a lost task is sent
   again and no result is ever doubled (nor a batch ring slot written twice).
   A task torch sent after the death is neither: it was held, never seen by the dead worker, and goes to the
   new worker once, with the rest of what was held.
4. *Restart.* A new index queue (the dead worker may have died holding the old one's lock), the lost tasks
   first in their order, then what was held; a new result pipe; a new process with the same worker id, base seed and
   ``worker_init_fn``, restoring the state of the last batch the dead worker sent (its random generators, a
   Stateful dataset's state): a batch made again draws what the dead worker would have drawn. A worker that
   died during torch's epoch reset gets that reset again if it had not answered it.
5. *Hunt.* A batch that killed a worker twice is not sent again: its samples go out in halves as *probes*
   (negative task numbers torch never uses; their results are dropped here). A probe that completes clears its
   samples, a probe that kills is halved again, and a single sample that kills is quarantined: the policy's
   ``record`` (a warning naming it, a ``WorkerKilled`` line in the quarantine file, the ``max_errors`` budget).
   The batch then goes out once more without it (skip; the batch one shorter, or a substitute where nothing
   would be left) or with the policy's substitute in its place (replace: the batch size kept), under the
   same task number, place and batch ring slot. A hunt that finds no single sample (the samples kill only
   together, or the deaths came from elsewhere) sends the batch whole once more; a second such hunt ends the
   run, naming the batch.
6. *Later batches.* A quarantined sample never goes to a worker again: each batch of indices is rebuilt
   before it is sent (:meth:`WorkerRestarts.filtered`); samples a quarantine file names as ``WorkerKilled``
   are known from the start, in a resumed run too, by key (``known_killers``: never by position alone).

Every other sample is delivered exactly once, in torch's order. A new epoch's reset (persistent workers)
forgets the books of the last one, as torch does. ``timeout=`` raises torch's error when no whole result comes in
time. Not covered: a worker killed while it holds another lock its peers share (torch's done event, taken at
shutdown), or its index queue's lock, mid-read, can leave the loader waiting (the stall watchdog reports it).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import operator
import queue
import signal
import time
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterableDataset, MapDataPipe

from fastloader.errors import TooManyBadSamples
from fastloader.loader.known_killers import KnownKillers
from fastloader.loader.result_pipes import ResultReader, result_pipe
from fastloader.loader.stage_clock import StampedIndices, stamped
from fastloader.loader.worker_state import IDLE, Delivery, FetchMarks, WorkerStart, WorkerState
from fastloader.read_digests import SKIPPED
from fastloader.torch_internals import TaggedResume, WorkerSet, resume_message

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from fastloader.datasets.error_policy import ErrorPolicy
    from fastloader.loader.dataloader import DataLoaderX

log = logging.getLogger("fastloader")

REASON = "WorkerKilled"  # the quarantine's reason for a sample that killed its worker
_POLL_S = 0.05  # the longest a wait for a result goes without looking at the workers
_KILLS = 2  # a batch that killed a worker this many times is searched for its sample
_UNEXPLAINED = 3  # deaths outside any batch tolerated per epoch (an OOM kill of an idle worker now and then)
_CLEAN_HUNTS = 1  # hunts of one batch that found no single sample, tolerated
_DYING_S = 10.0  # how long an unreadable result waits for its worker's death to show before it is an error


def restart_policy(loader: DataLoaderX[Any]) -> ErrorPolicy | None:
    """The dataset's error policy when this loader restarts dead workers, else None (torch's behaviour)."""
    if int(loader.num_workers) <= 0 or loader.batch_sampler is None:
        return None
    dataset = loader.dataset
    if isinstance(dataset, (IterableDataset, MapDataPipe)):  # torch wraps a DataPipe's worker_init_fn
        return None
    policy = getattr(dataset, "error_policy", None)
    return policy if getattr(policy, "mode", None) in ("skip", "replace") else None


@dataclasses.dataclass
class _Sent:
    worker: int
    index: Any  # the batch of indices (a StampedIndices)


@dataclasses.dataclass(frozen=True)
class _Drained:
    """The marker put behind a dead worker's results."""

    token: int


@dataclasses.dataclass(frozen=True)
class _Unreadable:
    """A result that could not be unpickled (its worker died before handing out its tensors)."""

    error: BaseException


@dataclasses.dataclass
class _Death:
    worker: int
    pid: int | None
    how: str  # "SIGKILL", "exit code 3", ...
    making: int  # the mark: a batch's place, a probe's number, or IDLE


@dataclasses.dataclass
class _Hunt:
    task: int  # torch's task number
    index: Any  # the batch as torch's sampler made it
    pending: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # probe number -> its samples
    bad: list[int] = dataclasses.field(default_factory=list)
    clean: int = 0  # hunts that found no single sample


class _HeldQueue:
    """A worker's index queue as torch sees it: keeps each task torch sends (torch keeps only the worker it
    went to), tags torch's reset message with the worker, and while the worker is replaced holds what is sent."""

    def __init__(self, restarts: WorkerRestarts, worker: int, inner: Any) -> None:
        self.restarts, self.worker, self.inner = restarts, worker, inner
        self.held: list[Any] | None = None
        self.unanswered: Any = None  # the reset message sent and not answered yet

    def put(self, item: Any) -> None:
        if resume_message(item):
            if not isinstance(item, TaggedResume):
                item = TaggedResume(item.seed, self.worker)
                self.restarts.epoch_reset()
            self.unanswered = item
        elif _is_task(item):
            self.restarts.sent_task(self.worker, item[0], item[1])
        if self.held is not None:
            self.held.append(item)
        else:
            self.inner.put(item)

    def hold(self) -> None:
        self.held = []

    def held_tasks(self) -> set[int]:
        """The task numbers sent since the worker died: in the books, but never seen by the dead worker."""
        return {item[0] for item in self.held or [] if _is_task(item)}

    def release(self, new: Any, first: list[Any]) -> None:
        held, self.held, self.inner = self.held or [], None, new
        if self.unanswered is not None and not any(resume_message(item) for item in held):
            first.insert(0, self.unanswered)  # the dead worker had not answered torch's reset
        for item in first:
            self.put(item)
        for item in held:
            new.put(item)

    def cancel_join_thread(self) -> None:
        self.inner.cancel_join_thread()

    def close(self) -> None:
        self.inner.close()


class WorkerRestarts:
    """One torch iterator's restarts of its dead workers (the protocol in the module's docstring)."""

    def __init__(
        self, workers: WorkerSet, policy: ErrorPolicy, dataset: Any, marks: FetchMarks, readers: list[Connection]
    ) -> None:
        self.workers, self.policy, self.marks = workers, policy, marks
        self.dataset = dataset
        self.sent: dict[int, _Sent] = {}  # torch's task number -> what went out, until its result arrives
        self.places: dict[int, int] = {}  # a batch's place (or a probe's number) -> torch's task number
        self.kills: collections.Counter[int] = collections.Counter()  # task number -> workers it killed
        self.hunts: dict[int, _Hunt] = {}  # task number -> the search for its sample
        self.probes: dict[int, tuple[int, int]] = {}  # probe number -> (task number, worker)
        self.deaths: dict[int, _Death] = {}  # marker token -> the death it drains
        self.states: dict[int, WorkerState] = {}  # worker -> its state after its last batch received
        killed = [s for s in policy.by_position() if s.reason.startswith(REASON)]
        self.killers = KnownKillers(killed, functools.partial(_key, dataset), policy)  # by key, never position alone
        self.unexplained = 0
        self._tokens = itertools.count()
        self._probe_numbers = itertools.count(-2, -1)
        self.queues = [_HeldQueue(self, w, workers.index_queue(w)) for w in range(len(workers.processes))]
        for worker, held in enumerate(self.queues):
            workers.set_index_queue(worker, held)
        self.results = ResultReader(readers)
        workers.read_results_from(self.results)
        workers.guard_results(_Unreadable)
        for writer in (_start_of(workers).results or {}).values():
            writer.close()  # the workers have theirs: this process only reads

    # --- what torch's iterator calls -------------------------------------------------------------------

    def get(self, timeout: float) -> tuple[bool, Any]:
        """torch's ``_try_get_data``: the next result for torch, or ``(False, None)`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            self._look_at_workers()
            left = deadline - time.monotonic()
            if left <= 0:
                return False, None
            try:
                item = self.workers.receive(min(left, _POLL_S))
            except queue.Empty:
                continue
            kept = self._take(item)
            if kept is not None:
                return True, kept

    def filtered(self, index: Any) -> Any:
        """A batch of indices about to be sent, without the samples known to kill workers."""
        if self.killers and isinstance(index, list) and any(_known(i, self.killers) for i in index):
            return self._rebuilt(index, self.killers)
        return index

    # --- the books ---------------------------------------------------------------------------------------

    def sent_task(self, worker: int, task: int, index: Any) -> None:
        self.sent[task] = _Sent(worker, index)
        place = getattr(index, "task", None)
        if place is not None:
            self.places[place] = task

    def epoch_reset(self) -> None:
        """torch resets its iterator for a new epoch (persistent workers): it forgets the last one's tasks."""
        self.sent.clear()
        self.places.clear()
        self.kills.clear()
        self.hunts.clear()
        self.probes.clear()
        self.unexplained = 0  # per epoch: persistent workers live for the whole run, and so would the count

    def _take(self, item: Any) -> Any:
        task, data = item
        if isinstance(task, _Drained):
            self._drained(self.deaths.pop(task.token))
            return None
        if isinstance(task, _Unreadable):
            self._unreadable(task.error)
            return None
        if isinstance(task, TaggedResume):
            self.queues[task.worker].unanswered = None
            return item
        if isinstance(task, int) and task < 0:
            self._probe_done(task)
            return None
        if isinstance(task, int):
            sent = self.sent.pop(task, None)
            if sent is not None:
                self.places.pop(getattr(sent.index, "task", None), None)  # type: ignore[arg-type]
            self.kills.pop(task, None)
            self.hunts.pop(task, None)
            state = getattr(data, "state", None)
            if isinstance(state, Delivery) and not state.end:
                self.states[state.worker] = state.worker_state()
        return item

    # --- a death, its drain, the restart ------------------------------------------------------------------

    def _look_at_workers(self) -> None:
        if self.workers.shut_down:
            return
        draining = {death.worker for death in self.deaths.values()}
        for worker, process in enumerate(self.workers.processes):
            if worker not in draining and not process.is_alive():
                self._died(worker, process)

    def _unreadable(self, error: BaseException) -> None:
        """A result that could not be read is dropped when its worker is dead: its task is still outstanding,
        the drain sends it again. Its worker may still be dying (it closed its sockets first)."""
        deadline = time.monotonic() + _DYING_S
        while not self.deaths and not self.workers.shut_down:
            self._look_at_workers()
            if self.deaths or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        if not self.deaths:
            raise RuntimeError("a DataLoader worker's batch could not be read, and no worker died") from error
        log.debug("a batch of a dead worker could not be read (%s): its task is sent again", error)

    def _died(self, worker: int, process: Any) -> None:
        code = process.exitcode
        how = signal.Signals(-code).name if code is not None and code < 0 else f"exit code {code}"
        making = self.marks.read(worker)
        self.marks.mark(worker, IDLE)
        task = self.places.get(making) if making >= 0 else None
        what = "between batches"
        if task is not None:
            self.kills[task] += 1
            sent = self.sent.get(task)
            what = f"while making batch {making}" + (f" ({_samples(sent.index)})" if sent is not None else "")
        elif making in self.probes:
            what = f"while trying {_samples(self.hunts[self.probes[making][0]].pending[making])}"
        elif making == IDLE:
            self.unexplained += 1
            if self.unexplained > _UNEXPLAINED:
                raise RuntimeError(
                    f"DataLoader worker {worker} (pid {process.pid}) died ({how}) outside any batch; "
                    f"{self.unexplained} deaths like it: not restarted again"
                )
        log.warning("DataLoader worker %d (pid %s) died (%s) %s: restarting it", worker, process.pid, how, what)
        self.queues[worker].hold()
        token = next(self._tokens)
        self.deaths[token] = _Death(worker, process.pid, how, making)
        self.results.drain(worker, (_Drained(token), None))

    def _drained(self, death: _Death) -> None:
        """Every result the dead worker wrote has been received: send the rest again, to a new worker."""
        if self.workers.shut_down:
            return
        worker = death.worker
        lost_probes = [n for n, (_task, sent_to) in self.probes.items() if sent_to == worker and n != death.making]
        first = self._probe_killed(death) if death.making in self.probes else []
        for number in lost_probes:  # sent to the dead worker, not the one that killed it: tried again
            first.append((number, stamped(self.hunts[self.probes[number][0]].pending[number], number)))
        # A task torch sent after the death is held, not lost: it goes to the new worker once, with what was held.
        waiting = self.queues[worker].held_tasks()
        lost = sorted(
            t
            for t, sent in self.sent.items()
            if sent.worker == worker and t not in waiting and self.workers.outstanding(t)
        )
        for task in lost:
            sent = self.sent.pop(task)
            if self.kills[task] >= _KILLS:
                first.extend(self._hunt(task, sent.index, worker))
            else:
                first.append((task, sent.index))
        held = self.queues[worker]
        old = held.inner
        new = self.workers.new_queue()
        held.release(new, first)
        old.cancel_join_thread()
        old.close()
        reader, writer = result_pipe()
        self.results.replace(worker, reader)
        init = _start_of(self.workers).restarted(worker, self.states.get(worker), writer)
        process = self.workers.start(worker, new, init)
        writer.close()  # the new worker has it
        log.info("DataLoader worker %d restarted (pid %s, was %s)", worker, process.pid, death.pid)

    # --- the hunt for the sample -------------------------------------------------------------------------

    def _hunt(self, task: int, index: Any, worker: int) -> list[Any]:
        hunt = self.hunts.setdefault(task, _Hunt(task, index))
        hunt.pending, hunt.bad = {}, []
        log.warning(
            "batch %s (%s) killed a DataLoader worker %d times: trying its samples in halves to find the one",
            getattr(index, "task", task),
            _samples(index),
            self.kills[task],
        )
        return [self._probe(hunt, half, worker) for half in _halves(list(index))]

    def _probe(self, hunt: _Hunt, samples: list[int], worker: int) -> tuple[int, Any]:
        number = next(self._probe_numbers)
        hunt.pending[number] = samples
        self.probes[number] = (hunt.task, worker)
        return number, stamped(samples, number)

    def _probe_done(self, number: int) -> None:
        found = self.probes.pop(number, None)
        if found is None:
            return  # from an epoch since reset
        task, worker = found
        hunt = self.hunts[task]
        del hunt.pending[number]
        if not hunt.pending:
            self.queues[worker].put(self._hunt_over(hunt))

    def _probe_killed(self, death: _Death) -> list[Any]:
        task, _worker = self.probes.pop(death.making)
        hunt = self.hunts[task]
        samples = hunt.pending.pop(death.making)
        out: list[Any] = []
        if len(samples) == 1:
            self._quarantine(samples[0], death)
            hunt.bad.append(samples[0])
        else:
            out = [self._probe(hunt, half, death.worker) for half in _halves(samples)]
        if not hunt.pending:
            out.append(self._hunt_over(hunt))
        return out

    def _hunt_over(self, hunt: _Hunt) -> tuple[int, Any]:
        """The hunted batch, to send again: without its killers, or whole when none was found alone."""
        self.kills[hunt.task] = 0
        if hunt.bad:
            return hunt.task, self._rebuilt(hunt.index, set(hunt.bad))
        hunt.clean += 1
        if hunt.clean > _CLEAN_HUNTS:
            raise RuntimeError(
                f"batch {getattr(hunt.index, 'task', hunt.task)} ({_samples(hunt.index)}) keeps killing DataLoader "
                "workers, but none of its samples does alone: cannot tell which to leave out"
            )
        log.warning("no single sample of %s kills a worker: the batch is sent whole again", _samples(hunt.index))
        return hunt.task, hunt.index

    def _quarantine(self, sample: Any, death: _Death) -> None:
        reason = f"{REASON}: its worker died ({death.how}) each time it was read, alone too"
        sample = operator.index(sample)  # the sampler may yield numpy integers: the books hold ints
        self.killers[sample] = reason
        self.policy.record(sample, _key(self.dataset, sample), reason)

    def _rebuilt(self, index: Any, bad: Any) -> Any:
        """``index`` without the samples in ``bad`` (skip; a substitute where none would be left) or with the
        policy's substitute in their place (replace), with its place and batch ring slot."""
        samples = list(index)
        kept = [i for i in samples if not _known(i, bad)] if self.policy.mode == "skip" else []
        out = kept or [self._substitute(i) if _known(i, bad) else i for i in samples]
        if isinstance(index, StampedIndices):
            # What the worker's fetch reports to the delivery ledger: each sample left out, or its substitute.
            if kept:
                outcomes = tuple((operator.index(i), SKIPPED) for i in samples if _known(i, bad))
            else:
                outcomes = tuple((operator.index(i), operator.index(o)) for i, o in zip(samples, out) if _known(i, bad))
            return stamped(out, index.task, index.slot, index.digests, index.rebuild, outcomes, seeds=index.seeds)
        return out

    def _substitute(self, sample: int) -> int:
        for candidate in self.policy.substitutes(sample, functools.partial(_key, self.dataset)):
            if candidate not in self.killers:
                return candidate
        raise TooManyBadSamples(f"sample {sample} and the samples after it all kill DataLoader workers")


def _start_of(workers: WorkerSet) -> WorkerStart:
    init = workers.init_fn
    if not isinstance(init, WorkerStart):  # a MapDataPipe's is wrapped by torch: restart_policy leaves those out
        raise RuntimeError(f"the workers of a DataLoaderX that restarts them start with WorkerStart, not {init!r}")
    return init


def _is_task(item: Any) -> bool:
    """torch's ``(task number, indices)`` for a worker (not a probe, a reset or the end)."""
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], int) and item[0] >= 0


def _known(sample: Any, bad: Any) -> bool:
    """Whether ``sample`` is one of ``bad``: any integer index (a numpy or torch integer too) counts."""
    return _position(sample) in bad


def _position(sample: Any) -> int | None:
    try:
        return operator.index(sample)
    except TypeError:
        return None


def _halves(samples: list[int]) -> list[list[int]]:
    middle = (len(samples) + 1) // 2
    return [half for half in (samples[:middle], samples[middle:]) if half]


def _samples(index: Any) -> str:
    samples = list(index)
    shown = ", ".join(str(i) for i in samples[:8])
    return f"samples {shown}" + (f", ... ({len(samples)})" if len(samples) > 8 else "")


def _key(dataset: Any, sample: int) -> str:
    """The sample's key for the quarantine (its file or record), ``#position`` when the dataset has none."""
    for owner in (getattr(dataset, "source", None), dataset):
        key = getattr(owner, "key", None)
        if callable(key):
            try:
                return str(key(sample))
            except Exception:  # noqa: BLE001 - a broken record's key may itself be unreadable
                break
    return f"#{sample}"
