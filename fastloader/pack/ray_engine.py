"""``fastloader pack SRC DST --engine ray``: the local engine's work, spread over a Ray cluster by Ray Data::

    this process, the driver                           Ray Data tasks (ray_shard.py), one per shard
    open SRC; plan shards of ``shard_size`` source  ─►  read, check, re-encode positions i*S .. (i+1)*S-1
    positions; put the source in the object store      (readers.py), write them with the local engine's
                                                        sink into one shard, publish it under its name
    record each shard done as its result arrives    ◄─  its files, counts and skipped items
    every shard done: the manifest, last (the commit point; see ray_job.py)

``pip install fastloader[ray]`` on every node; each node must read SRC at the same path (a shared file
system) or from ``s3://``, and write DST at the same path (a shared file system), or upload to an
``s3://`` DST with its own credentials (only the driver writes the manifest). ``ray_address``: ``auto``
(a cluster on this machine), ``HOST:PORT`` of its head, or None: ``RAY_ADDRESS``, else a new Ray on this
machine. A Ray connection already open in this process (``ray.init`` with your own ``runtime_env``) is used.

**The same samples as the local engine.** Tasks run the local engine's own per-item code and sinks, so for
the same source and options the keys, labels, fields and image bytes are the same, and so is their order:
shard ``i`` holds the samples of source positions ``i*S .. (i+1)*S - 1`` in order. What differs with skipped
items is where shards end: a local pack's shards hold ``shard_size`` samples each, a Ray pack's
``shard_size`` source positions each, fewer samples when some are skipped. The manifest says so in its
``meta``: ``"engine": "ray"``, ``"order": "source"``, ``"shard_span": S``. An LMDB (one file, one writer) is
refused: pack tar shards or Parquet files.

**Faults lose nothing.** A task whose worker dies (SIGKILL, out of memory, a node lost) is retried by Ray
(``MAX_RETRIES`` times) and rewrites its shard under the same names, atomically; the driver records a shard
only once its result arrives. The driver killed, or a task failing (a full disk), the same command again
redoes only the shards not recorded (``ray_job.py``). A bad image is skipped with its key and reason, as
the local pack does (``DST.skipped.tsv``): one bad file never stops a job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from fastloader.datasets.base import Source
from fastloader.datasets.sources import open_source
from fastloader.fields.source import field_kinds
from fastloader.formats.pack_state import PackState
from fastloader.formats.tar_manifest import TarPackState
from fastloader.pack.local import check_options, pack_fingerprint
from fastloader.pack.ray_job import JOB_DIR, JobDir, check_local_destination, checked, commit_local, final_state
from fastloader.pack.ray_shard import ShardJob, ShardResult, run_task
from fastloader.pack.readers import ReencodeOptions
from fastloader.pack.sink import normalize_fingerprint
from fastloader.pack.summary import PackSummary, report_path, write_report
from fastloader.remote.url import S3Url, is_remote

MAX_RETRIES = 3  # per task, for a dead worker; an error raised by a task fails the job (run it again)
RAY_OUTPUTS = ("tar", "parquet")


def _import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as error:
        raise RuntimeError(f"--engine ray needs Ray Data ({error}): pip install fastloader[ray]") from error
    return ray


def _check_output(dst: str, format: str | None, workers: int | None) -> str:
    output = format or "tar"
    if output == "lmdb":
        raise ValueError(
            f"{dst}: --engine ray writes tar shards (--format tar) or Parquet files (--format parquet); an LMDB is "
            "one file with a single writer, which tasks on many machines cannot share (pack it with --engine local)"
        )
    if output not in RAY_OUTPUTS:
        raise ValueError(f"format must be one of {', '.join(RAY_OUTPUTS)} with --engine ray, got {output!r}")
    if is_remote(dst) and output != "tar":
        raise ValueError(f"{dst}: packs to S3 are tar shards (--format tar); {output!r} packs go to a file system")
    if workers is not None:
        raise ValueError("workers is for --engine local: --engine ray runs one task per CPU of the Ray cluster")
    return output


@contextlib.contextmanager
def _connected(address: str | None) -> Iterator[Any]:
    """Ray, connected to ``address`` (see the module docstring) for the duration; an open connection is kept."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _run(ray: Any, job: ShardJob, todo: list[int], record: Any) -> list[str]:
    """Run the tasks of shards ``todo`` on Ray Data, calling ``record(result)`` as each finishes; the errors
    of those that failed."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # ours is the bar (Ray's would print one per operator)
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled"
    items = ray.data.from_items([{"index": index} for index in todo], override_num_blocks=len(todo))
    with warnings.catch_warnings():
        # Ray 2.60 (pinned) names no parameter for a task's retries; its ray_remote_args are deprecated for 2.64.
        warnings.simplefilter("ignore", ray.util.annotations.RayDeprecationWarning)
        results = items.map(run_task, fn_kwargs={"job": job}, num_cpus=1, max_retries=MAX_RETRIES)
    errors = []
    for row in results.iter_rows():
        if row["error"]:
            errors.append(str(row["error"]))
        else:
            record(ShardResult.from_json(row["result"], "a Ray task's result"))
    return errors


def _job_dir(dst: str) -> JobDir:
    if is_remote(dst):
        from fastloader.pack.remote import staging_dir

        staging = staging_dir(S3Url.parse(dst))
        return JobDir(staging.with_name(f"{staging.name}-ray"))
    return JobDir(Path(dst) / JOB_DIR)


class _Progress:
    """The driver's bar and tally: shards recorded as they arrive."""

    def __init__(self, job: ShardJob, job_dir: JobDir, done: dict[int, ShardResult], show: bool) -> None:
        from tqdm import tqdm

        self.job, self.job_dir, self.results = job, job_dir, dict(done)
        self.before = sum(len(job.positions(index)) for index in done)
        self.now: list[ShardResult] = []
        name = os.path.basename(job.dst.rstrip("/"))
        desc = f"pack {name} (ray)"
        self.bar = tqdm(total=job.total, initial=self.before, unit="img", desc=desc, disable=not show, file=sys.stderr)
        self.bar.set_postfix(shards=f"{len(done)}/{job.shards}", refresh=False)

    def record(self, result: ShardResult) -> None:
        self.job_dir.record(result)
        self.results[result.index] = result
        self.now.append(result)
        self.bar.set_postfix(
            shards=f"{len(self.results)}/{self.job.shards}",
            skipped=sum(len(r.skipped) for r in self.results.values()),
            refresh=False,
        )
        self.bar.update(len(self.job.positions(result.index)))


