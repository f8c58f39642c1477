"""Detection and segmentation training from tar shards: each image with its boxes (COCO-style JSON)
and its class-id mask (``KEY.seg.png``), moved together by the crop.

fastloader's fused ``RandomResizedCrop`` / flip decode only the pixels the crop keeps, and move the
mask (nearest-neighbour) and the boxes (shifted, scaled, clipped; boxes the crop empties dropped
with their labels) exactly as torchvision's v2 transforms would. Images and masks arrive as stacked
uint8 batches; boxes, a different number per image, as a list of ``{"boxes", "labels"}`` targets,
the input torchvision's detection models take.

    python examples/train_detection.py "data/scenes-{000000..000001}.tar" --epochs 1
    python examples/train_detection.py --make-sample data/scenes       # writes sample shards first

The model is torchvision's Faster R-CNN on a tiny backbone (untrained) plus a one-layer segmentation
head: small enough for a CPU smoke run; put a real backbone in for real training.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.ops import MultiScaleRoIAlign

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import TarShardDataset
from fastloader.fields import Boxes, Mask
from fastloader.sample_shards import CATEGORIES


class DetectorWithMasks(nn.Module):
    def __init__(self, classes: int, image_size: int) -> None:
        super().__init__()
        # torchvision's Faster R-CNN on a tiny backbone (its tutorial's recipe): the real detection API
        # (images + list of {"boxes", "labels"} targets), cheap enough for a CPU.
        backbone = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU()
        )
        backbone.out_channels = 64  # type: ignore[assignment]
        anchors = AnchorGenerator(sizes=((16, 32, 64, 128),), aspect_ratios=((0.5, 1.0, 2.0),))
        pooler = MultiScaleRoIAlign(featmap_names=["0"], output_size=7, sampling_ratio=2)
        self.detector = FasterRCNN(
            backbone,
            num_classes=classes,
            rpn_anchor_generator=anchors,
            box_roi_pool=pooler,
            min_size=image_size,
            max_size=image_size,
        )
        self.segment = nn.Conv2d(3, classes, 3, padding=1)  # per-pixel classes, a stand-in for a real head

    def forward(
        self, images: torch.Tensor, masks: torch.Tensor, targets: list[dict[str, torch.Tensor]]
    ) -> torch.Tensor:
        losses = self.detector(list(images), targets)
        segmentation = F.cross_entropy(self.segment(images), masks.long())
        return sum(losses.values()) + segmentation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", nargs="?", help="tar shards holding KEY.jpg, KEY.json and KEY.seg.png")
    parser.add_argument("--make-sample", metavar="DIR", help="write sample detection shards into DIR and train on them")
    parser.add_argument("--sample-size", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    args = parser.parse_args()
    if args.make_sample:
        from fastloader.sample_shards import make_detection_shards

        args.shards = [str(path) for path in make_detection_shards(args.make_sample, args.sample_size)]
    if not args.shards:
        parser.error("give shards or --make-sample DIR")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    transform = T.Compose([T.RandomResizedCrop(args.image_size, scale=(0.3, 1.0)), T.RandomHorizontalFlip()])
    boxes = Boxes("json", path="annotations.*.bbox", format="xywh", labels="annotations.*.category_id")
    dataset = TarShardDataset(
        args.shards, transform=transform, fields={"image": "jpg", "mask": Mask("seg.png"), "target": boxes}
    )
    loader = DataLoaderX(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, drop_last=True)
    model = DetectorWithMasks(len(CATEGORIES), args.image_size).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for epoch in range(args.epochs):
        started, seen, step = time.perf_counter(), 0, 0
        for step, batch in enumerate(loader, start=1):
            images = batch["image"].float().div_(255)  # the detector normalizes itself
            targets = [{name: value.to(device) for name, value in target.items()} for target in batch["target"]]
            loss = model(images, batch["mask"], targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(images)
            if args.max_steps and step >= args.max_steps:
                break
        elapsed = time.perf_counter() - started
        print(f"epoch {epoch}: loss {loss.item():.3f} after {step} steps, {seen / elapsed:.1f} images/s")


if __name__ == "__main__":
    main()
