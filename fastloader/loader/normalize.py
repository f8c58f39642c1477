"""The last step of a batch's journey, done where it lands: uint8 images to normalized floats.

Workers send uint8 batches (4x fewer bytes through shared memory and PCIe than float32); the
conversion to float (or bf16 / fp16), the normalization and an optional random horizontal flip
run on the device, on the loader's side stream, right after the copy.

The flips come from a generator of the loader's own, never from torch's global one: the global
generator is the training loop's (dropout, its own augmentations), and a producer thread drawing
from it at moments that depend on timing would make seeded runs irreproducible, and would break a
CUDA graph being captured in the loop (torch checks that nothing else advances the generator it
registered). DataLoaderX seeds it each epoch from the seed torch's iterator draws for its workers
(so ``torch.manual_seed`` or the loader's ``generator`` decide the flips); in a worker it is seeded
from the worker's seed. With ``seed=`` each sample's flip is instead a function of (seed, epoch, sample
index) (``fastloader.sample_seeds.flip_draws``, drawn where the batch is fetched and sent with it), so it
is the same whichever worker made the batch and wherever the flip is applied. Without CUDA the same
arithmetic runs on the CPU in the loader's thread, so one script gives the same values everywhere.

Without CUDA, DataLoaderX normalizes in the collate step instead (:class:`NormalizingCollate`), in
the worker processes, in parallel, as torch's loader does with torchvision's Normalize.

Which tensors: every uint8 tensor of a batch with 4 dimensions whose dimension 1 has as many
channels as ``mean`` (N×C×H×W, whatever its memory format). Labels, masks of other shapes and
non-uint8 tensors pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import get_worker_info

from fastloader import sample_seeds
from fastloader.loader.nested import map_tensors
from fastloader.torch_internals import shared_storage

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class NormalizeSpec:
    """What DataLoaderX does to image batches after the copy (see the module docstring)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    flip_p: float = 0.0

    @classmethod
    def create(
        cls,
        normalize: tuple[Sequence[float], Sequence[float]] | None,
        dtype: torch.dtype,
        channels_last: bool,
        flip_p: float,
    ) -> NormalizeSpec | None:
        """Validate DataLoaderX's arguments; None when there is nothing to do."""
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"random_flip must be a probability in [0, 1], got {flip_p!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"normalize_dtype must be one of {', '.join(map(str, _DTYPES))}, got {dtype!r}")
        if normalize is None:
            if flip_p or channels_last:
                raise ValueError("random_flip and channels_last act on normalized image batches: pass normalize=")
            return None
        try:
            mean, std = (tuple(float(v) for v in values) for values in normalize)
        except (TypeError, ValueError):
            raise ValueError(f"normalize must be (mean, std) sequences of floats, got {normalize!r}") from None
        if not mean or len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError(f"normalize needs mean and std of the same non-zero length, std > 0; got {normalize!r}")
        return cls(mean, std, dtype, channels_last, float(flip_p))


