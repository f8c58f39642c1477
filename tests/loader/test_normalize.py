"""DataLoaderX(normalize=...): uint8 batches become normalized floats after the copy (on the CPU here)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset
from torchvision.transforms import Normalize

from fastloader import DataLoaderX
from fastloader.loader.normalize import Normalizer, NormalizeSpec

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class UInt8Images(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, 8, 10), dtype=torch.uint8, generator=generator), i


def reference(images: torch.Tensor) -> torch.Tensor:
    return Normalize(MEAN, STD)(images.float() / 255)


def test_values_equal_torchvision_normalize_on_float() -> None:
    loader = DataLoaderX(UInt8Images(), batch_size=8, normalize=(MEAN, STD), num_workers=2)
    plain = DataLoaderX(UInt8Images(), batch_size=8)
    for (images, labels), (raw, raw_labels) in zip(loader, plain):
        assert images.dtype == torch.float32 and images.is_contiguous()
        torch.testing.assert_close(images, reference(raw), atol=1e-5, rtol=1e-5)
        assert torch.equal(labels, raw_labels), "labels pass through untouched"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_output(dtype: torch.dtype) -> None:
    loader = DataLoaderX(UInt8Images(), batch_size=8, normalize=(MEAN, STD), normalize_dtype=dtype)
    raw = next(iter(DataLoaderX(UInt8Images(), batch_size=8)))[0]
    images = next(iter(loader))[0]
    assert images.dtype == dtype
    torch.testing.assert_close(images.float(), reference(raw), atol=0.05, rtol=0.02)


def test_channels_last_and_flip() -> None:
    raw = next(iter(DataLoaderX(UInt8Images(), batch_size=8)))[0]
    flipped = next(iter(DataLoaderX(UInt8Images(), batch_size=8, normalize=(MEAN, STD), random_flip=1.0)))[0]
    torch.testing.assert_close(flipped, reference(raw).flip(-1), atol=1e-5, rtol=1e-5)
    for workers in (0, 2):  # in workers the output is written straight into shared memory
        loader = DataLoaderX(
            UInt8Images(), batch_size=8, normalize=(MEAN, STD), channels_last=True, num_workers=workers
        )
        last = next(iter(loader))[0]
        assert last.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(last, reference(raw), atol=1e-5, rtol=1e-5)


def test_half_of_the_images_flip_with_p_one_half() -> None:
    torch.manual_seed(0)
    normalizer = Normalizer(NormalizeSpec.create((MEAN, STD), torch.float32, False, 0.5), torch.device("cpu"))  # type: ignore[arg-type]
    images = torch.randint(0, 256, (400, 3, 2, 5), dtype=torch.uint8)
    out = normalizer(images)
    flipped = sum(torch.allclose(out[i], reference(images[i : i + 1].flip(-1))[0]) for i in range(400))
    assert 150 < flipped < 250


def test_other_tensors_are_untouched() -> None:
    normalizer = Normalizer(NormalizeSpec.create((MEAN, STD), torch.float32, False, 0.0), torch.device("cpu"))  # type: ignore[arg-type]
    mask = torch.zeros(2, 1, 4, 4, dtype=torch.uint8)  # one channel: not an image batch of 3 channels
    batch = {"mask": mask, "label": torch.tensor([1, 2]), "name": ["a", "b"]}
    out = normalizer(batch)
    assert out["mask"] is mask and out["label"] is batch["label"] and out["name"] == ["a", "b"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"normalize": ((0.5,), (0.0,))}, "std > 0"),
        ({"normalize": ((0.5, 0.5), (0.5,))}, "same non-zero length"),
        ({"normalize": "imagenet"}, "normalize must be"),
        ({"normalize": (MEAN, STD), "normalize_dtype": torch.int32}, "normalize_dtype"),
        ({"random_flip": 0.5}, "pass normalize="),
        ({"normalize": (MEAN, STD), "random_flip": 2.0}, "random_flip"),
        ({"decode_on": "tpu"}, "decode_on"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DataLoaderX(UInt8Images(), batch_size=4, **kwargs)  # type: ignore[arg-type]


def test_decode_on_cuda_without_cuda_warns_and_decodes_on_the_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    with pytest.warns(RuntimeWarning, match="decoding on the CPU"):
        loader = DataLoaderX(UInt8Images(), batch_size=4, decode_on="cuda")
    assert next(iter(loader))[0].dtype == torch.uint8


def test_a_loader_rebuilt_from_its_attributes_normalizes_once() -> None:
    """Lightning rebuilds loaders from their attributes; the CPU collate wrapper must not stack up."""
    import inspect

    loader = DataLoaderX(UInt8Images(), batch_size=8, normalize=(MEAN, STD))
    params = inspect.signature(DataLoaderX.__init__).parameters
    kwargs = {name: getattr(loader, name) for name in params if name != "self" and hasattr(loader, name)}
    kwargs.update(sampler=None, batch_sampler=None, multiprocessing_context=None)
    rebuilt = DataLoaderX(**kwargs)
    torch.testing.assert_close(next(iter(rebuilt))[0], next(iter(loader))[0])


def flips(images: torch.Tensor, raw: torch.Tensor) -> list[bool]:
    """Which images of a delivered batch are flipped (by comparing with the unflipped reference)."""
    return [not torch.allclose(images[i], reference(raw[i : i + 1])[0], atol=1e-5) for i in range(len(raw))]


def epoch_of_flips(num_workers: int, draw_in_loop: bool) -> list[bool]:
    raw = torch.stack([UInt8Images()[i][0] for i in range(24)])
    loader = DataLoaderX(UInt8Images(), batch_size=8, normalize=(MEAN, STD), random_flip=0.5, num_workers=num_workers)
    seen: list[bool] = []
    for images, labels in loader:
        if draw_in_loop:
            torch.rand(1000)  # the training loop's own random numbers (dropout, augmentations)
        seen += flips(images, raw[labels])
    return seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_random_flip_is_reproducible_whatever_the_training_loop_draws(num_workers: int) -> None:
    torch.manual_seed(1)
    quiet = epoch_of_flips(num_workers, draw_in_loop=False)
    torch.manual_seed(1)
    busy = epoch_of_flips(num_workers, draw_in_loop=True)
    assert quiet == busy and 4 <= sum(quiet) <= 20
    torch.manual_seed(2)
    assert epoch_of_flips(num_workers, draw_in_loop=False) != quiet  # the seed decides them


def test_random_flip_leaves_the_global_random_stream_as_torchs_loader_does() -> None:
    from torch.utils.data import DataLoader

    torch.manual_seed(3)
    for _ in DataLoader(UInt8Images(), batch_size=8):
        pass
    after_torch = torch.get_rng_state()
    torch.manual_seed(3)
    for _ in DataLoaderX(UInt8Images(), batch_size=8, normalize=(MEAN, STD), random_flip=0.5):
        pass
    assert torch.equal(torch.get_rng_state(), after_torch)


def test_a_normalizer_draws_flips_from_its_own_generator() -> None:
    spec = NormalizeSpec.create((MEAN, STD), torch.float32, False, 0.5)
    assert spec is not None
    images = torch.randint(0, 256, (64, 3, 2, 5), dtype=torch.uint8)
    state = torch.get_rng_state()
    first = Normalizer(spec, torch.device("cpu"), seed=7)(images)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(Normalizer(spec, torch.device("cpu"), seed=7)(images), first)
    again = Normalizer(spec, torch.device("cpu"), seed=8)
    assert not torch.equal(again(images), first)
    again.reseed(7)
    assert torch.equal(again(images), first)
