"""Ray as ``worker_method="ray"`` uses it, inside this process, for the oracle: actors that answer in any order
and die on cue, with no cluster.

A real cluster costs half a minute to start and seconds per actor, too much for an axis of the fuzz draw
(tests/loader/test_ray_workers.py runs the real one). Here each actor is the real ``BatchMaker`` (fastloader's
actor body) over its own copy of the dataset (pickled, as Ray ships it); a lease is made when ``wait`` picks its
answer, the pick drawn from the case's seed, so answers come in any order; with ``deaths``, the actor picked
dies instead of answering now and then (every lease it holds then raises ``RayActorError``), never twice
on the same batch. Results go through pickle, as through the object store. The actor's seeding of the global
generators is undone around each batch: in a real actor they are another process's.
"""

from __future__ import annotations

import itertools
import os
import pickle
import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from fastloader.loader.rng_states import capture, restore
from fastloader.loader.workers.ray_actor import BatchMaker


class RayError(Exception):
    pass


class RayActorError(RayError):
    pass


class ObjectLostError(RayError):
    pass


class RayTaskError(RayError):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(repr(cause))
        self.cause = cause

    def as_instanceof_cause(self) -> BaseException:
        return self.cause


class Ref:
    def __init__(self, actor: Actor, call: Callable[[], Any], lease_seq: int | None = None) -> None:
        self.actor, self.call, self.lease_seq = actor, call, lease_seq
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = False


class Actor:
    pids = itertools.count(os.getpid() * 1000)

    def __init__(self, ray: FakeRay, payload: Any, slot: int) -> None:
        self.ray = ray
        self.maker = BatchMaker(pickle.loads(pickle.dumps(payload)), slot)
        self.pid = next(self.pids)
        self.dead = False
        self.pending: set[int] = set()  # the leases it holds (their seq)
        self.ready = SimpleNamespace(remote=lambda: Ref(self, lambda: self.pid))
        self.make = SimpleNamespace(remote=self._make)

    def _make(self, lease: Any, base_seed: int, seeds: Any = None) -> Ref:
        self.pending.add(lease.seq)
        if self.dead:  # sent before the loader saw the death: this lease has met a dead actor once already
            self.ray.killed_leases.add(lease.seq)
        return Ref(self, lambda: self._run(lease, base_seed, seeds), lease.seq)

    def _run(self, lease: Any, base_seed: int, seeds: Any) -> Any:
        saved = capture()
        try:
            return pickle.loads(pickle.dumps(self.maker.make(lease, base_seed, seeds)))
        finally:
            restore(saved)


class FakeRay:
    """The parts of the ``ray`` module RayPool and RayEpoch call (see the module docstring)."""

    exceptions = SimpleNamespace(
        RayError=RayError, RayActorError=RayActorError, ObjectLostError=ObjectLostError, RayTaskError=RayTaskError
    )

    def __init__(self, seed: int, deaths: int = 0) -> None:
        self.rng = random.Random(seed)
        self.deaths_left = deaths
        self.killed_leases: set[int] = set()
        self.actors: list[Actor] = []

    def is_initialized(self) -> bool:
        return True

    def put(self, value: Any) -> Any:
        return value

    def remote(self, cls: type) -> Any:
        assert cls is BatchMaker
        ray = self

        def start(payload: Any, slot: int) -> Actor:
            actor = Actor(ray, payload, slot)
            ray.actors.append(actor)
            return actor

        return SimpleNamespace(options=lambda **_: SimpleNamespace(remote=start))

    def kill(self, actor: Actor, no_restart: bool = True) -> bool:
        """Kill ``actor`` unless a lease it holds was out on a dead actor before (that batch would be the one
        that kills its workers: BatchKillsWorkers, which test_ray_workers.py checks on a real cluster)."""
        if actor.dead or actor.pending & self.killed_leases:
            return False
        self.killed_leases |= actor.pending
        actor.dead = True
        return True

    def kill_one(self) -> None:
        """Kill an actor (the oracle's "worker SIGKILLed while idle"), as ``kill`` allows."""
        for actor in self.actors:
            if self.kill(actor):
                return

    def available_resources(self) -> dict[str, float]:
        return {}

    def wait(self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Ref], list[Ref]]:
        ref = self.rng.choice(refs)
        self._settle(ref)
        return [ref], [other for other in refs if other is not ref]

    def _settle(self, ref: Ref) -> None:
        if ref.done:
            return
        ref.done = True
        actor = ref.actor
        if ref.lease_seq is not None and self.deaths_left > 0 and self.rng.random() < 0.15 and self.kill(actor):
            self.deaths_left -= 1
        actor.pending.discard(ref.lease_seq)  # type: ignore[arg-type]
        if actor.dead:
            ref.error = RayActorError(f"the actor (pid {actor.pid}) died")
            return
        try:
            ref.value = ref.call()
        except Exception as error:  # noqa: BLE001 - the dataset's error, raised by get() as Ray raises it
            ref.error = RayTaskError(error)

    def get(self, ref: Ref) -> Any:
        self._settle(ref)
        if ref.error is not None:
            raise ref.error
        return ref.value
