"""ImageDataset(fields=...): tuple and dict samples, masks and boxes that follow the crop, batches."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets.base import ImageDataset
from fastloader.fields.batch import FieldBatch
from fastloader.fields.specs import Boxes, Mask
from fastloader.image.batching import EncodedImage, collate
from tests.fields.scenes import SceneSource, scene

v2 = pytest.importorskip("torchvision.transforms.v2")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")

COCO_BOXES = Boxes("json", path="annotations.*.bbox", format="xywh", labels="annotations.*.category_id")
DETECTION = {"image": "jpg", "mask": Mask("seg.png"), "target": COCO_BOXES, "caption": "txt", "label": "cls"}


def _decoded(index: int) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    sample = scene(index)
    image = np.array(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"))
    return image, np.array(Image.open(io.BytesIO(sample["seg.png"])))


def _coco_xyxy(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    annotations = scene(index)["json"]["annotations"]
    boxes = torch.tensor([a["bbox"] for a in annotations], dtype=torch.float32)
    boxes[:, 2:] += boxes[:, :2]
    return boxes, torch.tensor([a["category_id"] for a in annotations])


def test_without_fields_items_stay_image_and_label() -> None:
    dataset = ImageDataset(SceneSource(), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]))
    image, label = dataset[2]
    assert image.shape == (3, 32, 32) and label == scene(2)["label"]


def test_tuple_and_dict_samples_hold_fields_as_stored() -> None:
    fused = T.Compose([T.Resize(40), T.CenterCrop(32)])
    plain = ImageDataset(SceneSource(), transform=fused)
    image, caption, meta, score = ImageDataset(SceneSource(), transform=fused, fields=("jpg", "txt", "json", "score"))[
        3
    ]
    assert torch.equal(image, plain[3][0])
    assert (caption, meta, score) == (scene(3)["txt"], scene(3)["json"], scene(3)["score"])
    named = ImageDataset(SceneSource(), target_transform=lambda y: y * 10, fields={"c": "txt", "y": "label"})
    assert named[3] == {"c": scene(3)["txt"], "y": 10 * scene(3)["label"]}  # no image asked: none decoded
    raw = ImageDataset(SceneSource(), fields=("seg.png",))[3]
    assert raw == (scene(3)["seg.png"],)  # an extra image field is its bytes unless asked for as a Mask


@pytest.mark.parametrize(
    "fused",
    [
        T.Compose([T.RandomResizedCrop(48, scale=(0.2, 1.0)), T.RandomHorizontalFlip()]),
        T.Compose([T.Resize(50), T.CenterCrop(40)]),
        T.Compose([T.Resize((30, 60)), T.RandomHorizontalFlip(1.0)]),
        T.Compose([T.CenterCrop(120)]),  # larger than the image: padded
    ],
    ids=["rrc-flip", "resize-centercrop", "resize-hw-flip", "centercrop-pad"],
)
def test_masks_and_boxes_equal_torchvision_v2_on_the_same_crop(fused: T.Compose) -> None:
    dataset = ImageDataset(SceneSource(), transform=fused, fields=DETECTION)
    steps = v2.Compose([_v2_step(step) for step in fused.steps])
    for index in range(8):
        torch.manual_seed(index)
        ours = dataset[index]
        image, mask = _decoded(index)
        boxes, labels = _coco_xyxy(index)
        torch.manual_seed(index)
        their_image, their_mask, their = steps(
            tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1)),
            tv_tensors.Mask(torch.from_numpy(mask)),
            {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=mask.shape), "labels": labels},
        )
        their = v2.SanitizeBoundingBoxes(min_size=1.0)(their)
        assert ours["image"].shape == their_image.shape
        assert torch.equal(ours["mask"], their_mask.as_subclass(torch.Tensor))
        assert torch.equal(ours["target"]["boxes"], their["boxes"].as_subclass(torch.Tensor))
        assert torch.equal(ours["target"]["labels"], their["labels"])
        assert ours["caption"] == scene(index)["txt"] and ours["label"] == scene(index)["label"]


def _v2_step(step: Any) -> Any:
    if isinstance(step, T.RandomResizedCrop):
        return v2.RandomResizedCrop(list(step.size), step.scale, step.ratio)
    if isinstance(step, T.Resize):
        return v2.Resize([step.size] if isinstance(step.size, int) else list(step.size))
    if isinstance(step, T.CenterCrop):
        return v2.CenterCrop(list(step.size))
    return v2.RandomHorizontalFlip(step.p)


def test_boxes_without_labels_and_with_every_box_kept() -> None:
    fused = T.Compose([T.RandomResizedCrop(32, scale=(0.05, 0.1))])  # small crops empty most boxes
    kept = ImageDataset(
        SceneSource(), transform=fused, fields=(Boxes("json", path="annotations.*.bbox", format="xywh"),)
    )
    every = ImageDataset(
        SceneSource(), transform=fused, fields=(Boxes("json", path="annotations.*.bbox", format="xywh", min_size=None),)
    )
    for index in range(6):
        torch.manual_seed(index)
        (some,) = kept[index]
        torch.manual_seed(index)
        (all_boxes,) = every[index]
        assert len(all_boxes) == len(scene(index)["json"]["annotations"])  # flagged: zero width or height
        sizes = all_boxes[:, 2:] - all_boxes[:, :2]
        assert torch.equal(some, all_boxes[(sizes >= 1).all(dim=1)])


def test_torchvision_v2_tail_moves_annotations_with_the_image() -> None:
    tail = T.Compose([T.Resize(40), T.CenterCrop(32), v2.RandomHorizontalFlip(p=1.0), v2.ToDtype(torch.float32)])
    flipped = ImageDataset(SceneSource(), transform=tail, fields=DETECTION)[4]
    plain = ImageDataset(SceneSource(), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]), fields=DETECTION)[4]
    assert flipped["image"].dtype == torch.float32
    assert torch.equal(flipped["image"], plain["image"].flip(-1).float())
    assert torch.equal(flipped["mask"], plain["mask"].flip(-1))
    expected = plain["target"]["boxes"].clone()
    expected[:, [0, 2]] = 32 - plain["target"]["boxes"][:, [2, 0]]
    assert torch.equal(flipped["target"]["boxes"], expected)
    assert type(flipped["target"]["boxes"]) is torch.Tensor and type(flipped["mask"]) is torch.Tensor  # unwrapped


def test_a_torchvision_v2_pipeline_moves_annotations_too() -> None:
    pipeline = v2.Compose([v2.PILToTensor(), v2.Resize(40), v2.CenterCrop(32)])
    ours = ImageDataset(SceneSource(), transform=pipeline, fields=DETECTION)[5]
    fused = ImageDataset(SceneSource(), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]), fields=DETECTION)[5]
    assert torch.equal(ours["mask"], fused["mask"])
    assert torch.equal(ours["target"]["boxes"], fused["target"]["boxes"])


def test_any_transform_applies_to_the_image_of_a_sample_without_annotations() -> None:
    from torchvision import transforms as v1

    pipeline = v1.Compose([v1.Resize(40), v1.CenterCrop(32), v1.PILToTensor()])
    dataset = ImageDataset(SceneSource(), transform=pipeline, fields=("jpg", "txt"))
    image, caption = dataset[2]
    plain_image, _ = ImageDataset(SceneSource(), transform=pipeline)[2]
    assert image.shape == (3, 32, 32) and torch.equal(image, plain_image) and caption == scene(2)["txt"]
    images, captions = collate(dataset.__getitems__([0, 1]))
    assert images.shape == (2, 3, 32, 32) and captions == [scene(0)["txt"], scene(1)["txt"]]


def test_a_v1_transform_cannot_move_annotations_and_says_so() -> None:
    from torchvision import transforms as v1

    dataset = ImageDataset(SceneSource(), transform=v1.RandomResizedCrop(32), fields=DETECTION)
    with pytest.raises(ValueError, match="fastloader transforms or torchvision.transforms.v2"):
        dataset[0]


def test_batches_with_two_workers_equal_the_per_sample_path() -> None:
    fused = T.Compose([T.Resize(40), T.CenterCrop(32)])
    dataset = ImageDataset(SceneSource(count=10), transform=fused, fields={**DETECTION, "score": "score"})
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate)
    batches = list(loader)
    assert [len(batch["caption"]) for batch in batches] == [4, 4, 2]
    for number, batch in enumerate(batches):
        for row in range(len(batch["caption"])):
            item = dataset[4 * number + row]
            assert torch.equal(batch["image"][row], item["image"])
            assert torch.equal(batch["mask"][row], item["mask"])
            assert torch.equal(batch["target"][row]["boxes"], item["target"]["boxes"])
            assert batch["caption"][row] == item["caption"]
            assert batch["label"][row] == item["label"] and batch["score"][row] == item["score"]
        assert batch["image"].dtype == torch.uint8 and batch["image"].shape[1:] == (3, 32, 32)
        assert batch["mask"].shape[1:] == (32, 32) and batch["label"].dtype == torch.int64
        assert batch["score"].dtype == torch.float64


def test_tuple_batches_are_lists_of_columns_and_default_collate_still_works() -> None:
    dataset = ImageDataset(
        SceneSource(count=4), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]), fields=("jpg", "txt", "cls")
    )
    batch = dataset.__getitems__([0, 1, 2])
    assert isinstance(batch, FieldBatch) and len(batch) == 3 and batch[1][1] == scene(1)["txt"]
    images, captions, labels = collate(batch)
    assert images.shape == (3, 3, 32, 32) and captions == [scene(i)["txt"] for i in range(3)]
    stock = torch.utils.data.default_collate(batch)
    assert torch.equal(stock[0], images) and list(stock[1]) == captions and torch.equal(stock[2], labels)


def test_dataloaderx_normalizes_only_the_image() -> None:
    dataset = ImageDataset(
        SceneSource(count=4), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]), fields=DETECTION
    )
    raw = next(iter(DataLoaderX(dataset, batch_size=4)))
    normalized = next(iter(DataLoaderX(dataset, batch_size=4, normalize=([0.5] * 3, [0.25] * 3))))
    assert normalized["image"].dtype == torch.float32
    torch.testing.assert_close(normalized["image"], (raw["image"].float() / 255 - 0.5) / 0.25)
    assert torch.equal(normalized["mask"], raw["mask"]) and normalized["mask"].dtype == torch.uint8
    assert normalized["caption"] == raw["caption"]


def test_missing_fields_follow_the_error_policy_naming_the_key(tmp_path: Path) -> None:
    fused = T.Compose([T.Resize(40), T.CenterCrop(32)])
    dataset = ImageDataset(SceneSource(count=6, missing=(2,)), transform=fused, fields=("jpg", "txt"))
    with pytest.raises(Exception, match="scene-002: no field 'txt'"):
        dataset[2]
    dataset.set_error_policy("skip", quarantine=tmp_path / "bad.tsv")
    images, captions = collate(dataset.__getitems__([1, 2, 3]))
    assert captions == [scene(1)["txt"], scene(3)["txt"]] and images.shape[0] == 2
    assert dataset.error_stats()["bad_samples"] == 1
    dataset.set_error_policy("replace", quarantine=tmp_path / "bad2.tsv")
    assert dataset[2][1] == scene(3)["txt"]


def test_gpu_decode_items_carry_fields_and_the_plan() -> None:
    fused = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])
    dataset = ImageDataset(SceneSource(), transform=fused, fields=DETECTION)
    dataset.set_decode_device("cuda")
    torch.manual_seed(0)
    encoded = dataset[1]
    torch.manual_seed(0)
    dataset.set_decode_device("cpu")
    decoded = dataset[1]
    assert isinstance(encoded["image"], EncodedImage) and encoded["image"].plan.size == (32, 32)
    assert torch.equal(encoded["mask"], decoded["mask"])
    assert torch.equal(encoded["target"]["boxes"], decoded["target"]["boxes"])
    dataset.set_decode_device("cuda")
    batch = collate(dataset.__getitems__([0, 1]))
    assert isinstance(batch["image"], list) and all(isinstance(image, EncodedImage) for image in batch["image"])


def test_a_cache_refuses_annotations(tmp_path: Path) -> None:
    dataset = ImageDataset(SceneSource(), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]), fields=DETECTION)
    with pytest.raises(ValueError, match="masks or boxes"):
        dataset.set_cache(tmp_path / "cache")


def _shard_of_scenes(path: Path, scenes: list[dict[str, bytes]]) -> Path:
    import tarfile

    with tarfile.open(path, "w") as tar:
        for number, members in enumerate(scenes):
            for ext, data in members.items():
                info = tarfile.TarInfo(f"s{number:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("coordinate", ["1e400", "1" + "0" * 400, "-1e400", "NaN"])
def test_a_box_coordinate_out_of_range_names_the_key_and_field(tmp_path: Path, coordinate: str) -> None:
    from fastloader.datasets.tar import TarShardDataset
    from fastloader.errors import FormatError

    good = scene(0)
    text = '{"annotations": [{"bbox": [1, 2, COORDINATE, 4], "category_id": 1}]}'.replace("COORDINATE", coordinate)
    shard = _shard_of_scenes(tmp_path / "d.tar", [{"jpg": good["jpg"], "json": text.encode()}])
    dataset = TarShardDataset(str(shard), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]), fields=(COCO_BOXES,))
    with pytest.raises(FormatError, match=r"d.tar:s000: field 'json': box coordinates must be finite") as caught:
        dataset[0]
    assert not isinstance(caught.value, OverflowError)
    dataset.set_error_policy("skip", quarantine=tmp_path / "q.tsv")
    assert dataset.__getitems__([0]) == [] and dataset.error_stats()["bad_samples"] == 1


def test_a_box_label_out_of_range_names_the_key_and_field(tmp_path: Path) -> None:
    from fastloader.datasets.tar import TarShardDataset
    from fastloader.errors import FormatError

    text = '{"annotations": [{"bbox": [1, 2, 3, 4], "category_id": 1ZEROS}]}'.replace("ZEROS", "0" * 400)
    shard = _shard_of_scenes(tmp_path / "d.tar", [{"jpg": scene(0)["jpg"], "json": text.encode()}])
    dataset = TarShardDataset(str(shard), fields=(COCO_BOXES,))
    with pytest.raises(FormatError, match=r"d.tar:s000: field 'json': box labels must be integers"):
        dataset[0]


def test_a_mask_of_another_size_than_its_image_names_the_key_and_field(tmp_path: Path) -> None:
    from fastloader.datasets.tar import TarShardDataset
    from fastloader.errors import FormatError

    small, large = scene(0, width=96, height=72), scene(1, width=64, height=48)
    shard = _shard_of_scenes(tmp_path / "d.tar", [{"jpg": small["jpg"], "seg.png": large["seg.png"]}])
    for transform in (T.Compose([T.Resize(40), T.CenterCrop(32)]), None):
        dataset = TarShardDataset(str(shard), transform=transform, fields={"image": "jpg", "mask": Mask("seg.png")})
        message = r"d.tar:s000: field 'seg.png': the mask is 64x48 pixels, its image 96x72"
        with pytest.raises(FormatError, match=message):
            dataset[0]
