"""Crop geometry against torchvision: identical boxes for the same seed, the same distributions,
the same Resize sizes and CenterCrop boxes (padding included), and plans folded from a chain."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision.transforms as tv
import torchvision.transforms.functional as tvf

from fastloader import transforms as T
from fastloader.image.geometry import (
    CropPlan,
    center_crop_box,
    random_resized_crop_box,
    resize_size,
    visible_region,
)

SIZES = [(500, 375), (375, 500), (333, 500), (64, 64), (1000, 40), (40, 1000), (7, 3), (1, 1)]


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize(("scale", "ratio"), [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.35, 1.0), (0.5, 2.0))])
def test_same_seed_same_box_as_torchvision(width: int, height: int, scale, ratio) -> None:
    image = torch.empty(1, height, width)
    for seed in range(40):  # extreme aspects take the 10-attempt fallback path
        torch.manual_seed(seed)
        i, j, h, w = tv.RandomResizedCrop.get_params(image, list(scale), list(ratio))
        torch.manual_seed(seed)
        assert random_resized_crop_box(width, height, scale, ratio) == (j, i, j + w, i + h)


@pytest.mark.parametrize("ratio", [(3 / 4, 4 / 3), (np.float64(3 / 4), np.float64(4 / 3)), (1, 2)])
def test_a_stream_of_boxes_stays_in_step_with_torchvision(ratio) -> None:
    """One seed, many images: every call draws exactly what get_params draws (the ratio's logs are
    cached per ratio and per type: torch.tensor keeps numpy float64s in float64, ints become floats)."""
    sizes = SIZES * 25
    torch.manual_seed(11)
    theirs = [tv.RandomResizedCrop.get_params(torch.empty(1, h, w), [0.08, 1.0], list(ratio)) for w, h in sizes]
    torch.manual_seed(11)
    ours = [random_resized_crop_box(w, h, (0.08, 1.0), ratio) for w, h in sizes]
    assert ours == [(j, i, j + w, i + h) for i, j, h, w in theirs]


def test_a_generator_replaces_the_global_rng() -> None:
    first = [random_resized_crop_box(500, 375, generator=torch.Generator().manual_seed(3)) for _ in range(3)]
    assert len(set(first)) == 1
    torch.manual_seed(3)
    assert random_resized_crop_box(500, 375) == first[0]


def test_box_statistics_match_torchvision() -> None:
    """Area scale and log-aspect of 4000 draws from each, on an image where the fallback is rare."""
    torch.manual_seed(0)
    ours = np.array([random_resized_crop_box(500, 375) for _ in range(4000)], dtype=float)
    torch.manual_seed(12345)
    image = torch.empty(1, 375, 500)
    theirs = np.array([tv.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)])
    ours_w, ours_h = ours[:, 2] - ours[:, 0], ours[:, 3] - ours[:, 1]
    theirs_h, theirs_w = theirs[:, 2].astype(float), theirs[:, 3].astype(float)
    for a, b in (
        (ours_w * ours_h / (500 * 375), theirs_w * theirs_h / (500 * 375)),
        (np.log(ours_w / ours_h), np.log(theirs_w / theirs_h)),
    ):
        assert abs(a.mean() - b.mean()) < 0.02 and abs(a.std() - b.std()) < 0.02
        assert np.abs(np.quantile(a, [0.1, 0.5, 0.9]) - np.quantile(b, [0.1, 0.5, 0.9])).max() < 0.03
    assert ours_w.min() > 0 and ours[:, 2].max() <= 500 and ours[:, 3].max() <= 375


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize(("size", "max_size"), [(256, None), ([224], None), ((100, 150), None), (32, 60), (8, 9)])
def test_resize_size_is_torchvision(width: int, height: int, size, max_size) -> None:
    expected = tvf._compute_resized_output_size(
        (height, width), [size] if isinstance(size, int) else list(size), max_size
    )
    assert resize_size(width, height, size, max_size) == tuple(expected)


def test_resize_size_refuses_a_max_size_not_above_size() -> None:
    with pytest.raises(ValueError, match="max_size"):
        resize_size(500, 375, 256, max_size=256)


@pytest.mark.parametrize(("width", "height"), [(500, 375), (341, 256), (224, 224), (7, 3), (200, 300), (201, 99)])
@pytest.mark.parametrize("size", [(224, 224), (100, 60), (3, 7), (301, 250)])
def test_center_crop_box_is_torchvision_padding_included(width: int, height: int, size) -> None:
    # An image whose pixel values are their own (1-based) coordinates shows exactly which source
    # pixel torchvision put where, and 0 where it padded.
    xs = torch.arange(1, width + 1, dtype=torch.int32).expand(height, width)
    ys = torch.arange(1, height + 1, dtype=torch.int32)[:, None].expand(height, width)
    cropped = tvf.center_crop(torch.stack([xs, ys]), list(size))
    x0, y0, x1, y1 = center_crop_box(width, height, size)
    assert (x1 - x0, y1 - y0) == (size[1], size[0])
    want_x = torch.arange(x0 + 1, x1 + 1, dtype=torch.int32)
    want_y = torch.arange(y0 + 1, y1 + 1, dtype=torch.int32)
    inside = (want_x[None, :] >= 1) & (want_x[None, :] <= width) & (want_y[:, None] >= 1) & (want_y[:, None] <= height)
    assert torch.equal(cropped[0], torch.where(inside, want_x[None, :].expand(size), 0))
    assert torch.equal(cropped[1], torch.where(inside, want_y[:, None].expand(size), 0))


def test_resize_then_center_crop_folds_into_one_fractional_box() -> None:
    plan = T.Compose([T.Resize(256), T.CenterCrop(224)]).plan(500, 375)
    # 500x375 -> 341x256; crop left round(58.5) = 58, top 16; mapped back by 500/341 and 375/256.
    expected = (58 * 500 / 341, 16 * 375 / 256, 282 * 500 / 341, 240 * 375 / 256)
    assert plan.exact_box == pytest.approx(expected) and plan.size == (224, 224) and not plan.flip
    assert plan.box == tuple(math.floor(v + 0.5) for v in expected)


def test_random_resized_crop_and_flip_fold_into_a_box_and_a_flip() -> None:
    chain = T.Compose([T.RandomResizedCrop((100, 120)), T.RandomHorizontalFlip(p=1.0)])
    plan = chain.plan(500, 375, generator=torch.Generator().manual_seed(1))
    assert plan.box == random_resized_crop_box(500, 375, generator=torch.Generator().manual_seed(1))
    assert plan.flip and plan.exact_box is None and plan.size == (100, 120)
    # A flip before the crop mirrors the box instead.
    flipped_first = T.Compose([T.RandomHorizontalFlip(p=1.0), T.CenterCrop((100, 300))]).plan(500, 375)
    assert flipped_first.box == (500 - 400, 138, 500 - 100, 238) and flipped_first.flip


def test_padding_is_split_from_the_visible_region() -> None:
    plan = T.Compose([T.Resize(200), T.CenterCrop(300)]).plan(400, 300)  # 266x200, padded to 300x300
    assert plan.box[0] < 0 and plan.box[1] < 0
    source_box, out_rect = visible_region(plan, 400, 300)
    assert out_rect == (17, 50, 283, 250)
    assert source_box == pytest.approx((0.0, 0.0, 400 * 266 / 266, 300.0))
    assert visible_region(CropPlan((500, 0, 600, 10), (4, 4), False), 400, 300) is None


def test_crop_plan_validates() -> None:
    with pytest.raises(ValueError, match="x1 > x0"):
        CropPlan((5, 0, 5, 10), (4, 4), False)
    with pytest.raises(ValueError, match="positive"):
        CropPlan((0, 0, 5, 10), (0, 4), False)
