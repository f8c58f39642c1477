"""Where the per-sample work of a DataLoaderX runs (``worker_method=``): one backend per mode, one interface.

The loader's epoch machinery (``fastloader.loader.torch_iter``: torch's multi-process iterator, subclassed in
``fastloader.torch_internals``) keeps the order, the in-flight bound (``prefetch_factor``), persistence, the
``timeout``, the re-raise of a worker's exception and the resume cursor; a backend only says how a worker is
made and spoken to. Its interface is the one torch's iterator already speaks to ``multiprocessing_context``:

* **start**: ``Process(target=torch's worker loop, args=(...))`` then ``.start()``: a worker that runs torch's
  worker loop's protocol (its ``args``, in torch's order) in the backend's place;
* **send indices**: ``Queue()``: one per worker, ``put((task, indices))``, ``None`` to stop, torch's
  ``_ResumeIteration`` at an epoch's start (answered on the result queue);
* **receive results**: ``Queue()``: the workers' ``(task, batch | ExceptionWrapper | end of data)``, taken
  with ``get(timeout=...)``; ``close()`` / ``cancel_join_thread()`` as ``multiprocessing.Queue`` has them;
* **restart**: a new ``Process`` for the same worker id (``fastloader.loader.worker_restart``, through
  ``torch_internals.WorkerSet``), where the backend can lose a worker;
* **stop**: ``Event()`` set, ``None`` sent, ``join(timeout)``; ``is_alive()``, ``pid`` and ``exitcode`` say
  how a worker is (the watchdog names it).

``threads`` (true for a backend whose workers are this process) tells the iterator no child process exists.
A backend whose workers share one process (``"subprocess"``) answers for it from each worker: the same
``pid``, and one death for all; the wait for results then goes through a recovery hook
(``torch_internals.WorkerRecovery``) that names the lost process instead of torch's message.

The backends: ``"process"``, torch's own processes (``torch.multiprocessing`` or the user's
``multiprocessing_context``; the default), ``"thread"``, threads of the training process
(:mod:`fastloader.loader.workers.thread`), and ``"subprocess"``, those threads in one child process that owns the
whole pipeline, only finished batches crossing (:mod:`fastloader.loader.workers.subprocess`). ``"ray"`` (or a
:class:`~fastloader.loader.RayWorkers`) replaces torch's iterator and its workers altogether: Ray actors make
whole batches for leases the training process hands out (``lease_book.py``: exactly once, in order;
``ray_workers.py`` the actors' pool and an epoch over it, ``ray_actor.py`` what runs in an actor,
``ray_options.py`` RayWorkers).
"""

from __future__ import annotations

from fastloader.loader.workers.ray_options import RayWorkers

WORKER_METHODS = ("process", "thread", "subprocess", "ray")


def check_worker_method(worker_method: object, multiprocessing_context: object) -> None:
    """ValueError naming ``worker_method`` unless it is one of :data:`WORKER_METHODS`; thread workers refuse a
    ``multiprocessing_context`` (they start no process); the subprocess pipeline takes it as the way its one
    process starts."""
    if worker_method not in WORKER_METHODS and not isinstance(worker_method, RayWorkers):
        allowed = ", ".join(repr(method) for method in WORKER_METHODS)
        raise ValueError(f"worker_method must be one of {allowed} or a RayWorkers, got {worker_method!r}")
    if worker_method == "thread" and multiprocessing_context is not None:
        raise ValueError(
            "multiprocessing_context has no use with worker_method='thread' (the workers are threads of this"
            f" process): leave it None, got {multiprocessing_context!r}"
        )