def _commit(
    job: ShardJob, job_dir: JobDir, results: dict[int, ShardResult], classes: list[str] | None, meta: dict[str, Any]
) -> PackState:
    state = checked(final_state(job, results, classes, meta), job_dir)
    if is_remote(job.dst):
        from fastloader.pack.remote import publish, published
        from fastloader.remote.s3 import S3Store

        url, store = S3Url.parse(job.dst), S3Store()
        there, previous = published(url, store)
        publish(cast(TarPackState, state), url, store, there, previous)  # s3:// packs are tar (_check_output)
    else:
        commit_local(Path(job.dst), job.output, state)
    return state


def _report(job: ShardJob, job_dir: JobDir, state: PackState) -> str | None:
    """Write the list of skipped items beside the pack (``DST.skipped.tsv``; ``skipped.tsv`` under an s3:// DST)."""
    if not state.skipped:
        return None
    if not is_remote(job.dst):
        write_report(report_path(job.dst), list(state.skipped))
        return report_path(job.dst)
    from fastloader.remote.s3 import S3Store

    local, target = job_dir.path / "skipped.tsv", S3Url.parse(job.dst).child("skipped.tsv")
    write_report(str(local), list(state.skipped))
    S3Store().upload(str(local), target)
    return str(target)


def _open(
    src: str | os.PathLike[str] | Source, src_format: str, root: str | None, confine: bool
) -> tuple[Source, str, str]:
    if isinstance(src, Source):
        return src, type(src).__name__, type(src).__name__
    source, kind = open_source(os.fspath(src), src_format, root=root, confine=confine)
    return source, kind, os.fspath(src)


def _plan(
    source: Source, kind: str, dst: str, output: str, options: ReencodeOptions, shard_size: int
) -> tuple[ShardJob, JobDir, PackState | None]:
    """The job (its source not yet put), its directory, and the finished pack when ``dst`` holds it already."""
    fields = field_kinds(source)
    fingerprint = pack_fingerprint(source, kind, output, options, shard_size, fields)
    fingerprint = normalize_fingerprint({**fingerprint, "engine": "ray"})  # its shards end elsewhere than a local's
    job_dir = _job_dir(dst)
    finished = None if is_remote(dst) else check_local_destination(Path(dst), output, fingerprint)
    created = 0 if finished is not None else job_dir.open(fingerprint, dst)
    job_id = hashlib.sha1(f"{os.path.abspath(job_dir.path)}:{created}".encode()).hexdigest()[:16]
    stage = None if is_remote(dst) else str(job_dir.stage)
    job = ShardJob(None, output, options, fields, fingerprint, created, shard_size, len(source), dst, stage, job_id)
    return job, job_dir, finished


