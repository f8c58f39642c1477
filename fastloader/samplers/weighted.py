"""Weighted sampling (class balancing) with orders a function of (seed, epoch), in numpy memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fastloader.samplers._epoch import EpochCursor, EpochSampler, check_nonnegative_int, epoch_rng, index_dtype

# Uniform draws are made this many at a time: 8 MB of float64 instead of 8 bytes per sample at once.
_DRAW_CHUNK = 1 << 20


def class_balanced_weights(labels: np.ndarray | Sequence[Any]) -> np.ndarray:
    """Per-sample weights that give every class the same total weight (1 / number of classes).

    ``WeightedRandomSampler(class_balanced_weights(labels), len(labels))`` then draws each class
    equally often, whatever its size. Labels are any values ``np.unique`` can sort.
    """
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=np.float64)
    _, inverse, counts = np.unique(array, return_inverse=True, return_counts=True)
    per_class = 1.0 / (counts.astype(np.float64) * counts.size)
    return per_class[inverse.reshape(-1)]


def _as_weights(weights: np.ndarray | torch.Tensor | Sequence[float]) -> np.ndarray:
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().numpy()
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"weights must be a non-empty one-dimensional sequence, got shape {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError("weights must be finite and >= 0")
    if not array.any():
        raise ValueError("weights must not all be zero")
    return array


class WeightedRandomSampler(EpochSampler):
    """``num_samples`` indices drawn with probability proportional to ``weights``: torch's sampler,
    with the draws a function of (seed, epoch).

    With replacement (the default, and what class balancing wants) an epoch is one cumulative sum of
    the weights, a binary search per (sorted) uniform draw and a shuffle: O(n + k log k), where
    ``rng.choice(p=...)`` would rebuild its table per call. Without replacement it is the exponential race
    (Efraimidis-Spirakis): the ``num_samples`` smallest of ``Exp(1) / w_i``, which draws in the
    order successive weighted draws would. Indices of zero weight are never drawn.
    """

    def __init__(
        self,
        weights: np.ndarray | torch.Tensor | Sequence[float],
        num_samples: int,
        replacement: bool = True,
        *,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.weights = _as_weights(weights)
        self.num_samples = check_nonnegative_int(num_samples, "num_samples")
        self.replacement = bool(replacement)
        positive = np.flatnonzero(self.weights)
        if not self.replacement and self.num_samples > positive.size:
            raise ValueError(
                f"num_samples is {self.num_samples}, but only {positive.size} weights are positive: "
                "too many to draw without replacement"
            )
        self._last_positive = int(positive[-1])
        self._cursor = EpochCursor(seed)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """The draws of ``epoch`` as a new array (int32 while indices fit, else int64)."""
        rng = epoch_rng(self.seed, check_nonnegative_int(epoch, "epoch"))
        if self.replacement:
            return self._draw_with_replacement(rng)
        return self._draw_without_replacement(rng)

    def _draw_with_replacement(self, rng: np.random.Generator) -> np.ndarray:
        cdf = np.cumsum(self.weights)
        total = cdf[-1]
        order = np.empty(self.num_samples, dtype=index_dtype(self.weights.size))
        for begin in range(0, self.num_samples, _DRAW_CHUNK):
            uniform = rng.random(min(_DRAW_CHUNK, self.num_samples - begin))
            uniform *= total
            # Sorted queries make numpy's binary search walk the cdf forwards (8x faster at 10M than
            # random probes, each a cache miss); the shuffle below restores a random order.
            uniform.sort()
            # side="right": u in [cdf[i-1], cdf[i]) picks i, so a zero-weight i (empty interval) never
            # wins; the minimum guards the rounding case u * total == total.
            drawn = np.searchsorted(cdf, uniform, side="right")
            np.minimum(drawn, self._last_positive, out=drawn)
            order[begin : begin + drawn.size] = drawn
        # i.i.d. draws in a uniformly random order are again i.i.d. draws: the sort changed nothing
        # but the order, and this shuffle makes that uniform over the whole epoch.
        rng.shuffle(order)
        return order

    def _draw_without_replacement(self, rng: np.random.Generator) -> np.ndarray:
        with np.errstate(divide="ignore"):
            keys = rng.standard_exponential(self.weights.size) / self.weights  # zero weight: inf, never chosen
        count = self.num_samples
        if count < keys.size:
            chosen = np.argpartition(keys, count - 1)[:count] if count else np.empty(0, dtype=np.intp)
        else:
            chosen = np.arange(keys.size)
        chosen = chosen[np.argsort(keys[chosen], kind="stable")]
        return chosen.astype(index_dtype(self.weights.size))
