"""decode_on="cuda" under a busy training loop, with bad files, seeds and CUDA graphs (issue 14).

Every check here can fail: each image is compared with its own CPU decode (a per-image tolerance,
so one corrupted image cannot hide in a batch mean), the training loop's stream really holds
queued work while the loader decodes, and the random streams are compared bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.sample import make_sample_folder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
EVAL = T.Compose([T.Resize(144), T.CenterCrop(128)])  # deterministic: the same plans on both paths
# A resampler difference stays within a few levels per image on average, and few pixels differ by
# much; a block overwritten by the next decode (pytorch/vision#9606) puts whole rows tens of levels off.
PER_IMAGE_LEVELS = 4.0
FAR_OFF_LEVELS, FAR_OFF_SHARE = 48, 0.01


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample_folder(tmp_path_factory.mktemp("sample") / "data", 512, num_classes=4)


def busy(device: torch.device, milliseconds: float) -> None:
    """Queue about ``milliseconds`` of a spinning kernel on the current stream; the host does not wait."""
    torch.cuda._sleep(int(milliseconds * 1_000_000))  # about a million cycles per ms on current GPUs


def cpu_reference(root: Path) -> torch.Tensor:
    loader = DataLoaderX(ImageFolder(root, transform=EVAL), batch_size=64, num_workers=4, device="cpu")
    return torch.cat([images for images, _ in loader])


@pytest.mark.parametrize("own_stream", [False, True])
def test_every_image_matches_its_cpu_decode_while_the_training_step_is_busy(sample: Path, own_stream: bool) -> None:
    device = torch.device("cuda", 0)
    reference = cpu_reference(sample).to(device)
    loader = DataLoaderX(
        ImageFolder(sample, transform=EVAL), batch_size=64, num_workers=4, pin_memory=True, max_prefetch=3,
        decode_on="cuda", local_rank=0,
    )  # fmt: skip
    stream = torch.cuda.Stream(device) if own_stream else torch.cuda.current_stream(device)
    worst = torch.zeros((), device=device)
    worst_share = torch.zeros((), device=device)
    seen = 0
    with torch.cuda.stream(stream):
        for _epoch in range(3):
            position = 0
            for images, _labels in loader:
                busy(device, 20)  # the training step, queued before the check reads the batch
                expected = reference[position : position + images.shape[0]].float()
                difference = (images.float() - expected).abs()
                worst = torch.maximum(worst, difference.mean(dim=(1, 2, 3)).max())
                far_off = (difference > FAR_OFF_LEVELS).float().mean(dim=(1, 2, 3))
                worst_share = torch.maximum(worst_share, far_off.max())
                position += images.shape[0]
                seen += images.shape[0]
                del images  # freed while the check is still queued
    torch.cuda.synchronize(device)
    assert seen == 3 * 512
    assert worst.item() < PER_IMAGE_LEVELS, f"an image is {worst.item():.1f} levels from its CPU decode"
    assert worst_share.item() < FAR_OFF_SHARE, f"{worst_share.item():.1%} of an image's pixels are far off"


def test_a_truncated_jpeg_in_a_gpu_batch_is_replaced_and_counted(tmp_path: Path) -> None:
    root = make_sample_folder(tmp_path / "data", 128, num_classes=2)
    victim = sorted(root.glob("*/*.jpg"))[40]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    dataset = ImageFolder(root, transform=EVAL)
    dataset.set_error_policy("replace", quarantine=tmp_path / "bad.tsv")
    loader = DataLoaderX(dataset, batch_size=64, num_workers=2, decode_on="cuda", local_rank=0)
    sizes = [images.shape[0] for images, _ in loader]
    assert sizes == [64, 64]
    counts = loader.stats()["gpu_decode"]
    assert counts["bad"] == 1 and counts["images"] == 128
    assert loader.stats()["bad_samples"] == 1


def test_random_flip_is_seeded_and_leaves_the_training_loops_cuda_generator_alone(sample: Path) -> None:
    device = torch.device("cuda", 0)

    def flips() -> list[torch.Tensor]:
        loader = DataLoaderX(
            ImageFolder(sample, transform=EVAL), batch_size=64, num_workers=2, decode_on="cuda",
            normalize=(MEAN, STD), random_flip=0.5, local_rank=0,
        )  # fmt: skip
        out = []
        for images, _ in loader:
            torch.rand(1000, device=device)  # the training loop's own draws (dropout)
            out.append(images[:, 0, 0, :4].cpu())
        return out

    torch.manual_seed(0)
    first = flips()
    torch.manual_seed(0)
    state = torch.cuda.get_rng_state(device)
    second = flips()
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    # The loop drew 8 x 1000 numbers; the loader drew none from this generator.
    torch.cuda.set_rng_state(state, device)
    for _ in range(8):
        torch.rand(1000, device=device)
    expected = torch.rand(4, device=device)
    torch.manual_seed(0)
    flips()
    assert torch.equal(torch.rand(4, device=device), expected)


def test_cuda_graph_capture_in_the_loop_while_the_loader_flips(sample: Path) -> None:
    device = torch.device("cuda", 0)
    loader = DataLoaderX(
        ImageFolder(sample, transform=EVAL), batch_size=64, num_workers=2, decode_on="cuda",
        normalize=(MEAN, STD), random_flip=0.5, local_rank=0, max_prefetch=4,
    )  # fmt: skip
    static = torch.zeros(64, 3, 128, 128, device=device)
    graph = torch.cuda.CUDAGraph()
    replays = 0
    for step, (images, _) in enumerate(loader):
        static.copy_(images)
        if step == 1:
            # Captured while the producer thread decodes, normalizes and flips the next batches.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = torch.nn.functional.dropout(static, 0.1).mean()  # the default CUDA generator
        elif step > 1:
            graph.replay()
            replays += 1
            assert torch.isfinite(out).item()
    assert replays == 512 // 64 - 2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_without_workers_collate_runs_on_the_loaders_gpu() -> None:
    devices = []

    def collate(batch: list[int]) -> torch.Tensor:
        tensor = torch.tensor(batch).cuda()  # the current device: must be the loader's
        devices.append(tensor.device)
        return tensor

    loader = DataLoaderX(list(range(8)), batch_size=4, collate_fn=collate, local_rank=1)
    assert [batch.device for batch in loader] == [torch.device("cuda", 1)] * 2
    assert devices == [torch.device("cuda", 1)] * 2
