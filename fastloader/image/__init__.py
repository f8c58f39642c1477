"""The image path: encoded bytes to uint8 pixels, in the worker processes (GPU decode: in the loader's thread).

    encoded bytes ─► header (size, format) ─► crop plan (geometry.py: the fused geometric transforms
    folded into one box and output size) ─► decode just that region, DCT-scaled (decode.py, through the
    libjpeg-turbo extension _jpeg.c / jpeg_ext.py, else PIL) ─► one resize ─► written into the batch's
    shared-memory buffer (batching.py) ─► handed to the loader without a copy

``decoded_cache.py`` keeps decoded images of fixed transforms across epochs; ``gpu_decode.py`` decodes
``EncodedImage`` batches with nvJPEG in the main process instead (through the decoder ``gpu_jpeg.py``
picks: torchcodec, else torchvision). The user-facing transform classes
live in ``fastloader.transforms``; datasets (``fastloader.datasets``) call this path.
"""

from fastloader.image.batching import EncodedImage, PrecollatedBatch, collate
from fastloader.image.decode import ImageHeader, decode_plan, read_header
from fastloader.image.gpu_decode import GpuDecoder, decode_batch
from fastloader.image.pil import decode_pil

__all__ = [
    "EncodedImage",
    "GpuDecoder",
    "ImageHeader",
    "PrecollatedBatch",
    "collate",
    "decode_batch",
    "decode_pil",
    "decode_plan",
    "read_header",
]