def pack_on_ray(
    src: str | os.PathLike[str] | Source,
    dst: str,
    *,
    format: str | None,
    resize_max_side: int | None,
    quality: int | None,
    workers: int | None,
    progress: bool,
    src_format: str,
    root: str | None,
    confine: bool,
    shard_size: int,
    ray_address: str | None,
) -> PackSummary:
    """``pack(..., engine="ray")``: see the module docstring and :func:`fastloader.pack.engine.pack`."""
    output = _check_output(dst, format, workers)
    check_options(output, resize_max_side, quality, None)
    if not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size must be a positive integer, got {shard_size!r}")
    started = time.monotonic()
    source, kind, src_name = _open(src, src_format, root, confine)
    job, job_dir, finished = _plan(source, kind, dst, output, ReencodeOptions(resize_max_side, quality), shard_size)
    summary = PackSummary(src_name, dst, output, len(source), resumed_from=0, packed_now=0, engine="ray")
    if finished is not None:  # already complete: nothing to do
        job_dir.remove()
        return dataclasses.replace(
            summary, resumed_from=len(source), skipped=finished.skipped, elapsed_s=time.monotonic() - started,
            report_path=_report(job, job_dir, finished), shards=len(finished.shards), shards_now=0,
        )  # fmt: skip
    done = job_dir.done(job, None if job.stage is None else Path(dst))
    progress_ = _Progress(job, job_dir, done, progress)
    todo = [index for index in range(job.shards) if index not in done]
    with progress_.bar:
        if todo:  # else a run killed before its commit: only the commit is left
            with _connected(ray_address) as ray:
                _start_upload(job, job_dir)
                _run_or_explain(ray, dataclasses.replace(job, source=ray.put(source)), todo, progress_)
    classes = getattr(source, "classes", None)
    meta = {"source": src_name, "source_kind": kind, "engine": "ray", "order": "source", "shard_span": shard_size}
    state = _commit(job, job_dir, progress_.results, None if classes is None else list(classes), meta)
    report = _report(job, job_dir, state)
    job_dir.remove()
    return _summary(summary, progress_, state, report, time.monotonic() - started)


def _summary(
    summary: PackSummary, progress: _Progress, state: PackState, report: str | None, elapsed: float
) -> PackSummary:
    """``summary`` with the figures of a finished run: all of the pack's, and this run's shards."""
    now = progress.now
    return dataclasses.replace(
        summary,
        resumed_from=progress.before,
        packed_now=sum(result.packed for result in now),
        skipped=state.skipped,
        bytes_in=sum(result.bytes_in for result in now),
        bytes_out=sum(result.bytes_out for result in now),
        elapsed_s=elapsed,
        report_path=report,
        shards=len(state.shards),
        shards_now=sum(len(result.shards) for result in now),
    )


def _start_upload(job: ShardJob, job_dir: JobDir) -> None:
    """Before an s3:// pack's first shard: the marker readers take for an upload under way (``remote.py``)."""
    if not is_remote(job.dst):
        return
    from fastloader.pack.remote import mark_upload, published
    from fastloader.remote.s3 import S3Store

    url, store = S3Url.parse(job.dst), S3Store()
    _, previous = published(url, store)
    mark_upload(url, store, previous, (job_dir.path / "job.json").read_bytes())


def _run_or_explain(ray: Any, job: ShardJob, todo: list[int], progress: _Progress) -> None:
    """Run the shards; when some fail, or the job does, say what is kept and how to finish it."""
    try:
        errors = _run(ray, job, todo, progress.record)
    except Exception as error:  # Ray's: a task whose workers died MAX_RETRIES + 1 times, a lost cluster
        lines = [line for line in str(error).splitlines() if line.strip()]
        errors = [f"{type(error).__name__}: {lines[0] if lines else ''}"]
    if errors:
        raise RuntimeError(
            f"{job.dst}: the Ray pack stopped with {len(progress.results)} of {job.shards} shards done (kept); "
            f"{len(errors)} failed, the first: {errors[0]}. Run the same command again to pack the others."
        )
