"""Masks and boxes after every fused transform equal torchvision v2's on the same crop parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastloader import transforms as T
from fastloader.image.annotations import follow_boxes, follow_mask, keep_boxes, to_xyxy
from fastloader.image.geometry import CropPlan

v2 = pytest.importorskip("torchvision.transforms.v2")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")


def _torchvision(fused: T.Compose) -> object:
    """The same steps as torchvision v2 transforms."""
    steps = []
    for step in fused.steps:
        if isinstance(step, T.RandomResizedCrop):
            steps.append(v2.RandomResizedCrop(list(step.size), step.scale, step.ratio))
        elif isinstance(step, T.Resize):
            size = [step.size] if isinstance(step.size, int) else list(step.size)
            steps.append(v2.Resize(size, max_size=step.max_size))
        elif isinstance(step, T.CenterCrop):
            steps.append(v2.CenterCrop(list(step.size)))
        elif isinstance(step, T.RandomHorizontalFlip):
            steps.append(v2.RandomHorizontalFlip(step.p))
    return v2.Compose(steps)


def _pipelines(rng: np.random.Generator) -> list[T.Compose]:
    side = lambda low, high: int(rng.integers(low, high))  # noqa: E731
    return [
        T.Compose([T.RandomResizedCrop(side(8, 120)), T.RandomHorizontalFlip()]),
        T.Compose([T.RandomResizedCrop((side(8, 90), side(8, 90)), scale=(0.5, 1.0)), T.RandomHorizontalFlip(1.0)]),
        T.Compose([T.Resize(side(8, 200)), T.CenterCrop(side(8, 200))]),  # crops that pad, too
        T.Compose([T.Resize((side(8, 200), side(8, 200)))]),
        T.Compose([T.Resize(side(8, 60), max_size=80)]),
        T.Compose([T.CenterCrop((side(8, 400), side(8, 400))), T.RandomHorizontalFlip(1.0)]),
    ]


def _random_boxes(rng: np.random.Generator, width: int, height: int, count: int = 6) -> torch.Tensor:
    corners = torch.tensor(rng.uniform(0, 1, (count, 4)) * [width, height, width, height], dtype=torch.float32)
    return torch.cat([torch.minimum(corners[:, :2], corners[:, 2:]), torch.maximum(corners[:, :2], corners[:, 2:])], 1)


@pytest.mark.parametrize("seed", range(40))
def test_masks_and_boxes_equal_torchvision_v2(seed: int) -> None:
    rng = np.random.default_rng(seed)
    width, height = int(rng.integers(16, 320)), int(rng.integers(16, 320))
    mask = rng.integers(0, 255, (height, width), dtype=np.uint8)
    boxes = _random_boxes(rng, width, height)
    for number, fused in enumerate(_pipelines(rng)):
        torch.manual_seed(1000 * seed + number)
        plan = fused.plan(width, height)
        torch.manual_seed(1000 * seed + number)
        their_mask, their_boxes = _torchvision(fused)(
            tv_tensors.Mask(torch.from_numpy(mask)),
            tv_tensors.BoundingBoxes(boxes.clone(), format="XYXY", canvas_size=(height, width)),
        )
        ours = follow_mask(mask, plan)
        assert ours.shape == tuple(their_mask.shape) == plan.size, fused
        np.testing.assert_array_equal(ours, their_mask.numpy(), err_msg=repr(fused))
        assert torch.equal(follow_boxes(boxes, plan), their_boxes.as_subclass(torch.Tensor)), fused


def test_multichannel_and_16_bit_masks_keep_their_values() -> None:
    rng = np.random.default_rng(0)
    mask = rng.integers(0, 60000, (50, 70, 2), dtype=np.uint16)
    fused = T.Compose([T.Resize(40), T.CenterCrop(32), T.RandomHorizontalFlip(1.0)])
    out = follow_mask(mask, fused.plan(70, 50))
    assert out.shape == (32, 32, 2) and out.dtype == np.uint16
    assert set(np.unique(out)) <= set(np.unique(mask))  # nearest: no value is invented


def test_padding_outside_the_image_is_zero() -> None:
    mask = np.full((10, 10), 7, dtype=np.uint8)
    out = follow_mask(mask, T.CenterCrop(20).plan(10, 10))
    assert out[5:15, 5:15].tolist() == mask.tolist()
    assert out.sum() == 7 * 100


def test_a_hand_made_plan_has_no_steps_to_follow() -> None:
    with pytest.raises(ValueError, match="fastloader transform"):
        follow_mask(np.zeros((4, 4), np.uint8), CropPlan((0, 0, 4, 4), (4, 4), False))


@pytest.mark.parametrize("format", ["XYWH", "CXCYWH"])
def test_box_formats_convert_as_torchvision(format: str) -> None:
    from torchvision.transforms.v2.functional import convert_bounding_box_format

    boxes = _random_boxes(np.random.default_rng(1), 100, 80)
    stored = convert_bounding_box_format(boxes, old_format="XYXY", new_format=format)
    torch.testing.assert_close(to_xyxy(stored, format.lower()), boxes)


def test_keep_boxes_is_sanitize_bounding_boxes_rule() -> None:
    boxes = torch.tensor([[0, 0, 10, 10], [5, 5, 5.5, 9], [3, 3, 3, 3], [0, 0, 1, 1]], dtype=torch.float32)
    sanitize = v2.SanitizeBoundingBoxes(min_size=1.0, labels_getter=None)
    kept = sanitize(tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(20, 20)))
    assert torch.equal(boxes[keep_boxes(boxes, 1.0)], kept.as_subclass(torch.Tensor))
