"""The resume state of a DataLoaderX, as data: what ``state_dict()`` returns and ``load_state_dict()`` reads.

Version 5 (versions 1 to 4, without ``dataset``, ``batch_size`` and older ones without the keys after
``layout``, still load)::

    {"version": 5, "epoch": e, "samples_yielded": n, "batches_yielded": k, "batch_size": b, "seed": s,
     "world_size": W, "rank": r, "start": g, "layout": L, "rng": "<base64>" or "",
     "base_seed": int or None, "after": [ordinals], "sampler": {...} or None,
     "workers": {"num_workers": N, "next_worker": w, "states": {"0": {...}, ...}} or None,
     "dataset": {...} or None, "next_rng": "<base64>" or ""}

* ``batches_yielded``: batches this rank's training loop received since the iteration began, in the order
  of indices without a gap (with ``in_order=False`` the ones it received beyond that are ``after``, counted
  from there), each of ``batch_size`` samples (None: a batch sampler of the user's, or ``batch_size=None``);
  the position reached in the epoch's global order is ``start + k * b * W`` (``L`` ranks; ``L == W``
  unless the iteration itself resumed at another world size). That position is in samples, so a loader
  with another ``batch_size`` resumes at the same sample. ``samples_yielded``: the samples this rank's
  loop received this epoch, the part before a resume included. A state before version 4 has no
  ``batch_size``: it is ``samples_yielded / batches_yielded`` (rounded up: the epoch's last batch may be
  short, and a short last batch means the epoch was received to its end).
* ``seed`` / ``rng``: what decides the order (fastloader's samplers' seed; the seed torch's RandomSampler
  draws for the epoch; the ordering generator's state when the epoch began); ``base_seed``: the seed of
  the epoch's workers (``torch.utils.data.get_worker_info().seed`` is ``base_seed + worker id``).
* ``sampler``: a sampler with its own ``state_dict`` (the Stateful protocol): its state and its iterator's
  after the last batch the loop received.
* ``workers``: each worker's state after its last batch the loop received (``fastloader.loader.worker_state``):
  its batch count, its dataset's and iterator's own states, its random generators (base64); ``next_worker``
  makes the next batch.
* ``next_rng``: torch's global generator as the epoch's draws (the workers' base seed, the seed torch's
  RandomSampler draws) left it, for the draws of the epochs after it (``fastloader.loader.resume``).
* ``dataset``: the state of a dataset with a resume protocol of its library's (litdata's or MosaicML
  streaming's ``StreamingDataset``, ``fastloader.loader.dataset_protocols``), taken in the training process as
  that library's own loader takes it; None for every other dataset.

Everything is JSON-serializable as long as the states that datasets and samplers return are.
"""

from __future__ import annotations

import base64
import binascii
import copy
import math
from collections.abc import Mapping
from typing import Any

import torch

from fastloader.loader.rng_states import NUMPY_KEYS, RANDOM_WORDS, RngState
from fastloader.loader.worker_state import WorkerState
from fastloader.samplers._epoch import check_nonnegative_int

VERSION = 5
_KEYS_V1 = frozenset(
    {"version", "epoch", "samples_yielded", "batches_yielded", "seed", "world_size", "rank", "start", "layout"}
)
_KEYS_V2 = _KEYS_V1 | {"rng"}
_KEYS_V3 = _KEYS_V2 | {"base_seed", "after", "sampler", "workers"}
_KEYS_V4 = _KEYS_V3 | {"batch_size"}
KEYS = _KEYS_V4 | {"dataset", "next_rng"}
_EXPECTED = {1: _KEYS_V1, 2: _KEYS_V2, 3: _KEYS_V3, 4: _KEYS_V4, VERSION: KEYS}


