"""A plain torchvision ImageFolder training script, as people have it today.

The one line that differs from the stock script is the DataLoader import: everything else,
including the ``.to(device, non_blocking=True)`` calls (no-ops once batches already arrive on
the GPU), is unchanged.

    python examples/train_imagefolder.py /path/to/imagenet/train --epochs 1
"""

from __future__ import annotations

import argparse
import time

import torch
import torchvision
from torch import nn
from torchvision import transforms

from fastloader import DataLoaderX as DataLoader  # the only change: was `from torch.utils.data import DataLoader`


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="an ImageFolder root: one sub-folder of images per class")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(args.image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(args.data, transform=train_tf)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=True, drop_last=True
    )
    model = torchvision.models.resnet18(num_classes=len(dataset.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        model.train()
        start, seen = time.perf_counter(), 0
        for step, (images, labels) in enumerate(loader):
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += images.shape[0]
            if args.max_steps and step + 1 >= args.max_steps:
                break
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch}: loss {loss.item():.3f}, {seen / elapsed:.1f} images/s")


if __name__ == "__main__":
    main()
