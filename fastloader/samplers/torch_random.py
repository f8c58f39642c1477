"""TorchRandomSampler: torch's RandomSampler, draw for draw, whose epoch a loader can resume.

``DataLoader(dataset, shuffle=True)`` shuffles with ``torch.utils.data.RandomSampler``. Without a
``generator`` that sampler draws a fresh 64-bit seed from torch's global RNG at the start of each
epoch and never tells anyone, so the order of an interrupted epoch cannot be rebuilt after a restart.
This subclass draws exactly the same numbers from the same generators (so its orders equal torch's
for the same ``torch.manual_seed`` or ``generator``), and additionally

* remembers the seed it drew for the current epoch (``epoch_seed``), and
* can be told the seed of its next epoch (``pin_next_seed``). It still draws (and drops) torch's
  number then, so the global RNG is left exactly where torch's sampler leaves it: a resumed script
  that seeds as the interrupted one did goes on with the same numbers.
* has ``set_epoch`` / ``epoch``, the epoch its training loop is in. The order does not depend on it; it is
  how a framework that sets the sampler's epoch (Lightning does) tells the loader which epoch it is in.

With a ``generator`` it is torch's sampler unchanged: the generator's state at the start of an epoch
decides the order, and ``DataLoaderX`` saves and restores that state itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import RandomSampler


class TorchRandomSampler(RandomSampler):
    """``torch.utils.data.RandomSampler`` (same arguments, same orders) that a loader can resume."""

    epoch_seed: int | None = None  # the seed drawn for the current epoch (generator=None only)
    epoch: int = 0  # the training loop's epoch, as set_epoch was told (the order does not depend on it)
    _pinned_seed: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch the training loop is in (the loader follows it); the order stays torch's."""
        self.epoch = int(epoch)

    def pin_next_seed(self, seed: int) -> None:
        """Use ``seed`` for the next epoch instead of the one drawn from torch's global RNG."""
        self._pinned_seed = int(seed)

    def __iter__(self) -> Iterator[int]:
        # A generator function, like torch's: nothing is drawn before the first index is asked for,
        # so the global RNG is consumed at the same moment as with torch's sampler.
        if self.generator is not None:
            yield from super().__iter__()
            return
        drawn = int(torch.empty((), dtype=torch.int64).random_().item())  # torch's own draw
        seed, self._pinned_seed = self._pinned_seed, None
        if seed is None:
            seed = drawn
        self.epoch_seed = seed
        generator = torch.Generator()
        generator.manual_seed(seed)
        yield from RandomSampler(self.data_source, self.replacement, self._num_samples, generator)
