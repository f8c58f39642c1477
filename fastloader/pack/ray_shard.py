"""One task of a Ray pack (``fastloader pack --engine ray``): a range of source positions into one shard.

Shard ``i`` of a job (:class:`ShardJob`, the same for every task) holds the source positions
``i * span .. min((i + 1) * span, total) - 1``, minus those skipped. A task reads, checks and re-encodes
each of them with the local engine's own code (``readers.prepare_item``, ``engine.hand_over``) into the
local engine's own sink (``TarShardSink`` / ``ParquetSink``), opened on a staging directory of the task's
own, so a shard becomes durable exactly as a local pack's do (written under a temporary name, fsynced,
renamed, indexed or its footer read back; a failed write poisons the sink and fails the task). The
staged sink numbers positions from the range's start (its state then obeys ``PackState``'s arithmetic
on its own); tar members are numbered from the range's first source position, so that names are unique
across the pack and, without skipped items, those of a local pack.

Then the shard is published under its final name, ``{prefix}-{i:06d}{suffix}`` (a Parquet range that an
array field's changing dtype cut in two adds ``{prefix}-{i:06d}_1{suffix}``, sorting between ``i`` and
``i + 1``): moved beside the manifest-to-be of a local or shared destination (the shard, then its index),
or uploaded to an ``s3://`` one content-named (``fastloader.pack.remote.upload_shard``). Nothing is
recorded here: the task returns a :class:`ShardResult` and the driver records the shard as done when it
arrives (``fastloader.pack.ray_engine``).

Idempotent: a retried task (its worker killed, its node lost, a driver run again) deletes what earlier
attempts of its shard staged, stages anew and writes the same bytes under the same names (the job fixes
every tar member's mtime), replacing whatever a killed attempt published: no shard is ever half there
once recorded, and none twice. Attempts at one shard run one after another: Ray retries a task once its
worker is dead, and ends the tasks of a driver that died (a run started while a dead driver's task was
still moving its files into place could pair a shard with the other attempt's index, which readers then
rebuild without the source keys).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastloader.datasets.base import Source
from fastloader.errors import FormatError
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.pack_state import PackState, ShardRecord
from fastloader.formats.parquet_pack import PART_PREFIX, ParquetPackState
from fastloader.formats.tar_manifest import TarPackState
from fastloader.formats.tar_shards import INDEX_SUFFIX
from fastloader.pack.local import Counts, hand_over
from fastloader.pack.readers import ReencodeOptions, prepare_item
from fastloader.pack.shard_sink import ShardedSink
from fastloader.storage import cache_dir

_PREFIX = {"tar": "shard", "parquet": PART_PREFIX}
_SUFFIX = {"tar": ".tar", "parquet": ".parquet"}
STATE_CLASSES: dict[str, type[PackState]] = {"tar": TarPackState, "parquet": ParquetPackState}


def data_file_pattern(output: str) -> re.Pattern[str]:
    """The names of a Ray pack's data files (see the module docstring)."""
    return re.compile(rf"{_PREFIX[output]}-\d+(_\d+)?{re.escape(_SUFFIX[output])}")


