"""Transforms that fuse with decoding: torchvision's parameters and semantics, uint8 output.

::

    from fastloader import transforms as T

    train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    eval_tf = T.Compose([T.Resize(256), T.CenterCrop(224)])
    dataset = LMDBDataset("train.lmdb", transform=train_tf)  # items: uint8 3×224×224 tensors

On encoded bytes (what fastloader datasets pass them) the geometric chain is planned from the
image header and decoded at the size it needs (see ``fastloader.transforms.fused`` and
``fastloader.image.decode``); on PIL images and tensors they are torchvision's transforms.
"""

from fastloader.image.geometry import CropPlan
from fastloader.transforms.fused import (
    CenterCrop,
    Compose,
    FusedTransform,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)

__all__ = [
    "CenterCrop",
    "Compose",
    "CropPlan",
    "FusedTransform",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
]
