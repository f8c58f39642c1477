"""CLIP-style image-text training from WebDataset tar shards (``KEY.jpg`` + ``KEY.txt``), as LAION,
CC12M and DataComp are published.

fastloader reads the shards by random access (an index per shard, built once), decodes each JPEG at
the size the crop needs, and hands the training loop uint8 image batches (normalized on the GPU)
with the captions as a list of strings. ``ShardWindowSampler`` shuffles shards, then samples within
a window of shards: near-random order while each shard is read from one place (and fetched once
from object storage for ``s3://`` shards).

    python examples/train_clip_tar.py "data/captions-{000000..000003}.tar" --epochs 1
    python examples/train_clip_tar.py --make-sample data/captions          # writes sample shards first

The model is deliberately tiny (a small CNN and a bag of hashed words): the data path is the point.
Swap in open_clip's model and tokenizer for real training.
"""

from __future__ import annotations

import argparse
import time
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import TarShardDataset
from fastloader.samplers import ShardWindowSampler

MEAN, STD = (0.481, 0.458, 0.408), (0.269, 0.261, 0.276)  # CLIP's
VOCAB = 4096


def tokenize(captions: list[str], length: int = 16) -> torch.Tensor:
    """Hashed lower-case words, padded with 0 (a stand-in for a real tokenizer)."""
    rows = []
    for caption in captions:
        ids = [1 + zlib.crc32(word.encode()) % (VOCAB - 1) for word in caption.lower().split()][:length]
        rows.append(ids + [0] * (length - len(ids)))
    return torch.tensor(rows)


class TinyCLIP(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 32, 5, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, dim, 3, stride=2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.words = nn.EmbeddingBag(VOCAB, dim, mode="mean", padding_idx=0)
        self.scale = nn.Parameter(torch.tensor(2.659))  # log(1 / 0.07), CLIP's initial temperature

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        image = F.normalize(self.image(images), dim=-1)
        text = F.normalize(self.words(tokens), dim=-1)
        logits = self.scale.exp() * image @ text.t()
        target = torch.arange(len(images), device=images.device)
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", nargs="?", help="tar shards: a brace pattern, a glob or a pack directory")
    parser.add_argument(
        "--make-sample", metavar="DIR", help="write sample image-text shards into DIR and train on them"
    )
    parser.add_argument("--sample-size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    args = parser.parse_args()
    if args.make_sample:
        from fastloader.sample_shards import make_caption_shards

        args.shards = [str(path) for path in make_caption_shards(args.make_sample, args.sample_size, shard_size=128)]
    if not args.shards:
        parser.error("give shards or --make-sample DIR")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    transform = T.Compose([T.RandomResizedCrop(args.image_size, scale=(0.5, 1.0)), T.RandomHorizontalFlip()])
    dataset = TarShardDataset(args.shards, transform=transform, fields=("jpg", "txt"))
    sampler = ShardWindowSampler(dataset, window=2)
    loader = DataLoaderX(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        drop_last=True,
        normalize=(MEAN, STD),  # uint8 batches from the workers, normalized where they land
    )
    model = TinyCLIP().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        started, seen, step = time.perf_counter(), 0, 0
        for step, (images, captions) in enumerate(loader, start=1):
            loss = model(images, tokenize(captions).to(device, non_blocking=True))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(captions)
            if args.max_steps and step >= args.max_steps:
                break
        elapsed = time.perf_counter() - started
        print(f"epoch {epoch}: loss {loss.item():.3f} after {step} steps, {seen / elapsed:.0f} image-text pairs/s")
    print("input pipeline:", loader.stats()["verdict"]["summary"])


if __name__ == "__main__":
    main()
