"""Every state the interpreter's generators can hold is taken and put back (fastloader.loader.rng_states),
and a worker whose dataset draws from them resumes with the same draws."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastloader import DataLoaderX
from fastloader.loader import rng_states
from fastloader.loader.resume_state import decode_workers, encode_workers


def _draws() -> tuple[float, float, float]:
    return random.gauss(0, 1), float(np.random.standard_normal()), float(torch.randn(()))


def test_cached_gauss_values_round_trip() -> None:
    random.seed(1)
    np.random.seed(1)
    random.gauss(0, 1)  # an odd number of draws: Python and numpy both hold the pair's second value
    np.random.standard_normal()
    assert random.getstate()[2] is not None
    assert np.random.get_state(legacy=True)[3] == 1
    state = rng_states.capture()
    expected = _draws()
    _draws()
    rng_states.restore(state)
    assert _draws() == expected


def test_encoded_state_round_trips_through_json() -> None:
    random.seed(2)
    random.gauss(0, 1)
    state = rng_states.capture()
    encoded = json.loads(json.dumps(encode_workers(1, 0, {0: {"batches": 3, "rng": state}})))
    _count, _next, states = decode_workers(encoded)
    assert states[0]["rng"] == state


def test_state_saved_without_gauss_still_loads() -> None:
    random.seed(3)
    state = rng_states.capture()
    encoded = encode_workers(1, 0, {0: {"batches": 1, "rng": state}})
    del encoded["states"]["0"]["rng"]["gauss"]  # a state saved before the cached value was kept
    assert decode_workers(encoded)[2][0]["rng"] == state


def test_rng_state_of_the_wrong_size_is_refused() -> None:
    encoded = encode_workers(1, 0, {0: {"batches": 1, "rng": rng_states.capture()}})
    encoded["states"]["0"]["rng"]["random"] = "AAAA"
    with pytest.raises(ValueError, match="Mersenne Twister"):
        decode_workers(encoded)


class GaussPerItem(Dataset[float]):
    """What timm's RandAugment with ``mstd`` does: one random.gauss() per image."""

    def __len__(self) -> int:
        return 11

    def __getitem__(self, index: int) -> float:
        return random.gauss(0, 1) + float(np.random.standard_normal())


def test_dataset_drawing_one_gauss_per_item_runs_as_in_torch() -> None:
    torch.manual_seed(0)
    expected = [float(x) for x in DataLoader(GaussPerItem(), batch_size=1, num_workers=1)]
    torch.manual_seed(0)
    got = [float(x) for x in DataLoaderX(GaussPerItem(), batch_size=1, num_workers=1)]
    assert got == expected


def test_resume_after_an_odd_number_of_gauss_draws_is_exact() -> None:
    torch.manual_seed(5)
    loader = DataLoaderX(GaussPerItem(), batch_size=1, num_workers=2)
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [float(x) for x in iterator]
    resumed = DataLoaderX(GaussPerItem(), batch_size=1, num_workers=2)
    resumed.load_state_dict(state)
    assert [float(x) for x in resumed] == rest