class Normalizer:
    """Applies a :class:`NormalizeSpec` on one device, with its constants made once."""

    def __init__(self, spec: NormalizeSpec, device: torch.device, shared: bool = False, seed: int = 0) -> None:
        self.spec = spec
        self.device = device
        self.shared = shared  # write the output straight into shared memory (a worker's batch)
        self._flips = torch.Generator(device=device) if spec.flip_p > 0 else None  # the loader's own
        self.reseed(seed)
        std = torch.tensor(spec.std, dtype=torch.float32, device=device)
        mean = torch.tensor(spec.mean, dtype=torch.float32, device=device)
        # x / 255 then (x - mean) / std, as ToTensor + Normalize, folded into one multiply-add.
        self._scale = (1.0 / (255.0 * std)).view(1, -1, 1, 1).to(spec.dtype)
        self._shift = (-mean / std).view(1, -1, 1, 1).to(spec.dtype)

    def reseed(self, seed: int) -> None:
        """Restart the flips' random stream from ``seed`` (DataLoaderX: each epoch)."""
        if self._flips is not None:
            self._flips.manual_seed(seed)

    def __call__(self, batch: Any, flips: Any = None) -> Any:
        """Normalize (and flip) the image batches of ``batch``; ``flips``: one draw in [0, 1) per sample (seed=),
        None: drawn from this normalizer's generator."""
        return map_tensors(batch, lambda tensor: self._apply(tensor, flips))

    def _is_image_batch(self, tensor: torch.Tensor) -> bool:
        return tensor.dtype == torch.uint8 and tensor.dim() == 4 and tensor.shape[1] == self._scale.shape[1]

    def _apply(self, tensor: torch.Tensor, flips: Any = None) -> torch.Tensor:
        if not self._is_image_batch(tensor):
            return tensor
        if self.spec.flip_p > 0:
            if flips is not None and len(flips) == tensor.shape[0]:
                flip = torch.from_numpy(flips < self.spec.flip_p)
            else:  # no seed= (or a batch an error policy shortened: its samples are not the fetch's)
                flip = torch.rand(tensor.shape[0], device=self.device, generator=self._flips) < self.spec.flip_p
            flip = flip.to(tensor.device)
            tensor = torch.where(flip.view(-1, 1, 1, 1), tensor.flip(-1), tensor)
        # Reorder the uint8 pixels (1 byte each) before widening them, then scale in place: 2.5x
        # faster on the CPU than widening first and reordering floats (measured).
        memory_format = torch.channels_last if self.spec.channels_last else torch.contiguous_format
        pixels = tensor.contiguous(memory_format=memory_format)
        if self.shared:
            # A worker's batch goes to shared memory anyway: widening into it directly saves torch
            # copying the float batch there when it sends it (a third less time, measured).
            out = _shared_like(pixels, self.spec.dtype)
            out.copy_(pixels)
        else:
            out = pixels.to(self.spec.dtype)
        return out.mul_(self._scale).add_(self._shift)


class NormalizingCollate:
    """``collate_fn`` followed by normalization on the CPU: runs in the worker processes (picklable)."""

    def __init__(self, inner: Callable[[Any], Any], spec: NormalizeSpec) -> None:
        self.inner = inner
        self.spec = spec
        self._seed = 0  # the main process's flip seed (num_workers=0), set each epoch by DataLoaderX
        self._normalizer: Normalizer | None = None  # made in the process that uses it

    def reseed(self, seed: int) -> None:
        """The flip seed of this epoch in the main process (workers seed from their own seed)."""
        self._seed = seed
        if self._normalizer is not None and get_worker_info() is None:
            self._normalizer.reseed(seed)

    def __call__(self, batch: Any) -> Any:
        if self._normalizer is None:
            worker = get_worker_info()
            seed = self._seed if worker is None else worker.seed
            self._normalizer = Normalizer(self.spec, torch.device("cpu"), shared=worker is not None, seed=seed)
        return self._normalizer(self.inner(batch), sample_seeds.flip_draws())

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner, "spec": self.spec, "_seed": self._seed, "_normalizer": None}


def _shared_like(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in shared memory with ``tensor``'s shape and strides (a dense layout)."""
    size = tensor.numel() * torch.empty((), dtype=dtype).element_size()
    storage = shared_storage(size)
    return torch.empty(0, dtype=dtype).set_(storage, 0, tensor.shape, tensor.stride())


def flip_seed(base: int) -> int:
    """An epoch's ``random_flip`` seed: derived from the workers' base seed (torch's iterator draws it from
    ``generator`` or the global generator, once per epoch, as torch's loader does; a resumed epoch has the
    interrupted one's), so no extra draw shifts the training loop's random stream."""
    return (base * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**63  # another stream than the workers' seeds


def reseed_flips(finish: Any, collate_fn: Any, seed: int) -> None:
    """Seed an epoch's ``random_flip`` draws wherever they are made: after the copy (``finish``, a
    :class:`Normalizer`) or in the collate step (a :class:`NormalizingCollate`)."""
    if isinstance(finish, Normalizer):
        finish.reseed(seed)
    if isinstance(collate_fn, NormalizingCollate):
        collate_fn.reseed(seed)
