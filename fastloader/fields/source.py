"""Sources whose samples carry named fields besides the image and label: the protocol and its readers.

A field is one of seven kinds, each with one exact encoding (``fastloader.formats.field_values``,
the byte layout every format shares). A source that carries fields implements :class:`FieldSource` on
top of the image ``Source`` protocol (``fastloader.datasets.base``); :func:`field_kinds` and
:func:`read_fields` ask any source for them (none, for a source of images and labels only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from fastloader.errors import MissingField
from fastloader.formats.field_values import check_kind, check_value


@runtime_checkable
class FieldSource(Protocol):
    """A source whose items carry named fields besides the image and label.

    ``field_kinds()`` names the fields items may carry and their kinds (see
    ``fastloader.formats.field_values``);
    the image and the label are not among them. ``read_field(i, name)`` is the value of item ``i``'s
    field (raises :class:`MissingField`, naming the key, when item ``i`` has none).

    A source may also have ``field_aliases()``: the format's own names of the image and the label
    (``{"jpg": "image", "cls": "label"}`` for tar shards, ``{"image/encoded": "image", ...}`` for
    TFRecord), so that users ask for fields in the format's naming (see ``aliases()``).
    """

    def field_kinds(self) -> Mapping[str, str]: ...

    def read_field(self, index: int, name: str) -> Any: ...


def field_kinds(source: Any) -> dict[str, str]:
    """The fields of ``source`` (``{}`` for a source of images and labels only), sorted by name."""
    if not isinstance(source, FieldSource):
        return {}
    kinds = dict(sorted(source.field_kinds().items()))
    for name, kind in kinds.items():
        check_kind(kind, name)
    return kinds


def aliases(source: Any) -> dict[str, str]:
    """The format's names for the image and label of ``source`` (``"image"`` and ``"label"`` always work)."""
    names = {"image": "image", "label": "label"}
    extra = getattr(source, "field_aliases", None)
    if extra is not None:
        for name, meaning in extra().items():
            if meaning not in ("image", "label"):
                raise ValueError(f"field_aliases: {name!r} must alias 'image' or 'label', got {meaning!r}")
            names.setdefault(name, meaning)
    return names


def read_fields(source: Any, index: int, kinds: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every field item ``index`` carries (missing ones left out), each checked to be of its kind."""
    kinds = field_kinds(source) if kinds is None else kinds
    values: dict[str, Any] = {}
    for name, kind in kinds.items():
        try:
            value = source.read_field(index, name)
        except MissingField:
            continue
        values[name] = check_value(kind, value, f"{source.key(index)}: field {name!r}")
    return values
