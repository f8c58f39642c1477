"""The loader: :class:`~fastloader.DataLoaderX`, torch's DataLoader with batches prefetched and on the
device, and :class:`~fastloader.BackgroundGenerator`, any iterable prefetched in a thread; :class:`RayWorkers`,
the Ray actors that make its batches with ``worker_method="ray"``.
"""

# How an epoch flows through the modules of this package: CONTRIBUTING.md, "One epoch, in the main process"
# (kept out of this docstring: it opens the API page, whose readers want the classes).

from fastloader.loader.background import BackgroundGenerator
from fastloader.loader.dataloader import DataLoaderX
from fastloader.loader.workers.ray_options import RayWorkers

__all__ = ["BackgroundGenerator", "DataLoaderX", "RayWorkers"]
