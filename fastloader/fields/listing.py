"""What a dataset's samples carry: the report behind ``fastloader fields SRC``.

Before writing ``fields=(...)`` a user needs the names as the format spells them, their kinds, and
what a value looks like: this lists them, with the first items' values shortened to a line each.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastloader.errors import MissingField
from fastloader.fields.source import aliases, field_kinds

_WIDTH = 70


def preview(value: Any) -> str:
    """One line saying what ``value`` is."""
    if isinstance(value, bytes):
        return f"{len(value):,} bytes {value[:12]!r}{'...' if len(value) > 12 else ''}"
    if isinstance(value, np.ndarray):
        numbers = np.array2string(value.reshape(-1)[:6], precision=4, separator=", ")
        return f"array {value.dtype} {tuple(value.shape)} {numbers}{'...' if value.size > 6 else ''}"
    text = repr(value)
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


def describe(source: Any, items: int = 2) -> dict[str, Any]:
    """The fields of ``source`` (name -> kind), the names of its image and label, and the first ``items``' values."""
    kinds = field_kinds(source)
    names = aliases(source)
    samples = []
    for index in range(min(items, len(source))):
        values: dict[str, str] = {}
        for name in kinds:
            try:
                values[name] = preview(source.read_field(index, name))
            except MissingField:
                values[name] = "(missing)"
        samples.append({"key": source.key(index), "label": int(source.label(index)), "fields": values})
    return {
        "items": len(source),
        "image": [name for name, meaning in names.items() if meaning == "image"],
        "label": [name for name, meaning in names.items() if meaning == "label"],
        "fields": kinds,
        "samples": samples,
    }


def _names(names: list[str], generic: str) -> str:
    """``generic`` first, then a few of the format's names for it."""
    others = [name for name in names if name != generic]
    return " / ".join([generic, *others[:3]]) + (" / ..." if len(others) > 3 else "")


def format_text(report: dict[str, Any]) -> str:
    image, label = _names(report["image"], "image"), _names(report["label"], "label")
    lines = [f"{report['items']:,} items; the image is {image}, the label {label}"]
    if not report["fields"]:
        lines.append("no other fields: items are (image, label)")
    else:
        lines.append("fields (ask for them with fields=(...)):")
        width = max(len(name) for name in report["fields"])
        lines += [f"  {name:<{width}}  {kind}" for name, kind in report["fields"].items()]
    for sample in report["samples"]:
        if not sample["fields"]:  # a bare colon read as a cut-off line
            lines.append(f"{sample['key']} (label {sample['label']}): (no fields)")
            continue
        lines.append(f"{sample['key']} (label {sample['label']}):")
        width = max([len(name) for name in sample["fields"]] or [0])
        lines += [f"  {name:<{width}}  {value}" for name, value in sample["fields"].items()]
    return "\n".join(lines)
