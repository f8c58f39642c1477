"""The byte layout of a field value: seven kinds, each with one exact encoding.

A field is a value with a name: a caption, a JSON record, a multi-label vector, a mask's encoded
bytes (``fastloader.fields``). Every format stores fields its own way (tar members by extension,
``tf.train.Example`` features, Parquet columns, records of a fastloader LMDB); in Python a field is
always one of seven kinds, so that it survives a trip through any format exactly:

========  ======================  ==========================================================
kind      Python value            canonical bytes (LMDB records, tar members)
========  ======================  ==========================================================
image     ``bytes`` (encoded)     as stored (JPEG, PNG, ...)
bytes     ``bytes``               as stored
text      ``str``                 UTF-8
json      dict, list, str, ...    UTF-8 JSON
int       ``int`` (int64)         ASCII decimal (WebDataset's ``.cls``)
float     ``float`` (float64)     ``repr`` in ASCII: reads back bit for bit
array     ``numpy.ndarray``       ``.npy`` (numeric dtypes, native byte order: never pickled)
========  ======================  ==========================================================

Tar members are given their kind by extension, as WebDataset's decoders do (:func:`kind_of_extension`).
Nothing here is pickled, ever: unpickling untrusted data runs code.
"""

from __future__ import annotations

import io
import json
import math
import tokenize
from typing import Any

import numpy as np

from fastloader.errors import FormatError
from fastloader.formats import json_text

KINDS = ("image", "bytes", "text", "json", "int", "float", "array")

# WebDataset's default decoders, by the last part of a member's extension (``seg.png`` -> ``png``).
IMAGE_EXTENSIONS = frozenset(("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "pbm", "pnm", "gif", "tif", "tiff"))
_TEXT_EXTENSIONS = frozenset(("txt", "text", "transcript"))
_JSON_EXTENSIONS = frozenset(("json", "jsn"))
_INT_EXTENSIONS = frozenset(("cls", "cls2", "class", "count", "index", "inx", "id", "label"))
_ARRAY_EXTENSIONS = frozenset(("npy",))
_INT64 = (-(1 << 63), 1 << 63)


def check_kind(kind: str, name: str = "") -> str:
    if kind not in KINDS:
        raise ValueError(f"field {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def kind_of_extension(extension: str) -> str:
    """The kind of a tar member's (or file's) extension, by WebDataset's conventions: the last
    dotted part decides (``seg.png`` is an image, ``meta.json`` JSON); unknown ones are bytes."""
    last = extension.lower().rsplit(".", 1)[-1]
    if last in IMAGE_EXTENSIONS:
        return "image"
    if last in _TEXT_EXTENSIONS:
        return "text"
    if last in _JSON_EXTENSIONS:
        return "json"
    if last in _INT_EXTENSIONS:
        return "int"
    if last in _ARRAY_EXTENSIONS:
        return "array"
    return "bytes"


def kind_of_value(value: Any) -> str:
    """The kind a Python value is stored as (``bytes`` are ``bytes``, never guessed to be an image)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (bool, np.bool_)):
        return "int"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, np.ndarray):
        return "array"
    if value is None or isinstance(value, (dict, list, tuple)):
        return "json"
    raise TypeError(f"a {type(value).__name__} is not a field value (bytes, str, int, float, ndarray or JSON)")


def check_value(kind: str, value: Any, where: str) -> Any:
    """``value`` in the Python type of ``kind`` (numpy scalars made plain); FormatError naming ``where``."""
    if kind in ("image", "bytes"):
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
    elif kind == "text":
        if isinstance(value, str):
            return value
    elif kind == "int":
        if isinstance(value, (int, np.integer)) and _INT64[0] <= int(value) < _INT64[1]:
            return int(value)
    elif kind == "float":
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            return float(value)
    elif kind == "array":
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            # Native byte order: what every format and process hand-off keeps (pickling below
            # protocol 5 turns ">i4" into "<i4" anyway); the values are the same.
            return value if value.dtype.isnative else value.astype(value.dtype.newbyteorder("="))
    elif kind == "json":
        try:
            json_text.dumps(value, where)  # FormatError (a ValueError) when nested too deep
        except FormatError:
            raise
        except (TypeError, ValueError):
            pass
        else:
            return value
    else:
        check_kind(kind)
    raise FormatError(f"{where}: a {type(value).__name__} is not a valid {kind} value")


def encode_value(kind: str, value: Any) -> bytes:
    """The canonical bytes of a field value (see the module docstring)."""
    if kind in ("image", "bytes"):
        return bytes(value)
    if kind == "text":
        return str(value).encode("utf-8")
    if kind == "json":
        return json_text.dumps(value, "a json value", ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if kind == "int":
        return str(int(value)).encode("ascii")
    if kind == "float":
        return repr(float(value)).encode("ascii")
    if kind == "array":
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise ValueError(f"an array field must be numeric or bool, got dtype {array.dtype}")
        out = io.BytesIO()
        np.lib.format.write_array(out, array, allow_pickle=False)
        return out.getvalue()
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")


def _decode_npy(data: bytes) -> np.ndarray:
    """A ``.npy`` array, its header checked against the bytes present before anything is allocated
    (a header claiming 10^13 elements is refused, not allocated)."""
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version in ((2, 0), (3, 0)):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise ValueError(f".npy format version {version} is not supported")
    if dtype.kind not in "biuf" or dtype.subdtype is not None:
        raise ValueError(f"dtype {dtype} is not numeric")
    announced = dtype.itemsize * math.prod(shape)  # Python ints: exact however large the header claims
    present = len(data) - stream.tell()
    if announced != present:
        raise ValueError(f"the header announces {announced} bytes of data ({shape} {dtype}), {present} follow")
    array = np.frombuffer(data, dtype=dtype, offset=stream.tell()).copy()  # writable, as read_array's
    return array.reshape(shape[::-1]).transpose() if fortran_order else array.reshape(shape)


def decode_value(kind: str, data: bytes | memoryview, where: str) -> Any:
    """A field value from its canonical bytes; FormatError naming ``where`` when they are not one."""
    try:
        if kind in ("image", "bytes"):
            return bytes(data)
        if kind == "text":
            return bytes(data).decode("utf-8")
        if kind == "json":
            text = bytes(data).decode("utf-8")
            if json_text.depth_exceeds(text):  # the same answer in every process, whatever its stack
                raise json_text.too_deep(where)
            return json.loads(text)
        if kind == "int":
            value = int(bytes(data).decode("ascii").strip())
            if not _INT64[0] <= value < _INT64[1]:
                raise ValueError("out of int64 range")
            return value
        if kind == "float":
            number = float(bytes(data).decode("ascii").strip())
            if math.isnan(number) and b"nan" not in bytes(data).lower():
                raise ValueError("not a number")
            return number
        if kind == "array":
            return _decode_npy(bytes(data))
    except FormatError:
        raise
    # SyntaxError / TokenError: numpy parses a .npy header as a Python literal.
    except (UnicodeDecodeError, ValueError, EOFError, OSError, SyntaxError, tokenize.TokenError) as error:
        raise FormatError(f"{where}: not a valid {kind} value ({type(error).__name__}: {error})") from None
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
