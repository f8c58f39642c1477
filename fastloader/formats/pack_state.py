"""The state of a pack written as a directory of files (tar shards, Parquet files): what it made durable.

Each such format names two files beside its data files: a *progress file* while packing, and the
*manifest*, written last by ``finish()``: the commit point that makes the pack readable. Both are
the same JSON object (indented by one space), with these keys common to every format:

``fingerprint``
    the source and options packed (a JSON object): a resumed run must bring the same one.
``created``
    when the pack began (UNIX seconds); a resumed run keeps it.
``position``
    the first source position not yet durable: where a resumed run continues.
``shards``
    the completed data files, in order: ``{"name", "count", "end_position", "size", "sha256"}`` each
    (its file name, beside the manifest; its samples; the source position just after its last sample;
    its size in bytes and the SHA-256 of its bytes, hex; for a tar shard, ``index_sha256``, the digest of
    its index's arrays). Packs written before content hashes (tar v1-v2, Parquet v1) have no ``size`` /
    ``sha256``, tar packs before v4 no ``index_sha256``: null when read.
``skipped``
    the source items skipped: ``{"position", "key", "reason"}`` each.
``complete``
    true in the manifest of a finished pack.
``classes`` / ``meta``
    the class names (or null) and the source's metadata, set by ``finish()``.
``format`` / ``version``
    which format and version wrote the file (readers refuse others).
``count``
    the samples of all ``shards`` (written for readers' convenience; checked when read).

A state is read only when its numbers agree (else a FormatError naming the file and the shard):
no file is listed twice; ``end_position``\\ s strictly increase and none is past ``position``; no
count is negative; skipped positions strictly increase below ``position``; and every source
position is accounted for exactly once: a shard's ``count`` is the positions since the previous
shard's end minus those skipped, and the positions after the last shard are all skipped. So the
samples of the shards are ``position`` minus the skipped items, and ``count`` is their sum.

Each format adds its own keys and fixes the order of all of them (``KEYS``): see
:mod:`fastloader.formats.tar_manifest` and :mod:`fastloader.formats.parquet_pack`.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from fastloader.errors import FormatError
from fastloader.formats import json_text
from fastloader.formats.bad_samples import BadSample

# The largest progress file or manifest read: a pack of 10M samples in 10,000 shards, with 1% of them
# skipped and listed, takes about 20 MB. A larger one is refused before it is read (a stranger's pack,
# a bucket's manifest listed at gigabytes).
MAX_STATE_BYTES = 256 << 20


def classes_digest(classes: Any) -> str | None:
    """The SHA-256 of a source's class names (None when it has none), as a pack's fingerprint records them
    (``fingerprint["source"]["classes_sha256"]``): what its manifest's ``classes`` are checked against."""
    if classes is None:
        return None
    return hashlib.sha256(json.dumps(list(classes)).encode("utf-8", "surrogateescape")).hexdigest()


def classes_edited(fingerprint: dict[str, Any], classes: Any) -> bool:
    """Whether ``classes`` (a manifest's) are not the class names the pack's fingerprint recorded of its source
    (False for a pack from before the digest was recorded)."""
    source: Any = fingerprint.get("source")
    if not isinstance(source, dict) or "classes_sha256" not in source:
        return False
    return classes_digest(None if classes is None else list(classes)) != source["classes_sha256"]


StateT = TypeVar("StateT", bound="PackState")


@dataclass(frozen=True)
class ShardRecord:
    """A completed data file: its file name, samples, the source position just after its last sample, and
    its size and the SHA-256 of its bytes (None in a pack written before they were recorded)."""

    name: str
    count: int
    end_position: int
    size: int | None = None
    sha256: str | None = None
    index_sha256: str | None = None  # a tar shard's index (tar packs of version 4): tar_index_digest


