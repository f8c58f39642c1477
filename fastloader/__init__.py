"""fastloader: feed PyTorch training on huge image datasets without waiting for data.

Swap one import::

    from fastloader import DataLoaderX as DataLoader

and batches arrive prefetched in a background thread and copied to ``cuda:local_rank`` on a
side stream. ``BackgroundGenerator`` prefetches any iterable the same way.
"""

from fastloader.loader.background import BackgroundGenerator
from fastloader.loader.dataloader import DataLoaderX
from fastloader.version import __version__

__all__ = ["BackgroundGenerator", "DataLoaderX", "__version__"]