def encode_bytes(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def decode_bytes(text: object, name: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a base64 str, got {type(text).__name__}")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise ValueError(f"{name} is not base64: {error}") from None


def encode_rng(rng: torch.Tensor | None) -> str:
    return "" if rng is None else encode_bytes(rng.numpy().tobytes())


def decode_rng(text: object, name: str = "state['rng']") -> torch.Tensor | None:
    if text == "":
        return None
    return torch.frombuffer(bytearray(decode_bytes(text, name)), dtype=torch.uint8)


def encode_workers(num_workers: int, next_worker: int, states: Mapping[int, WorkerState]) -> dict[str, Any]:
    encoded = {}
    for worker, state in sorted(states.items()):
        rng = state.get("rng")
        encoded[str(worker)] = {
            "batches": int(state.get("batches", 0)),
            "dataset": copy.deepcopy(state.get("dataset")),
            "iterator": copy.deepcopy(state.get("iterator")),
            "rng": None if rng is None else _encode_worker_rng(rng),
        }
    return {"num_workers": num_workers, "next_worker": next_worker, "states": encoded}


def _encode_worker_rng(rng: RngState) -> dict[str, Any]:
    return {
        "torch": encode_bytes(rng.torch),
        "random": encode_bytes(rng.random_words),
        "gauss": rng.random_gauss,
        "numpy": [encode_bytes(rng.numpy_keys), rng.numpy_pos, rng.numpy_has_gauss, rng.numpy_cached],
    }


def decode_workers(workers: object) -> tuple[int, int, dict[int, dict[str, Any]]]:
    """``(num_workers, next_worker, states)`` of ``state['workers']``; ValueError naming what is wrong."""
    if not isinstance(workers, Mapping) or set(workers) != {"num_workers", "next_worker", "states"}:
        raise ValueError("state['workers'] must be None or a mapping of num_workers, next_worker and states")
    count = check_nonnegative_int(workers["num_workers"], "state['workers']['num_workers']")
    next_worker = check_nonnegative_int(workers["next_worker"], "state['workers']['next_worker']")
    states_in = workers["states"]
    if not isinstance(states_in, Mapping):
        raise ValueError("state['workers']['states'] must be a mapping")
    states: dict[int, dict[str, Any]] = {}
    for key, value in states_in.items():
        name = f"state['workers']['states'][{key!r}]"
        if not isinstance(value, Mapping) or set(value) != {"batches", "dataset", "iterator", "rng"}:
            raise ValueError(f"{name} must have the keys batches, dataset, iterator and rng")
        worker = check_nonnegative_int(int(key) if isinstance(key, str) and key.isdigit() else key, name)
        states[worker] = {
            "batches": check_nonnegative_int(value["batches"], f"{name}['batches']"),
            "dataset": copy.deepcopy(value["dataset"]),
            "iterator": copy.deepcopy(value["iterator"]),
            "rng": None if value["rng"] is None else _decode_worker_rng(value["rng"], name),
        }
    return count, next_worker, states


def _decode_worker_rng(rng: object, name: str) -> RngState:
    """A worker's generators; a state saved before ``gauss`` was kept had no ``random.gauss()`` value cached."""
    name = f"{name}['rng']"
    if not isinstance(rng, Mapping) or not {"torch", "random", "numpy"} <= set(rng) <= _RNG_KEYS:
        raise ValueError(f"{name} must have the keys torch, random, gauss and numpy")
    numpy_state = rng["numpy"]
    if not isinstance(numpy_state, list | tuple) or len(numpy_state) != 4:
        raise ValueError(f"{name}['numpy'] must be [keys, pos, has_gauss, cached]")
    keys, pos, has_gauss, cached = numpy_state
    gauss = rng.get("gauss")
    state = RngState(
        torch=decode_bytes(rng["torch"], f"{name}['torch']"),
        random_words=decode_bytes(rng["random"], f"{name}['random']"),
        random_gauss=None if gauss is None else _number(gauss, f"{name}['gauss']"),
        numpy_keys=decode_bytes(keys, f"{name}['numpy'][0]"),
        numpy_pos=check_nonnegative_int(pos, f"{name}['numpy'][1]"),
        numpy_has_gauss=check_nonnegative_int(has_gauss, f"{name}['numpy'][2]"),
        numpy_cached=_number(cached, f"{name}['numpy'][3]"),
    )
    if len(state.random_words) != 4 * RANDOM_WORDS or len(state.numpy_keys) != 4 * NUMPY_KEYS:
        raise ValueError(f"{name} does not hold two Mersenne Twister states (random's and numpy's)")
    return state


_RNG_KEYS = frozenset({"torch", "random", "gauss", "numpy"})


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The state's values, checked (ValueError names the key); versions 1 and 2 get the new keys' defaults."""
    if not isinstance(state, Mapping):
        raise ValueError(f"DataLoaderX state must be a mapping, got {type(state).__name__}")
    version = state.get("version")
    if isinstance(version, bool) or version not in _EXPECTED:
        raise ValueError(f"DataLoaderX state version {version!r} is not supported (expected 1 to {VERSION})")
    expected = _EXPECTED[version]
    if set(state) != expected:
        raise ValueError(f"not a DataLoaderX state: expected the keys {sorted(expected)}, got {sorted(state)}")
    values: dict[str, Any] = {key: check_nonnegative_int(state[key], f"state[{key!r}]") for key in sorted(_KEYS_V1)}
    if values["world_size"] < 1 or values["layout"] < 1:
        raise ValueError("state['world_size'] and state['layout'] must be >= 1")
    values["batch_size"] = _batch_size(state, values)
    values["rng"] = decode_rng(state.get("rng", ""))
    base_seed = state.get("base_seed")
    values["base_seed"] = None if base_seed is None else int(base_seed)
    after = state.get("after", [])
    if not isinstance(after, list):
        raise ValueError(f"state['after'] must be a list of ints, got {type(after).__name__}")
    values["after"] = frozenset(check_nonnegative_int(item, "state['after'][...]") for item in after)
    sampler = state.get("sampler")
    if sampler is not None and (not isinstance(sampler, Mapping) or set(sampler) != {"sampler", "iterator"}):
        raise ValueError("state['sampler'] must be None or a mapping of sampler and iterator")
    values["sampler"] = copy.deepcopy(dict(sampler)) if sampler is not None else None
    workers = state.get("workers")
    values["workers"] = None if workers is None else decode_workers(workers)
    values["dataset"] = copy.deepcopy(state.get("dataset"))
    values["next_rng"] = decode_rng(state.get("next_rng", ""), "state['next_rng']")
    return values


def _batch_size(state: Mapping[str, Any], values: dict[str, Any]) -> int | None:
    """The size of the batches ``batches_yielded`` counts; None: not known (no batch yet) or not fixed."""
    if "batch_size" in state:
        size = state["batch_size"]
        if size is None:
            return None
        size = check_nonnegative_int(size, "state['batch_size']")
        if size < 1:
            raise ValueError("state['batch_size'] must be None or an int >= 1")
        return size
    batches, samples = values["batches_yielded"], values["samples_yielded"]
    if batches == 0:
        return None
    # Before version 4: samples_yielded was batches_yielded * batch_size, cut at the sampler's length.
    return max(1, -(-samples // batches))
