"""The pipelines the doctor and the bench measure: torchvision's ImageNet recipes, as fastloader runs them
and as torchvision does."""

from __future__ import annotations

from typing import Any

PIPELINES = ("train", "eval")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as torchvision's examples


def _check(name: str) -> None:
    if name not in PIPELINES:
        raise ValueError(f"pipeline must be one of {', '.join(PIPELINES)}, got {name!r}")


def fastloader_transform(name: str) -> Any:
    """train: RandomResizedCrop(224) + flip; eval: Resize(256) + CenterCrop(224); fused with decoding."""
    from fastloader import transforms as T

    _check(name)
    if name == "train":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    return T.Compose([T.Resize(256), T.CenterCrop(224)])


def torchvision_geometry(name: str) -> list[Any]:
    """The same steps as torchvision's transforms (on PIL images)."""
    from torchvision import transforms as tv

    _check(name)
    if name == "train":
        return [tv.RandomResizedCrop(224), tv.RandomHorizontalFlip()]
    return [tv.Resize(256), tv.CenterCrop(224)]