@dataclass(frozen=True, kw_only=True)
class PackState:
    """What a pack has made durable: its progress file while packing, its manifest once complete.

    A format subclasses it with its own fields and says, as class variables, the names of its two
    files, its ``FORMAT`` and readable ``VERSIONS`` (the last is the one written), the order of its
    JSON ``KEYS``, and ``IDENTITY``: the fields a resumed run must share with the pack.
    """

    MANIFEST_NAME: ClassVar[str]
    PROGRESS_NAME: ClassVar[str]
    FORMAT: ClassVar[str]
    VERSIONS: ClassVar[tuple[int, ...]]
    KEYS: ClassVar[tuple[str, ...]]
    IDENTITY: ClassVar[tuple[str, ...]]
    WHAT: ClassVar[str]  # the format in messages

    fingerprint: dict[str, Any]
    created: int = field(default_factory=lambda: int(time.time()))
    position: int = 0
    shards: tuple[ShardRecord, ...] = ()
    skipped: tuple[BadSample, ...] = ()
    complete: bool = False
    classes: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(shard.count for shard in self.shards)

    def identity(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.IDENTITY}

    def to_json(self) -> bytes:
        raw = dataclasses.asdict(self) | {"format": self.FORMAT, "version": self.VERSIONS[-1], "count": self.count}
        # A file recorded without its content (the state of an older pack, resumed) keeps no null keys.
        raw["shards"] = [{k: v for k, v in shard.items() if v is not None} for shard in raw["shards"]]
        return json.dumps({key: raw[key] for key in self.KEYS}, indent=1).encode()

    @classmethod
    def read(cls: type[StateT], path: Path) -> StateT:
        """The state in ``path`` (a progress file or a manifest); FormatError naming it when unreadable."""
        try:
            size = path.stat().st_size
            if size > MAX_STATE_BYTES:
                raise ValueError(f"{size:,} bytes, more than the {MAX_STATE_BYTES:,} a pack's state may take")
            raw = json_text.loads(path.read_bytes(), str(path))  # bounded nesting: never a RecursionError
            if raw.get("format") != cls.FORMAT or raw.get("version") not in cls.VERSIONS:
                raise ValueError(
                    f"format {raw.get('format')!r} v{raw.get('version')}, expected {cls.FORMAT!r} "
                    f"v{' or v'.join(map(str, cls.VERSIONS))} (written by a newer fastloader?)"
                )
            written_count = raw.pop("count", None)
            for written_only in ("format", "version"):
                raw.pop(written_only, None)
            raw["shards"] = tuple(ShardRecord(**shard) for shard in raw["shards"])
            raw["skipped"] = tuple(BadSample(**item) for item in raw["skipped"])
            state = cls(**cls._decode(raw))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise FormatError(f"{path}: unreadable {cls.WHAT} pack state ({error})") from None
        _check_positions(state, path)
        if written_count is not None and written_count != state.count:
            raise FormatError(f"{path}: count {written_count!r}, but its shards hold {state.count} samples")
        return state

    @classmethod
    def _decode(cls, raw: dict[str, Any]) -> dict[str, Any]:
        """The format's own keys of ``raw``, as its fields hold them (ValueError when they are wrong)."""
        return raw

    @classmethod
    def found_in(cls, directory: str | os.PathLike[str]) -> bool:
        """True when ``directory`` holds a (possibly unfinished) pack of this format."""
        return any((Path(directory) / name).exists() for name in (cls.MANIFEST_NAME, cls.PROGRESS_NAME))

    @classmethod
    def read_manifest(cls: type[StateT], directory: str | os.PathLike[str]) -> StateT:
        """The manifest of a finished pack in ``directory``; FormatError naming it when the pack is unfinished."""
        manifest = Path(directory) / cls.MANIFEST_NAME
        if not manifest.exists():
            started = (Path(directory) / cls.PROGRESS_NAME).exists()
            raise FormatError(
                f"{directory}: incomplete pack: no {cls.MANIFEST_NAME} "
                + ("(the pack was interrupted or is still running; run it again to finish)" if started else "found")
            )
        state = cls.read(manifest)
        if not state.complete:
            raise FormatError(f"{manifest}: incomplete pack (not marked complete)")
        return state


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(char in "0123456789abcdef" for char in value)


def _check_positions(state: PackState, path: Path) -> None:
    """Refuse a state whose shards and skipped items do not account for each position once (module doc)."""
    if not _is_count(state.position):
        raise FormatError(f"{path}: bad position {state.position!r}")
    skipped = [item.position for item in state.skipped]
    increasing = all(_is_count(p) for p in skipped) and all(a < b for a, b in zip(skipped, skipped[1:]))
    if not increasing or (skipped and skipped[-1] >= state.position):
        raise FormatError(f"{path}: the skipped positions do not strictly increase within 0..{state.position - 1}")
    start, seen = 0, set()
    for shard in state.shards:
        where = f"{path}: shard {shard.name!r}"
        if not isinstance(shard.name, str) or "/" in shard.name or shard.name.startswith("."):
            raise FormatError(f"{path}: bad file name {shard.name!r}")  # the state only ever names files beside it
        if shard.name in seen:
            raise FormatError(f"{where} is listed twice")
        seen.add(shard.name)
        if not _is_count(shard.count):
            raise FormatError(f"{where}: bad count {shard.count!r}")
        if (shard.size is None) != (shard.sha256 is None) or not (shard.size is None or _is_count(shard.size)):
            raise FormatError(f"{where}: bad size {shard.size!r} or sha256 {shard.sha256!r}")
        if shard.sha256 is not None and not _is_sha256(shard.sha256):
            raise FormatError(f"{where}: bad sha256 {shard.sha256!r}")
        end = shard.end_position
        if not _is_count(end) or not start < end <= state.position:
            raise FormatError(
                f"{where}: end_position {end!r} is not after the previous shard's ({start}) and within the "
                f"pack's position ({state.position})"
            )
        skipped_here = bisect.bisect_left(skipped, end) - bisect.bisect_left(skipped, start)
        if shard.count != end - start - skipped_here:
            raise FormatError(
                f"{where}: count {shard.count}, but it covers positions {start}..{end - 1} of which "
                f"{skipped_here} are skipped ({end - start - skipped_here} samples)"
            )
        start = end
    if state.position - start != len(skipped) - bisect.bisect_left(skipped, start):
        raise FormatError(
            f"{path}: positions {start}..{state.position - 1} are neither in a shard nor all skipped "
            f"(position {state.position}, {state.count} samples in the shards, {len(skipped)} skipped)"
        )
