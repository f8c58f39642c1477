"""The driver's record of a Ray pack (``fastloader pack --engine ray``), and its commit.

A pack in progress keeps, in its *job directory* (``DST/.fastloader-ray/`` beside a local or shared pack;
for an ``s3://`` DST a directory on the driver's disk, beside the local engine's S3 staging directories)::

    job.json            what is packed: the fingerprint and the creation time (every tar member's mtime)
    done/000003.json    shard 3 is done: its data files (final names, counts, end positions), skipped items
    stage/              the tasks' staging directories (local DST only: on the destination's file system)

A shard's done file is written (atomically) by the driver when the task's result arrives, after the task
made the shard's files durable under their final names: a done file never names a file that is not
whole. The same command run again after any kill finds ``job.json`` and submits only the shards with no
done file; one that is recorded but whose file is missing is an error naming it, never a silent gap.

The commit, once every shard is done: the manifest of the format (``TarPackState`` or
``ParquetPackState``, so ``PackState``'s arithmetic holds: each shard's count is its range's positions
minus those skipped, end positions strictly increase, a range whose items were all skipped has no file)
is written to the job directory and read back (which checks those numbers) before it is published, last:
moved beside the shards, or put to S3 (``fastloader.pack.remote.publish``). Data files of this pack's
name pattern that no done file names (an attempt killed after publishing, before its result arrived) are
deleted first. Then the job directory goes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from fastloader.errors import FormatError
from fastloader.formats.pack_state import PackState
from fastloader.formats.parquet_pack import ParquetPackState
from fastloader.formats.tar_manifest import TarPackState, field_members
from fastloader.formats.tar_shards import INDEX_SUFFIX
from fastloader.pack.ray_shard import STATE_CLASSES, ShardJob, ShardResult, data_file_pattern
from fastloader.pack.sink import normalize_fingerprint
from fastloader.storage import atomic_write_bytes

JOB_DIR = ".fastloader-ray"
JOB_FORMAT = "fastloader-ray-job"
JOB_VERSION = 1
_OTHER_PACKS = {
    **{name: state.WHAT for state in (TarPackState, ParquetPackState) for name in (state.MANIFEST_NAME,)},
    **{state.PROGRESS_NAME: f"unfinished {state.WHAT} (local engine)" for state in (TarPackState, ParquetPackState)},
    "data.mdb": "LMDB",
}


class JobDir:
    """A Ray pack's job directory (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def stage(self) -> Path:
        return self.path / "stage"

    def _done_path(self, index: int) -> Path:
        return self.path / "done" / f"{index:06d}.json"

    def open(self, fingerprint: dict[str, Any], where: str) -> int:
        """The creation time of the job recorded here (started now when there is none); FormatError when
        the job recorded is another pack (another source or options)."""
        path = self.path / "job.json"
        if not path.exists():
            created = int(time.time())
            (self.path / "done").mkdir(parents=True, exist_ok=True)
            record = {"format": JOB_FORMAT, "version": JOB_VERSION, "fingerprint": fingerprint, "created": created}
            atomic_write_bytes(path, json.dumps(record, indent=1).encode())
            return created
        try:
            raw = json.loads(path.read_bytes())
            if raw.get("format") != JOB_FORMAT or raw.get("version") != JOB_VERSION:
                raise ValueError(f"format {raw.get('format')!r} v{raw.get('version')}, expected {JOB_FORMAT!r}")
            recorded, created = normalize_fingerprint(raw["fingerprint"]), int(raw["created"])
        except (ValueError, TypeError, KeyError) as error:
            raise FormatError(f"{path}: unreadable Ray pack job ({error})") from None
        if recorded != fingerprint:
            raise FormatError(
                f"{where}: holds an unfinished Ray pack of another source or options (fingerprint {recorded!r}); "
                f"run that pack again to finish it, or pack into a new destination"
            )
        return created

    def done(self, job: ShardJob, dst: Path | None) -> dict[int, ShardResult]:
        """The shards recorded as done, by number, each checked against the job (and, in a local ``dst``,
        its files there)."""
        results = {}
        for path in sorted((self.path / "done").glob("*.json")):
            result = ShardResult.from_json(path.read_bytes(), str(path))
            positions = job.positions(result.index)
            ends = [shard.end_position for shard in result.shards]
            skipped = [item.position for item in result.skipped]
            if path.name != f"{result.index:06d}.json" or any(not positions.start < e <= positions.stop for e in ends):
                raise FormatError(f"{path}: a shard record that is not of shard {path.stem} of this pack")
            if any(p not in positions for p in skipped) or result.packed + len(skipped) != len(positions):
                raise FormatError(f"{path}: its samples and skipped items do not cover positions {positions}")
            missing = [shard.name for shard in result.shards if dst is not None and not (dst / shard.name).is_file()]
            if missing:
                raise FormatError(f"{dst}: file {missing[0]} is recorded as complete ({path}) but missing")
            results[result.index] = result
        return results

    def record(self, result: ShardResult) -> None:
        atomic_write_bytes(self._done_path(result.index), result.to_json().encode())

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def check_local_destination(dst: Path, output: str, fingerprint: dict[str, Any]) -> PackState | None:
    """The finished Ray pack of this fingerprint at ``dst`` (None: none yet); FormatError when ``dst`` holds
    anything else: another pack, or data files no Ray job of this pack recorded."""
    state_class = STATE_CLASSES[output]
    if dst.exists() and not dst.is_dir():
        raise FormatError(f"{dst}: exists and is not a directory")
    if (dst / state_class.MANIFEST_NAME).exists():
        state = state_class.read_manifest(dst)
        if normalize_fingerprint(state.fingerprint) != fingerprint:
            described = json.dumps(state.fingerprint, sort_keys=True)
            raise FormatError(f"{dst}: holds a different pack (fingerprint {described}); pack into a new directory")
        return state
    for name, what in _OTHER_PACKS.items():
        if (dst / name).exists():
            raise FormatError(f"{dst}: holds a {what} pack; pack into a new directory")
    pattern = data_file_pattern(output)
    if dst.is_dir() and not (dst / JOB_DIR / "job.json").exists() and any(map(pattern.fullmatch, os.listdir(dst))):
        raise FormatError(
            f"{dst}: holds data files that no fastloader pack recorded; refusing to overwrite them (pack into an "
            "empty directory)"
        )
    return None


