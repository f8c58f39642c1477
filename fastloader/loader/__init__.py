"""The loader: what runs in the training process, around torch's own DataLoader iterator.

One epoch::

    sampler (default_sampler.py picks it; resume.py can restart it mid-epoch)
        └─► torch's iterator (torch_iter.py): worker processes run the dataset and the image path (fastloader.image)
              └─► producer thread (background.py): next(batch) ─► side-stream copy (device.py),
                  GPU decode (fastloader.image.gpu_decode) and normalize (normalize.py)
                    └─► bounded queue ─► training loop (prefetch_iterator.py)

DataLoaderX (dataloader.py) makes one plan of what it does (plan.py) in ``__init__``, and each ``iter()``
wires an epoch from it (epoch.py); what lasts across epochs is in its resume cursor and its runtime (runtime.py).

Around it, the stage clock (stage_clock.py, stage_stats.py) says where each batch's time goes and
verdict.py what to do about it; autotune.py measures ``num_workers="auto"``; watchdog.py reports a stall.
Only stage_clock's wrappers and the watchdog's stack dump run in worker processes; nothing here
touches the dataset's files.
"""

from fastloader.loader.background import BackgroundGenerator
from fastloader.loader.dataloader import DataLoaderX

__all__ = ["BackgroundGenerator", "DataLoaderX"]
