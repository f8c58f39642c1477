"""fastloader.sample_seeds: the per-sample keys, and the generators seeded from them."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fastloader import sample_seeds


def test_the_vectorized_keys_are_the_scalar_keys() -> None:
    indices = [0, 1, 7, 2**31, 10**12]
    for stream in (sample_seeds.TRANSFORMS, sample_seeds.GLOBALS, sample_seeds.FLIP):
        expected = [sample_seeds.sample_key(42, 3, index, stream) for index in indices]
        assert sample_seeds.sample_keys(42, 3, indices, stream).tolist() == expected


def test_keys_differ_by_seed_epoch_index_and_stream() -> None:
    keys = {
        sample_seeds.sample_key(seed, epoch, index, stream)
        for seed in (0, 1)
        for epoch in (0, 1)
        for index in range(50)
        for stream in (0, 1, 2)
    }
    assert len(keys) == 2 * 2 * 50 * 3
    assert all(0 <= key < 2**63 for key in keys)  # a torch.Generator seed


def global_draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.random_sample()), float(torch.rand(1))


def test_seed_sample_makes_the_global_draws_a_function_of_the_sample() -> None:
    sample_seeds.seed_sample(5, 1, 9)
    first = global_draws()
    global_draws()  # whatever was drawn in between
    sample_seeds.seed_sample(5, 1, 9)
    assert global_draws() == first
    sample_seeds.seed_sample(5, 1, 10)
    assert global_draws() != first


def test_a_fetchs_generator_and_flips_are_the_samples_and_none_without_seed() -> None:
    sample_seeds.begin(None, 0, [1, 2])
    assert sample_seeds.generator(1) is None and sample_seeds.flip_draws() is None
    sample_seeds.begin(5, 2, [4, 3])
    try:
        crop = torch.rand(2, generator=sample_seeds.generator(3))
        flips = sample_seeds.flip_draws()
    finally:
        sample_seeds.end()
    sample_seeds.begin(5, 2, [3])
    try:
        assert torch.equal(torch.rand(2, generator=sample_seeds.generator(3)), crop)
        again = sample_seeds.flip_draws()
    finally:
        sample_seeds.end()
    assert flips is not None and again is not None and again[0] == flips[1]
    assert ((flips >= 0) & (flips < 1)).all()
    assert sample_seeds.current() is None


def test_in_a_thread_worker_seed_sample_seeds_the_threads_own_generators(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's thread workers (``WorkerInfo(worker_method="thread", rng=...)``): the thread's generators are seeded,
    the process's global ones are left alone (another thread's)."""
    from torch.utils.data._utils.worker import _RNG, WorkerInfo

    def thread_info() -> WorkerInfo:
        rng = _RNG(random.Random(), torch.Generator(), np.random.default_rng())
        return WorkerInfo(id=0, num_workers=1, seed=0, dataset=None, worker_method="thread", rng=rng)

    def thread_draws(info: WorkerInfo) -> tuple[float, float, float]:
        rng = info.rng
        numpy_draw = float(rng.numpy_generator.random())  # type: ignore[attr-defined]
        return rng.random_generator.random(), numpy_draw, float(torch.rand(1, generator=rng.torch_generator))

    first, second = thread_info(), thread_info()
    random.seed(1)
    before = random.getstate(), torch.get_rng_state()
    monkeypatch.setattr(sample_seeds, "get_worker_info", lambda: first)
    sample_seeds.seed_sample(5, 1, 9)
    monkeypatch.setattr(sample_seeds, "get_worker_info", lambda: second)
    sample_seeds.seed_sample(5, 1, 9)
    assert thread_draws(first) == thread_draws(second)
    assert random.getstate() == before[0] and torch.equal(torch.get_rng_state(), before[1])
