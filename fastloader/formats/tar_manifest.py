"""The manifest of a tar-shard pack (``fastloader pack --format tar``): what a pack made durable.

``fastloader-tar.progress.json`` while packing (completed shards, source position, skipped items),
``fastloader-tar.json`` once complete: written last, the commit point that makes the pack readable.
Read by the tar dataset and ``verify``, written by the pack's tar sink.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastloader.errors import FormatError
from fastloader.formats.bad_samples import BadSample

MANIFEST_NAME = "fastloader-tar.json"
PROGRESS_NAME = "fastloader-tar.progress.json"
PACK_FORMAT = "fastloader-tar"
PACK_VERSION = 1


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
            if raw.get("format") != PACK_FORMAT or raw.get("version") != PACK_VERSION:
                raise ValueError(f"format {raw.get('format')!r} v{raw.get('version')}, expected {PACK_FORMAT!r} v1")
            raw.pop("count", None)
            raw["shards"] = tuple(ShardRecord(**shard) for shard in raw["shards"])
            raw["skipped"] = tuple(BadSample(**item) for item in raw["skipped"])
            return cls(**raw)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise FormatError(f"{path}: unreadable tar pack state ({error})") from None
