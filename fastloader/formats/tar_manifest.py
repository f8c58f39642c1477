"""The manifest of a tar-shard pack (``fastloader pack --format tar``): what a pack made durable.

``fastloader-tar.progress.json`` while packing (completed shards, source position, skipped items),
``fastloader-tar.json`` once complete: written last, the commit point that makes the pack readable.
Read by the tar dataset and ``verify``, written by the pack's tar sink.

Both are the JSON object of :mod:`fastloader.formats.pack_state`, with its keys in this order:
``fingerprint``, ``prefix`` (of the shard names, ``{prefix}-NNNNNN.tar``), ``created`` (also the mtime
of every member), ``position``, ``shards``, ``skipped``, ``complete``, ``classes``, ``meta``, ``fields``,
``format`` (``fastloader-tar``), ``version`` (3), ``count``. Version 3 added each shard's ``size`` and
``sha256`` (of its bytes); each shard's index then also holds ``content_sha256`` (its meta) and the
digest of every member (``member_digest``, see :mod:`fastloader.formats.tar_shards`), so that
``verify`` names a changed member and a reader refuses a shard the manifest does not list. Version 4
added each shard's ``index_sha256``, the digest of its index's arrays
(:mod:`fastloader.formats.tar_index_digest`): a reader trusts no index that is not the one recorded. Version
2 added ``fields``, the pack's
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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastloader.formats.field_values import KINDS, check_kind, kind_of_extension
from fastloader.formats.pack_state import PackState
from fastloader.formats.tar_shards import IMAGE_EXTS, LABEL_EXTS

MANIFEST_NAME = "fastloader-tar.json"
PROGRESS_NAME = "fastloader-tar.progress.json"
PACK_FORMAT = "fastloader-tar"
PACK_VERSION = 4
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


@dataclass(frozen=True, kw_only=True)
class TarPackState(PackState):
    """What a tar pack has made durable: the progress file while packing, the manifest once complete."""

    MANIFEST_NAME: ClassVar[str] = MANIFEST_NAME
    PROGRESS_NAME: ClassVar[str] = PROGRESS_NAME
    FORMAT: ClassVar[str] = PACK_FORMAT
    VERSIONS: ClassVar[tuple[int, ...]] = (
        1,
        2,
        3,
        PACK_VERSION,
    )  # 1: before fields; 2: before content hashes; 3: before index digests
    KEYS: ClassVar[tuple[str, ...]] = tuple(
        "fingerprint prefix created position shards skipped complete classes meta fields format version count".split()
    )
    IDENTITY: ClassVar[tuple[str, ...]] = ("fingerprint", "prefix", "fields")
    WHAT: ClassVar[str] = "tar"

    prefix: str
    fields: dict[str, FieldMember] = field(default_factory=dict)  # by original field name

    @classmethod
    def _decode(cls, raw: dict[str, Any]) -> dict[str, Any]:
        raw["fields"] = {name: FieldMember(**record) for name, record in raw.get("fields", {}).items()}
        _check_fields(raw["fields"])
        return raw


def _check_fields(fields: Mapping[str, FieldMember]) -> None:
    extensions = [record.extension for record in fields.values()]
    for name, record in fields.items():
        if record.kind not in KINDS:
            raise ValueError(f"field {name!r}: unknown kind {record.kind!r}")
        if not record.extension or "/" in record.extension or record.extension != record.extension.lower():
            raise ValueError(f"field {name!r}: bad member extension {record.extension!r}")
        if record.extension in _RESERVED or extensions.count(record.extension) > 1:
            raise ValueError(f"field {name!r}: member extension {record.extension!r} is not its own")
