"""The manifest of a tar-shard pack (``fastloader pack --format tar``): what a pack made durable.

``fastloader-tar.progress.json`` while packing (completed shards, source position, skipped items),
``fastloader-tar.json`` once complete: written last, the commit point that makes the pack readable.
Read by the tar dataset and ``verify``, written by the pack's tar sink.

Both are JSON: the :class:`TarPackState` fields, plus ``count``. Version 2 added ``fields``, the pack's
fields (``fastloader.fields``) by their original names: ``{"name": {"kind": ..., "extension": ...}}``;
each sample's value of a field is its member ``{sample}.{extension}``, holding the kind's canonical
bytes (``encode_value``). Version 1 manifests (packs without fields) still read, with no fields.

A field name may be any string (``image/object/bbox/xmin``, ``TEXT``), but a member extension cannot
hold ``/`` and WebDataset readers lowercase it, so :func:`member_extension` derives one:

1. the name, lowercased, with every character outside ``[a-z0-9._-]`` percent-encoded (its UTF-8
   bytes as ``%xx``, lowercase hex): ``image%2fobject%2fbbox%2fxmin``;
2. plus a suffix naming the kind when the extension does not already say it by WebDataset's
   conventions (``kind_of_extension``), so that a plain WebDataset reader decodes the value right:
   ``.txt`` (text), ``.json``, ``.cls`` (int), ``.npy`` (array), ``.bin`` (bytes); a text field
   ``txt`` stays ``txt``, a text field ``caption`` becomes ``caption.txt``. Image and float fields
   get none (WebDataset has no float extension; an image's real format varies by sample);
3. prefixed with ``field.`` when the result is an image or label extension (``png``, ``cls``), which
   readers would otherwise take for the sample's image or label.

Two fields that end with the same extension (names differing only in case) are refused.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastloader.errors import FormatError
from fastloader.fields.values import KINDS, check_kind, kind_of_extension
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.tar_shards import IMAGE_EXTS, LABEL_EXTS

MANIFEST_NAME = "fastloader-tar.json"
PROGRESS_NAME = "fastloader-tar.progress.json"
PACK_FORMAT = "fastloader-tar"
PACK_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # 1: before fields
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")
_KIND_SUFFIX = {"text": "txt", "json": "json", "int": "cls", "array": "npy", "bytes": "bin"}
_RESERVED = frozenset(IMAGE_EXTS + LABEL_EXTS)
FIELD_PREFIX = "field."


@dataclass(frozen=True)
class FieldMember:
    """How a field is stored in the shards: its kind, and the extension of its members."""

    kind: str
    extension: str


def member_extension(name: str, kind: str) -> str:
    """The tar member extension of field ``name`` of ``kind`` (see the module docstring)."""
    check_kind(kind, name)
    if not name:
        raise ValueError("a field name cannot be empty")
    ext = "".join(char.lower() if "A" <= char <= "Z" else char if char in _SAFE else _percent(char) for char in name)
    if kind_of_extension(ext) != kind and kind in _KIND_SUFFIX:
        ext = f"{ext}.{_KIND_SUFFIX[kind]}"
    return FIELD_PREFIX + ext if ext in _RESERVED else ext


def _percent(char: str) -> str:
    return "".join(f"%{byte:02x}" for byte in char.encode("utf-8", "surrogateescape"))


def field_members(fields: Mapping[str, str]) -> dict[str, FieldMember]:
    """Each field of ``fields`` (name -> kind) with its member extension; ValueError when two share one."""
    members: dict[str, FieldMember] = {}
    owner: dict[str, str] = {}  # extension -> field name
    for name, kind in fields.items():
        ext = member_extension(name, kind)
        if ext in owner:
            raise ValueError(
                f"fields {owner[ext]!r} and {name!r} would both be stored as tar members '*.{ext}' (tar member "
                "extensions are lowercase, and WebDataset readers lowercase them): a tar pack cannot keep both"
            )
        owner[ext] = name
        members[name] = FieldMember(kind, ext)
    return members


@dataclass(frozen=True)
class ShardRecord:
    """A completed shard: its file name, samples, and the source position just after its last sample."""

    name: str
    count: int
    end_position: int


@dataclass(frozen=True)
class TarPackState:
    """What a tar pack has made durable: the progress file while packing, the manifest once complete."""

    fingerprint: dict[str, Any]
    prefix: str
    created: int  # mtime of every member: the same bytes whichever run writes a shard
    position: int = 0  # the first source position not yet durable
    shards: tuple[ShardRecord, ...] = ()
    skipped: tuple[BadSample, ...] = ()
    complete: bool = False
    classes: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, FieldMember] = field(default_factory=dict)  # by original field name
    format: str = PACK_FORMAT
    version: int = PACK_VERSION

    @property
    def count(self) -> int:
        return sum(shard.count for shard in self.shards)

    def to_json(self) -> bytes:
        return json.dumps({**dataclasses.asdict(self), "count": self.count}, indent=1).encode()

    @classmethod
    def read(cls, path: Path) -> TarPackState:
        try:
            raw = json.loads(path.read_bytes())
            if raw.get("format") != PACK_FORMAT or raw.get("version") not in _READABLE_VERSIONS:
                raise ValueError(
                    f"format {raw.get('format')!r} v{raw.get('version')}, expected {PACK_FORMAT!r} v1 to "
                    f"v{PACK_VERSION} (written by a newer fastloader?)"
                )
            raw.pop("count", None)
            raw["shards"] = tuple(ShardRecord(**shard) for shard in raw["shards"])
            raw["skipped"] = tuple(BadSample(**item) for item in raw["skipped"])
            raw["fields"] = {name: FieldMember(**record) for name, record in raw.get("fields", {}).items()}
            _check_fields(raw["fields"])
            return cls(**raw)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise FormatError(f"{path}: unreadable tar pack state ({error})") from None


def _check_fields(fields: Mapping[str, FieldMember]) -> None:
    extensions = [record.extension for record in fields.values()]
    for name, record in fields.items():
        if record.kind not in KINDS:
            raise ValueError(f"field {name!r}: unknown kind {record.kind!r}")
        if not record.extension or "/" in record.extension or record.extension != record.extension.lower():
            raise ValueError(f"field {name!r}: bad member extension {record.extension!r}")
        if record.extension in _RESERVED or extensions.count(record.extension) > 1:
            raise ValueError(f"field {name!r}: member extension {record.extension!r} is not its own")
