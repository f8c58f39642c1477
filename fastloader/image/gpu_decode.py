"""GPU decode (``DataLoaderX(decode_on="cuda")``): workers send encoded bytes and crop plans, the
main process decodes whole batches with nvJPEG and crops / resizes / flips on the GPU.

Why: on a machine with few cores per GPU, JPEG decode is the CPU's whole budget; nvJPEG moves it
to the GPU, and workers only read bytes and draw crop boxes (microseconds per image).

How (:class:`GpuDecoder`, in the loader's producer thread, never in a worker):

1. One batched nvJPEG call decodes the batch's JPEGs (RGB), **on a decode stream of its own** (below):
   torchcodec's ``decode_jpeg(list_of_byte_tensors, device="cuda")`` when torchcodec is installed and
   works, else torchvision's (deprecated since torchvision 0.29); ``fastloader.image.gpu_jpeg`` picks
   once (``GpuDecoder.jpeg``, ``DataLoaderX.stats()["gpu_decoder"]``) and keeps EXIF orientation out of
   it, as the CPU path does. A decoded image whose size is not its header's goes to the CPU.
2. Each image is cropped to its plan's box and resized to the plan's size with the plan's filter
   (nearest, bilinear or bicubic, antialiased as torchvision's CPU path), flipped when the plan says
   so, and written into one N×3×H×W uint8 batch, on the loader's side stream.
3. What is not a plain 3- or 1-channel JPEG (CMYK / YCCK JPEGs, PNG, WebP) is decoded on the CPU
   with the same plan (``fastloader.image.decode.decode_plan``) and copied in.
4. nvJPEG fails a whole list for one bad image: the batch is then retried one image at a time, and
   what nvJPEG still refuses goes to the CPU. An image the CPU cannot decode either is a bad sample:
   the dataset's error policy (``set_error_policy``) raises, drops its row from every column of the
   batch (``skip``) or puts the next good sample in its place (``replace``), as on the CPU path.
   Out-of-memory errors are never taken for a bad image. Every fallback is counted (``counts``,
   ``DataLoaderX.stats()["gpu_decode"]``) and the first of each kind is logged.

Why a decode stream: torchvision's decoder writes its outputs on nvJPEG's own stream, without
waiting for the stream that was current when the outputs were allocated (pytorch/vision#9606), and
torchcodec's makes the host wait for the current stream before it decodes. Were that the side stream,
which waits on the training loop's stream and still holds queued crop and resize kernels, the caching
allocator could hand a block those kernels have yet to read to the next decode, which would overwrite
it (and torchcodec would wait for the training loop). The decode stream carries nothing but decodes,
never waits on the training loop, and the side stream waits on it and ``record_stream``s every decoded
image before reading it: a decoded image's memory returns to the decode stream's pool only after the
side stream's kernels that read it have run, whatever the timing. (torch hands streams out from a pool:
the decode stream is checked, at each decode, to be neither the side stream nor the training loop's.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from fastloader.errors import DecodeError
from fastloader.image import batch_rows
from fastloader.image.gpu_jpeg import jpeg_decoder, not_a_bad_image

_JPEG_SOI = b"\xff\xd8"
# torch's interpolate mode for each plan filter the GPU can apply. PIL's NEAREST (the CPU path) samples
# pixel centres, which is torch's "nearest-exact", not its legacy "nearest".
GPU_FILTERS = {
    "nearest": "nearest-exact",
    "nearest-exact": "nearest-exact",
    "bilinear": "bilinear",
    "bicubic": "bicubic",
}
log = logging.getLogger("fastloader")


def check_filters(steps: Sequence[Any], device: str) -> None:
    """GPU decode resizes with nearest, bilinear or bicubic; box, hamming and lanczos have no GPU
    equivalent, and decoding those images on one CPU thread of the main process would be slower
    than decoding them in the workers: refuse, naming the step."""
    for step in steps:
        interpolation = getattr(step, "interpolation", None)
        if interpolation is not None and interpolation not in GPU_FILTERS:
            raise ValueError(
                f"device={device!r} resizes on the GPU with {', '.join(sorted(set(GPU_FILTERS)))};"
                f" {step!r} asks for {interpolation!r}: choose one of those, or decode on the CPU"
            )


@dataclass
class DecodeCounts:
    """What a :class:`GpuDecoder` has done since it was made."""

    batches: int = 0
    images: int = 0
    on_gpu: int = 0  # decoded by nvJPEG
    on_cpu: int = 0  # decoded on the CPU: not a plain JPEG, a filter the GPU lacks, or refused by nvJPEG
    batch_retries: int = 0  # batched nvJPEG calls that failed and were retried one image at a time
    bad: int = 0  # images neither decoder could read, handed to the error policy

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def is_encoded_batch(value: Any) -> bool:
    """True for the list of ``EncodedImage`` that collate makes of a GPU-decode batch."""
    from fastloader.image.batching import EncodedImage

    return isinstance(value, list) and bool(value) and all(isinstance(item, EncodedImage) for item in value)


class GpuDecoder:
    """Decodes the encoded images of collated batches on ``device`` (see the module docstring).

    ``dataset`` and ``collate_fn`` are the loader's: the dataset's error policy decides what a bad
    image does and counts it (``ErrorPolicy.recover``), and a substitute for ``replace`` is read and
    collated as the loader would. Without them a bad image raises.
    On a CPU ``device`` the same logic runs with the decoder's CPU path (tests, CPU-only machines).
    ``jpeg`` names the JPEG decoder (``"torchcodec"`` or ``"torchvision"``); None: see
    ``fastloader.image.gpu_jpeg.jpeg_decoder``. None works raises ``JpegDecoderUnavailable``, naming
    what to install.
    """

    def __init__(
        self, device: torch.device, dataset: Any = None, collate_fn: Any = None, jpeg: str | None = None
    ) -> None:
        self.device = device
        self.jpeg = jpeg_decoder(device, jpeg)
        self.counts = DecodeCounts()
        self._dataset = dataset
        self._collate_fn = collate_fn
        self._stream: torch.cuda.Stream | None = None  # the decode stream, made on first use
        self._avoided: set[int] = set()
        self._logged: set[str] = set()

    def __call__(self, batch: Any) -> Any:
        """``batch`` with its list of encoded images (a column of a tuple / list / dict, or the whole
        batch) replaced by a uint8 N×3×H×W tensor on the device."""
        if is_encoded_batch(batch):
            images, bad = self.decode(batch)
            return self._repair(images, None, batch, bad) if bad else images
        if not isinstance(batch, (dict, list, tuple)):
            return batch
        encoded = [key for key in batch_rows.columns(batch) if is_encoded_batch(batch[key])]
        if not encoded:
            return batch
        if len(encoded) > 1:
            raise ValueError(f"GPU decode takes one column of encoded images per batch, got {len(encoded)}")
        (column,) = encoded
        images, bad = self.decode(batch[column])
        decoded = batch_rows.with_column(batch, column, images)
        return self._repair(decoded, column, batch[column], bad) if bad else decoded

    def avoid(self, stream: torch.cuda.Stream) -> None:
        """Never decode on ``stream`` (the training loop's): torch hands out streams from a pool of 32."""
        self._avoided.add(stream.cuda_stream)

    def decode(self, images: Sequence[Any]) -> tuple[torch.Tensor, list[tuple[int, DecodeError]]]:
        """Decode ``images`` (``EncodedImage``) into one uint8 N×3×H×W tensor on the device; the rows
        no decoder could read are zero, listed with their error."""
        sizes = {item.plan.size for item in images}
        if len(sizes) != 1:
            raise ValueError(f"GPU decode needs one output size per batch, got {sorted(sizes)}")
        (height, width) = sizes.pop()
        out = torch.empty((len(images), 3, height, width), dtype=torch.uint8, device=self.device)
        gpu_rows = [i for i, item in enumerate(images) if _gpu_decodable(item)]
        decoded = self._nvjpeg(images, gpu_rows)
        for i, image in decoded.items():
            out[i] = _crop_resize(image, images[i].plan)
        bad: list[tuple[int, DecodeError]] = []
        cpu_rows = [i for i in range(len(images)) if i not in decoded]
        for i in cpu_rows:
            try:
                out[i] = _decode_on_cpu(images[i], self.device)
            except DecodeError as error:
                out[i] = 0
                bad.append((i, error))
        counts = self.counts
        counts.batches += 1
        counts.images += len(images)
        counts.on_gpu += len(decoded)
        counts.on_cpu += len(cpu_rows) - len(bad)
        counts.bad += len(bad)
        if len(cpu_rows) > len(bad):
            self._log_once(
                "cpu",
                f"GPU decode: {images[cpu_rows[0]].key} decoded on the CPU (not a plain JPEG, or refused by nvJPEG)",
            )
        return out, bad

    def _nvjpeg(self, images: Sequence[Any], rows: list[int]) -> dict[int, torch.Tensor]:
        """``{row: 3×H×W image}`` for the rows nvJPEG decodes; a failed batch is retried image by image."""
        prepared = [(row, self.jpeg.prepare(images[row].data)) for row in rows]
        rows = [row for row, data in prepared if data is not None]  # None: a header we cannot vouch for
        encoded = [data for _, data in prepared if data is not None]
        if not rows:
            return {}
        try:
            return self._as_planned(images, dict(zip(rows, self._decode_jpegs(encoded))))
        except RuntimeError as error:
            _raise_if_out_of_memory(error)
        self.counts.batch_retries += 1
        self._log_once("retry", "GPU decode: nvJPEG failed a batch; retrying its images one at a time")
        decoded = {}
        for row, data in zip(rows, encoded):
            try:
                decoded[row] = self._decode_jpegs([data])[0]
            except RuntimeError as error:
                _raise_if_out_of_memory(error)  # else: the CPU decodes it, or names what is wrong with it
        return self._as_planned(images, decoded)

    def _as_planned(self, images: Sequence[Any], decoded: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """``decoded`` less the images whose size is not their header's, the size their plan was drawn on
        (a decoder that turned an image would crop the wrong pixels): the CPU decodes those."""
        kept = {}
        for row, image in decoded.items():
            header = images[row].header
            if header is not None and tuple(image.shape) != (3, header.height, header.width):
                self._log_once(
                    "size",
                    f"GPU decode: {self.jpeg} decoded {images[row].key} to {tuple(image.shape)}, its header says"
                    f" {header.width}x{header.height}: decoding it on the CPU",
                )
                continue
            kept[row] = image
        return kept

    def _decode_jpegs(self, encoded: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.device.type != "cuda":
            return self.jpeg.decode(encoded, self.device)
        side = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._decode_stream(side)) as stream:
            images = self.jpeg.decode(encoded, self.device)
        side.wait_stream(stream)
        for image in images:
            image.record_stream(side)  # back to the decode stream's pool only after the side stream read it
        return images

    def _decode_stream(self, side: torch.cuda.Stream) -> torch.cuda.Stream:
        """The decode stream: a high-priority stream (decodes are on the critical path of the next
        batch) that is neither the side stream nor the training loop's, the pool notwithstanding."""
        avoided = {*self._avoided, side.cuda_stream, torch.cuda.default_stream(self.device).cuda_stream}
        stream = self._stream
        for _ in range(64):
            if stream is not None and stream.cuda_stream not in avoided:
                self._stream = stream
                return stream
            stream = torch.cuda.Stream(device=self.device, priority=-1)
        raise RuntimeError("GPU decode: found no CUDA stream of its own in the pool")

    def _repair(self, batch: Any, column: Any, images: Sequence[Any], bad: list[tuple[int, DecodeError]]) -> Any:
        """The rows no decoder could read, through the dataset's error policy (the one that decides for the
        CPU path too, and counts): it raises, drops the row from every column (``skip``) or gives the next
        good sample, read and decoded here (``replace``). ``column`` holds the images in ``batch``; None
        when ``batch`` is the image tensor itself."""
        policy = getattr(self._dataset, "error_policy", None)
        if policy is None:
            raise bad[0][1]
        rows, dropped = len(images), set()
        for row, error in bad:
            substitute = policy.recover(_index(images[row]), self._key, error, partial(self._substitute, column))
            if substitute is None:  # skipped
                dropped.add(row)
                continue
            single, pixels = substitute
            if column is None:
                batch[row] = pixels[0]
            else:
                batch = batch_rows.put_row(batch, rows, row, batch_rows.with_column(single, column, pixels))
        if not dropped:
            return batch
        keep = [i for i in range(rows) if i not in dropped]
        if column is None:
            return batch[torch.tensor(keep, dtype=torch.long, device=batch.device)]
        return batch_rows.keep_rows(batch, rows, keep)

    def _substitute(self, column: Any, candidate: int) -> tuple[Any, torch.Tensor]:
        """Sample ``candidate`` in place of a bad one: collated as a batch of one, and its image decoded
        (a DecodeError when it does not decode either: the policy tries the next)."""
        collate = self._collate_fn if self._collate_fn is not None else _collate
        single = collate([self._dataset[candidate]])
        encoded = single if column is None else single[column]
        pixels = _decode_on_cpu(encoded[0], self.device).unsqueeze(0)
        self.counts.on_cpu += 1
        return single, pixels

    def _key(self, index: int) -> str:
        """The key of sample ``index`` in the policy's records (the source's, as the CPU path records)."""
        return str(self._dataset.source.key(index))

    def _log_once(self, kind: str, message: str) -> None:
        """Log the first fallback of each kind; the rest are counted (``DataLoaderX.stats()["gpu_decode"]``)."""
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s (further ones are counted in DataLoaderX.stats()['gpu_decode'])", message)


def decode_batch(images: Sequence[Any], device: torch.device) -> torch.Tensor:
    """Decode, crop, resize and flip ``images`` (``EncodedImage``) into one N×3×H×W uint8 tensor on
    ``device``; an image no decoder can read raises its ``DecodeError``, naming its key."""
    decoded: torch.Tensor = GpuDecoder(device)(list(images))
    return decoded


def _raise_if_out_of_memory(error: RuntimeError) -> None:
    """Out of memory is not a bad image: never fall back on it (nvJPEG reports it as a status)."""
    if not_a_bad_image(error):
        raise error


def _index(item: Any, default: int = -1) -> int:
    index = getattr(item, "index", None)
    return default if index is None else int(index)


def _collate(samples: list[Any]) -> Any:
    from fastloader.image.batching import collate

    return collate(samples)


def _gpu_decodable(item: Any) -> bool:
    """A complete, plain JPEG (nvJPEG decodes it to RGB correctly) whose plan's filter the GPU has."""
    if item.plan.interpolation not in GPU_FILTERS or not _ends_with_eoi(item.data):
        return False
    return bool(item.header.plain_jpeg) if item.header is not None else _plain_jpeg(item.data)


def _ends_with_eoi(data: bytes) -> bool:
    """The end-of-image marker near the end: a truncated file lacks it. nvJPEG may decode a truncated
    file without an error, grey where the data stops, where the CPU path reports it as bad: such
    files go to the CPU, so both paths agree on what a bad sample is. (In entropy-coded data 0xFF is
    always followed by 0x00 or a restart marker, so FF D9 there is the marker; a few bytes of padding
    after it are common.)"""
    return b"\xff\xd9" in data[-32:]


def _plain_jpeg(data: bytes) -> bool:
    """Plain JPEGs nvJPEG decodes correctly to RGB (CMYK / YCCK and non-JPEGs go to the CPU)."""
    if not data.startswith(_JPEG_SOI):
        return False
    import io

    from PIL import Image

    try:
        return Image.open(io.BytesIO(data)).mode in ("RGB", "L")  # reads the header only
    except (OSError, ValueError):
        return False  # the CPU path reports what is wrong with it, naming the key


def _crop_resize(image: torch.Tensor, plan: Any) -> torch.Tensor:
    """Crop ``image`` (3×H×W uint8) to the plan's box, resize with the plan's filter, flip; zero where
    the box extends past the image (CenterCrop larger than the image pads, as torchvision does).

    The result differs from the CPU decode by a level or two on average (IDCT and resampler
    implementations differ).
    """
    from fastloader.image.geometry import visible_region, whole_box

    height, width = image.shape[1:]
    out = torch.zeros((3, *plan.size), dtype=torch.uint8, device=image.device)
    region = visible_region(plan, width, height)
    if region is None:
        return out
    source, (u0, v0, u1, v1) = region
    mode = GPU_FILTERS[plan.interpolation]
    whole = whole_box(source)
    if whole is not None:
        # A whole-pixel box (RandomResizedCrop): crop, then resize the crop, as torchvision does.
        x0, y0, x1, y1 = whole
        crop = image[:, y0:y1, x0:x1].unsqueeze(0).float()
        pixels = _resize(crop, (v1 - v0, u1 - u0), mode)
    else:
        # A fractional box comes from Resize + CenterCrop: resize the whole image, then crop whole pixels.
        sx0, sy0, sx1, sy1 = source
        scale_x, scale_y = (u1 - u0) / (sx1 - sx0), (v1 - v0) / (sy1 - sy0)
        full = _resize(image.unsqueeze(0).float(), (round(height * scale_y), round(width * scale_x)), mode)
        top, left = round(sy0 * scale_y), round(sx0 * scale_x)
        pixels = full[:, :, top : top + v1 - v0, left : left + u1 - u0]
    out[:, v0:v1, u0:u1] = pixels.round_().clamp_(0, 255).to(torch.uint8)[0]
    return out.flip(-1) if plan.flip else out


def _resize(batch: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    if mode.startswith("nearest"):
        return torch.nn.functional.interpolate(batch, size=size, mode=mode)
    return torch.nn.functional.interpolate(batch, size=size, mode=mode, antialias=True, align_corners=False)


def _decode_on_cpu(item: Any, device: torch.device) -> torch.Tensor:
    """``item`` decoded on the CPU with its plan, as a 3×H×W tensor on ``device`` (copied from pinned memory)."""
    from fastloader.image.decode import decode_plan

    pixels: np.ndarray = decode_plan(item.data, item.plan, item.key)
    tensor = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