def final_state(
    job: ShardJob, results: dict[int, ShardResult], classes: list[str] | None, meta: dict[str, Any]
) -> PackState:
    """The manifest of a finished Ray pack: every shard's files and skipped items, in shard order."""
    ordered = [results[index] for index in range(job.shards)]
    common: dict[str, Any] = {
        "fingerprint": job.fingerprint,
        "created": job.created,
        "position": job.total,
        "shards": tuple(shard for result in ordered for shard in result.shards),
        "skipped": tuple(item for result in ordered for item in result.skipped),
        "complete": True,
        "classes": classes,
        "meta": meta,
    }
    if job.output == "tar":
        return TarPackState(prefix=job.prefix(), fields=field_members(job.fields), **common)
    return ParquetPackState(fields=dict(job.fields), **common)


def checked(state: PackState, job_dir: JobDir) -> PackState:
    """``state`` written to the job directory and read back: its numbers agree (``PackState.read``)."""
    path = job_dir.path / "manifest.json"
    atomic_write_bytes(path, state.to_json())
    return type(state).read(path)


def commit_local(dst: Path, output: str, state: PackState) -> None:
    """Delete this pack's unrecorded data files, then write its manifest: the commit point."""
    recorded, pattern = {shard.name for shard in state.shards}, data_file_pattern(output)
    for name in sorted(os.listdir(dst)):
        if pattern.fullmatch(name) and name not in recorded:
            (dst / f"{name}{INDEX_SUFFIX}").unlink(missing_ok=True)  # the index first: never one without its shard
            (dst / name).unlink()
    atomic_write_bytes(dst / state.MANIFEST_NAME, state.to_json())
