"""The built-in image-text and detection shards: what their docstring says, readable by fastloader and webdataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fastloader import transforms as T
from fastloader.datasets import TarShardDataset
from fastloader.fields import Boxes, Mask
from fastloader.sample_shards import CATEGORIES, iter_members, make_caption_shards, make_detection_shards


def test_caption_shards_hold_jpg_txt_json_cls(tmp_path: Path) -> None:
    shards = make_caption_shards(tmp_path, num_images=10, shard_size=4)
    assert [path.name for path in shards] == ["captions-000000.tar", "captions-000001.tar", "captions-000002.tar"]
    names = [name for name, _ in iter_members(shards[0])]
    assert names[:4] == ["000000000.jpg", "000000000.txt", "000000000.json", "000000000.cls"]
    assert make_caption_shards(tmp_path, num_images=10, shard_size=4) == shards  # deterministic, kept
    dataset = TarShardDataset([str(path) for path in shards], fields={"caption": "txt", "meta": "json", "y": "cls"})
    assert len(dataset) == 10
    sample = dataset[7]
    members = dict(iter_members(shards[1]))
    assert sample["caption"] == members["000000007.txt"].decode()
    assert sample["meta"] == json.loads(members["000000007.json"]) and sample["y"] == int(members["000000007.cls"])


def test_detection_shards_boxes_and_masks_agree(tmp_path: Path) -> None:
    shards = [str(path) for path in make_detection_shards(tmp_path, num_images=6, shard_size=3)]
    fields = {
        "image": "jpg",
        "mask": Mask("seg.png"),
        "target": Boxes("json", path="annotations.*.bbox", format="xywh", labels="annotations.*.category_id"),
    }
    dataset = TarShardDataset(shards, fields=fields, transform=T.Compose([T.Resize(64), T.CenterCrop(64)]))
    for index in range(len(dataset)):
        sample = dataset[index]
        assert sample["image"].shape == (3, 64, 64) and sample["mask"].shape == (64, 64)
        labels = sample["target"]["labels"]
        assert len(sample["target"]["boxes"]) == len(labels) >= 1
        assert set(labels.tolist()) <= set(range(1, len(CATEGORIES)))
        # The mask shows only categories that some box has (later boxes may hide earlier ones).
        visible = set(torch.unique(sample["mask"]).tolist()) - {0}
        assert visible <= set(labels.tolist())


def test_webdataset_reads_the_sample_shards(tmp_path: Path) -> None:
    import webdataset as wds

    shards = [str(path) for path in make_caption_shards(tmp_path, num_images=5, shard_size=5)]
    rows = list(wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode("rgb8").to_tuple("jpg", "txt"))
    ours = TarShardDataset(shards, fields=("txt",))
    assert [text for _, text in rows] == [ours[i][0] for i in range(5)]
    assert all(isinstance(image, np.ndarray) and image.ndim == 3 for image, _ in rows)