@dataclass(frozen=True)
class ShardJob:
    """What every task of one Ray pack shares."""

    source: Any  # a ray.ObjectRef to the Source (put once by the driver)
    output: str  # "tar" or "parquet"
    options: ReencodeOptions
    fields: dict[str, str]  # the source's field kinds (name -> kind)
    fingerprint: dict[str, Any]
    created: int  # the pack's creation time: every tar member's mtime
    span: int  # source positions per shard
    total: int  # items in the source
    dst: str  # the pack's directory, or its s3:// URL
    stage: str | None  # where tasks stage: beside a local pack (same file system), None: the node's cache
    job_id: str  # names a node-local staging directory

    @property
    def shards(self) -> int:
        return -(-self.total // self.span)

    def positions(self, index: int) -> range:
        if not 0 <= index < self.shards:
            raise ValueError(f"shard {index} is not one of the {self.shards} shards of {self.dst}")
        return range(index * self.span, min((index + 1) * self.span, self.total))

    def state_class(self) -> type[PackState]:
        return STATE_CLASSES[self.output]

    def prefix(self) -> str:
        return _PREFIX[self.output]

    def shard_name(self, index: int, part: int = 0) -> str:
        """The final name of part ``part`` of shard ``index`` (see the module docstring)."""
        return f"{self.prefix()}-{index:06d}{f'_{part}' if part else ''}{_SUFFIX[self.output]}"


@dataclass(frozen=True)
class ShardResult:
    """A shard written: its data files (final names, end positions in the source), skipped items, figures."""

    index: int
    shards: tuple[ShardRecord, ...]
    skipped: tuple[BadSample, ...]
    bytes_in: int = 0
    bytes_out: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "index": self.index,
                "shards": [[s.name, s.count, s.end_position, s.size, s.sha256, s.index_sha256] for s in self.shards],
                "skipped": [[s.position, s.key, s.reason] for s in self.skipped],
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> ShardResult:
        """The result in ``text``; FormatError naming ``where`` when it is not one."""
        try:
            raw = json.loads(text)
            result = cls(
                int(raw["index"]),
                tuple(ShardRecord(str(n), int(c), int(e), *rest) for n, c, e, *rest in raw["shards"]),
                tuple(BadSample(int(p), str(k), str(r)) for p, k, r in raw["skipped"]),
                int(raw["bytes_in"]),
                int(raw["bytes_out"]),
            )
        except (ValueError, TypeError, KeyError) as error:
            raise FormatError(f"{where}: unreadable shard record ({type(error).__name__}: {error})") from None
        return result

    @property
    def packed(self) -> int:
        return sum(shard.count for shard in self.shards)


_source_cache: tuple[str, Source] | None = None  # the last job's source, deserialised once per worker process


def _source(ref: Any) -> Source:
    global _source_cache
    import ray

    key = ref.hex()
    if _source_cache is None or _source_cache[0] != key:
        _source_cache = (key, ray.get(ref))
    return _source_cache[1]


def _stage_root(job: ShardJob) -> Path:
    return Path(job.stage) if job.stage is not None else cache_dir() / "ray-pack" / job.job_id


def _new_stage(job: ShardJob, index: int) -> Path:
    """A fresh staging directory for this attempt at shard ``index``; earlier attempts' are deleted."""
    root = _stage_root(job)
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(f"{index:06d}-*"):
        shutil.rmtree(old, ignore_errors=True)
    return root / f"{index:06d}-{uuid.uuid4().hex[:12]}"


def _open_sink(job: ShardJob, directory: Path, start: int) -> ShardedSink[Any, Any, Any]:
    sink: ShardedSink[Any, Any, Any]
    if job.output == "tar":
        from fastloader.pack.tar_sink import TarShardSink

        sink = TarShardSink(
            directory, job.fingerprint, shard_size=job.span, fields=job.fields, first_sample=start, created=job.created
        )
    else:
        from fastloader.pack.parquet_sink import ParquetSink

        sink = ParquetSink(directory, job.fingerprint, shard_size=job.span, fields=job.fields)
    return sink


def _stage(job: ShardJob, index: int, stage: Path) -> tuple[PackState, Counts]:
    """Pack the range of shard ``index`` into ``stage`` (positions from the range's start); its finished state."""
    source = _source(job.source)
    positions = job.positions(index)
    sink = _open_sink(job, stage, positions.start)
    counts = Counts()
    try:
        for position in positions:
            item = prepare_item(source, position, job.options, job.fields)
            hand_over(sink, item._replace(position=position - positions.start), counts)
        sink.finish(None, {})
    finally:
        sink.close()  # after finish: nothing to do
    return job.state_class().read_manifest(stage), counts


def _publish_local(job: ShardJob, stage: Path, staged: PackState, names: list[str]) -> None:
    """Move the staged files beside the manifest-to-be: each shard, then its index (never an index alone)."""
    dst = Path(job.dst)
    for record, name in zip(staged.shards, names):
        os.replace(stage / record.name, dst / name)
        if job.output == "tar":
            os.replace(stage / f"{record.name}{INDEX_SUFFIX}", dst / f"{name}{INDEX_SUFFIX}")
    fd = os.open(dst, os.O_RDONLY)  # the renames are durable before the driver records the shard
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _upload(job: ShardJob, stage: Path, staged: PackState, names: list[str]) -> list[str]:
    """Upload the staged shards to the job's s3:// destination; their content names."""
    from fastloader.pack.remote import upload_shard
    from fastloader.remote.s3 import S3Store
    from fastloader.remote.url import S3Url

    url, store = S3Url.parse(job.dst), S3Store()
    shards = zip(staged.shards, names)
    return [upload_shard(stage / record.name, name, url, store, None).name for record, name in shards]


def write_shard(job: ShardJob, index: int) -> ShardResult:
    """Pack shard ``index`` of ``job`` and publish it (see the module docstring)."""
    stage = _new_stage(job, index)
    try:
        staged, counts = _stage(job, index, stage)
        names = [job.shard_name(index, part) for part in range(len(staged.shards))]
        if job.stage is None:
            names = _upload(job, stage, staged, names)
        else:
            _publish_local(job, stage, staged, names)
    except Exception as error:
        positions = job.positions(index)
        raise RuntimeError(
            f"{job.dst}: shard {index} (source positions {positions.start}..{positions.stop - 1}) failed: "
            f"{type(error).__name__}: {error}"
        ) from error
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    start = job.positions(index).start
    return ShardResult(
        index,
        tuple(
            dataclasses.replace(r, name=name, end_position=r.end_position + start)
            for name, r in zip(names, staged.shards)
        ),
        tuple(BadSample(s.position + start, s.key, s.reason) for s in staged.skipped),
        counts.bytes_in,
        counts.bytes_out,
    )


def run_task(row: dict[str, Any], job: ShardJob) -> dict[str, Any]:
    """The Ray Data map function: ``{"index": i}`` -> ``{"result": ShardResult JSON, "error": ""}``, or the
    error that stopped the shard (a full disk, an unwritable destination) as ``{"result": "", "error": ...}``:
    returned, not raised, so that the other shards of the job still finish."""
    try:
        return {"result": write_shard(job, int(row["index"])).to_json(), "error": ""}
    except Exception as error:
        return {"result": "", "error": str(error)}
