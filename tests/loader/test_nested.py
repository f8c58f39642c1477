"""map_tensors / iter_tensors keep container types and pass non-tensors through untouched."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass, field

import torch

from fastloader.loader.nested import iter_tensors, map_tensors

Point = namedtuple("Point", ["x", "y"])


@dataclass(frozen=True)
class Frozen:
    image: torch.Tensor
    name: str
    extra: list[torch.Tensor] = field(default_factory=list)
    derived: int = field(init=False, default=3)


def test_map_keeps_structure_and_types() -> None:
    batch = {
        "a": torch.zeros(2),
        "b": [torch.ones(1), "path/x.jpg", 3],
        "c": (torch.ones(2), None),
        "d": Point(torch.zeros(1), b"raw"),
        "e": OrderedDict(k=torch.ones(3)),
        "f": Frozen(torch.zeros(4), "s", [torch.ones(1)]),
    }
    out = map_tensors(batch, lambda t: t + 1)
    assert type(out) is dict and type(out["c"]) is tuple and type(out["d"]) is Point
    assert type(out["e"]) is OrderedDict and type(out["f"]) is Frozen
    assert out["a"].tolist() == [1.0, 1.0] and out["b"][0].tolist() == [2.0]
    assert out["b"][1:] == ["path/x.jpg", 3] and out["c"][1] is None and out["d"].y == b"raw"
    assert out["e"]["k"].tolist() == [2.0] * 3
    assert out["f"].image.tolist() == [1.0] * 4 and out["f"].extra[0].tolist() == [2.0]
    assert out["f"].name == "s" and out["f"].derived == 3
    assert batch["a"].tolist() == [0.0, 0.0], "the input must not be modified"


def test_iter_finds_every_tensor_once() -> None:
    tensors = [torch.tensor(i) for i in range(6)]
    batch = {"a": tensors[0], "b": [tensors[1], (tensors[2], "x")], "c": Point(tensors[3], tensors[4])}
    batch["d"] = Frozen(tensors[5], "n")
    assert sorted(int(t) for t in iter_tensors(batch)) == list(range(6))


def test_strings_and_bytes_are_leaves() -> None:
    assert map_tensors("abc", lambda t: t) == "abc"
    assert list(iter_tensors(["abc", b"def"])) == []
