"""How ``worker_method="ray"`` runs its actors: :class:`RayWorkers`, plain data (no Ray imported here).

``DataLoaderX(..., worker_method="ray")`` is ``worker_method=RayWorkers()``; pass one of your own to change where
it connects, what each actor asks of the cluster, how many dead actors it replaces and how long it waits for an
actor to be placed.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class RayWorkers:
    """The Ray actors of a DataLoaderX (``worker_method=RayWorkers(...)``; ``"ray"`` is ``RayWorkers()``).

    Args:
        address: the cluster ``ray.init`` connects to when Ray is not initialised in this process yet
            (default ``"auto"``: ``RAY_ADDRESS``, else the cluster started on this machine). A connection you
            opened yourself (``ray.init(address=..., runtime_env=...)``) is used as it is.
        num_cpus: the CPUs each actor reserves on the cluster (Ray places the actors by it).
        max_replacements: actors started in place of dead ones over the loader's life; None: twice
            ``num_workers``. Past it, once every actor is dead, the epoch raises
            :class:`~fastloader.errors.WorkersLost`.
        placement_timeout: seconds the loader waits, with batches to make and no live actor, for one to be
            placed and started before it raises :class:`~fastloader.errors.WorkersLost`.
    """

    address: str | None = "auto"
    num_cpus: float = 1.0
    max_replacements: int | None = None
    placement_timeout: float = 120.0

    def __post_init__(self) -> None:
        if isinstance(self.num_cpus, bool) or not self.num_cpus >= 0:
            raise ValueError(f"RayWorkers num_cpus must be >= 0, got {self.num_cpus!r}")
        if self.max_replacements is not None and (
            isinstance(self.max_replacements, bool)
            or not isinstance(self.max_replacements, int)
            or self.max_replacements < 0
        ):
            raise ValueError(f"RayWorkers max_replacements must be None or an int >= 0, got {self.max_replacements!r}")
        if isinstance(self.placement_timeout, bool) or not self.placement_timeout > 0:
            raise ValueError(f"RayWorkers placement_timeout must be > 0 seconds, got {self.placement_timeout!r}")


def ray_workers(worker_method: Any) -> RayWorkers | None:
    """The Ray options ``worker_method`` asks for (a checked one: ``fastloader.loader.workers``); None for
    another mode's workers."""
    if isinstance(worker_method, RayWorkers):
        return worker_method
    return RayWorkers() if worker_method == "ray" else None
