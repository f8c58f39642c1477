"""The ``fastloader`` command line: ``info``, ``pack``, ``verify``, ``scan``, ``doctor``, ``bench`` and ``ledger``.

    fastloader info                 what is active: torch, CUDA, PIL flavour, libjpeg, CPUs
    fastloader pack SRC DST         pack images into an LMDB, tar shards or Parquet files (resumable)
    fastloader verify DST           check every record of a pack (--expect-digest HEX: against a pinned digest)
    fastloader digest PACK          the content digest of a pack, to pin
    fastloader fields SRC           what the samples carry besides the image and label (for fields=)
    fastloader scan SRC             decode every image of a dataset and list the bad ones
    fastloader doctor PATH          where the time goes on your data: the slowest stage, and what to do
    fastloader bench PATH           torch's DataLoader against DataLoaderX on your data, as a ratio
    fastloader ledger diff A B      did two runs' training loops see the same samples (DataLoaderX(ledger=))
    fastloader ledger show A        a ledger's samples per rank and epoch

Exit status: 0 on success, 1 when the command failed (an error, ``verify`` found problems, or the ledgers
``ledger diff`` compares differ), 2 for bad usage, 130 when interrupted (a pack then resumes when run again).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

_PACK_EPILOG = """\
sources (SRC, guessed unless --src-format is given):
  an image folder (one sub-folder per class)   train/
  a file list ("path label" lines, or a CSV)   train.txt, train.csv (--root: base of relative paths)
  MXNet RecordIO (.idx beside it)              train.rec
  TFRecord files                               'train-*.tfrecord'
  WebDataset-style tar shards                  'train-{000000..000099}.tar'
  Parquet files (Hugging Face image datasets)  'data/train-*.parquet', or their directory (images stored
                                               by path: relative to the current directory, or --root)
  a fastloader LMDB (to re-encode it)          train.lmdb

Exit status 1 when the pack holds nothing, or skipped more than --max-skipped of the source (default 10%):
the pack is kept, and DST.skipped.tsv names each skipped item and why.

Resumable: killed at any moment (even SIGKILL), the same command run again continues where the
last one stopped, with no image lost or duplicated. Bad images (unreadable, empty, undecodable)
never stop a pack: they are skipped, counted in the summary and listed in DST.skipped.tsv.
Check the result with `fastloader verify DST`.

One run at a time per DST: a second run into it fails at once, naming the run that holds its lock
(DST.pack.lock: pid, host, since when). A lock left by a killed run on this host is taken over; one
of another host only with --break-lock. DST may not be SRC, be inside it or hold it.

On a Ray cluster: --engine ray [--ray-address auto|HOST:PORT] packs tar shards (default) or Parquet
files, one Ray Data task per shard; every node must read SRC and write DST at the same paths (or s3://).
"""


# A pack that lost more than 10% of its source exits 1: that many bad files is a broken copy, a wrong
# --src-format or a moved --root more often than a dataset's bad images, and a script must not train on it
# unawares. Not lower: a small set with one bad image (1 in 20 is common in tests and samples) still packs.
DEFAULT_MAX_SKIPPED = 0.1

# One --root for every command that reads a source: the base of the relative paths it names.
_ROOT_HELP = "base directory of relative paths: a file list's, or a Parquet file's images stored by path"
# For data you did not make: its links, ../ and absolute paths could point the reader at any file you can read.
_CONFINE_HELP = (
    "read nothing from outside the folder or the file list's root: a sample whose real path (symbolic links"
    " resolved) leaves it is skipped, named with where it points"
)


# argparse names a type function in its message when it raises ValueError ("invalid _positive value"):
# each one raises ArgumentTypeError instead, whose text is shown as is.
def _number(text: str, kind: type[int] | type[float], what: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def _positive(text: str) -> int:
    value = int(_number(text, int, "a positive integer"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(_number(text, int, "an integer, 0 or more"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _share(text: str) -> float:
    value = _number(text, float, "a share from 0 to 1")
    if not 0 <= value <= 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a share from 0 to 1, got {text}")
    return value


def _quality(text: str) -> int:
    value = int(_number(text, int, "an integer from 1 to 100"))
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be from 1 to 100, got {text}")
    return value


def _cmd_info(args: argparse.Namespace) -> int:
    from fastloader import info

    report = info.collect()
    print(json.dumps(report, indent=2) if args.json else info.format_report(report))
    warning = info.gpu_jpeg_decoder()[1]
    if warning is not None:  # on stderr too: a setting that only fails once a GPU run starts is said now
        print(f"fastloader info: warning: {warning}", file=sys.stderr)
    return 0


def _cmd_pack(args: argparse.Namespace) -> int:
    from fastloader.pack.engine import pack

    summary = pack(
        args.src,
        args.dst,
        format=args.format,
        resize_max_side=args.resize_max_side,
        quality=args.quality,
        workers=args.workers,
        progress=not args.no_progress,
        src_format=args.src_format,
        root=args.root,
        confine=args.confine,
        shard_size=args.shard_size,
        commit_every=args.commit_every,
        engine=args.engine,
        ray_address=args.ray_address,
        break_lock=args.break_lock,
    )
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.format_text())
    shortfall = summary.shortfall(args.max_skipped)
    if shortfall is not None:  # the pack is kept (and resumable); a script must not go on as if it were whole
        print(f"fastloader pack: error: {shortfall}", file=sys.stderr)
        return 1
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from fastloader.pack.verify import verify

    report = verify(args.dst, progress=not args.no_progress, expect_digest=args.expect_digest)
    if args.json:
        print(json.dumps({**vars(report), "ok": report.ok}, indent=2))
    else:
        print(report.format_text(limit=args.show))
    return 0 if report.ok else 1


def _cmd_digest(args: argparse.Namespace) -> int:
    from fastloader.pack.content_digest import pack_digest

    print(pack_digest(args.dst))
    return 0


def _cmd_fields(args: argparse.Namespace) -> int:
    from fastloader.datasets.sources import open_source
    from fastloader.fields.listing import describe, format_text

    source, _ = open_source(args.src, args.src_format, root=args.root)
    report = describe(source, args.items)
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0


def _cmd_scan(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from fastloader.pack.scan import scan

    report = scan(
        args.src,
        report=args.report,
        workers=args.workers,
        progress=not args.no_progress,
        src_format=args.src_format,
        root=args.root,
        confine=args.confine,
    )
    if args.json:
        print(json.dumps({**asdict(report), "by_reason": report.by_reason()}, indent=2))
    else:
        print(report.format_text())
    return 0


def _non_negative_float(text: str) -> float:
    value = _number(text, float, "a number, 0 or more")
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _number(text, float, "a number above 0")
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _cmd_bench(args: argparse.Namespace) -> int:
    from fastloader.doctor.bench import bench, format_text

    result = bench(
        args.path,
        src_format=args.src_format,
        root=args.root,
        batch_size=args.batch_size,
        num_workers=args.workers,
        pipeline=args.pipeline,
        batches=args.batches,
        repeats=args.repeats,
        step_ms=args.step_ms,
    )
    print(json.dumps(result, indent=2) if args.json else format_text(result))
    return 0


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    bench = commands.add_parser(
        "bench",
        allow_abbrev=False,
        help="torch's DataLoader against DataLoaderX on your data, as a ratio",
        description="Load PATH (any source `pack` reads) with torch's stock pipeline (torchvision transforms,"
        " ToTensor, Normalize, torch's DataLoader) and with DataLoaderX (the same geometry, normalize=), the"
        " same batch size, workers and order, runs alternated, medians; print images/s and the ratio.",
    )
    _add_pipeline_arguments(bench, "simulated training step per batch (default 0: the loaders' own rate)")
    bench.add_argument("--workers", type=_non_negative, metavar="N", help="worker processes (default: usable cores)")
    bench.add_argument("--batches", type=_positive, default=20, metavar="N", help="timed batches per run (default 20)")
    bench.add_argument("--repeats", type=_positive, default=2, metavar="N", help="runs of each loader (default 2)")
    bench.add_argument("--json", action="store_true", help="print the result as JSON")
    bench.set_defaults(run=_cmd_bench)


def _add_scan(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fastloader.datasets.sources import SOURCE_KINDS

    scan = commands.add_parser(
        "scan",
        allow_abbrev=False,
        help="decode every image of a dataset and list the bad ones",
        description="Decode every image of SRC (any source `pack` reads) and list those that fail, by reason.",
    )
    scan.add_argument("src", metavar="SRC", help="what to read (as for `fastloader pack`)")
    scan.add_argument(
        "--report",
        metavar="FILE",
        help="where to list bad images (default: in the cache dir, never beside SRC)",
    )
    scan.add_argument("--workers", type=_non_negative, metavar="N", help="reader processes (default: usable cores)")
    scan.add_argument("--src-format", default="auto", choices=("auto", *SOURCE_KINDS), help="how to read SRC")
    scan.add_argument("--root", metavar="DIR", help=_ROOT_HELP)
    scan.add_argument("--confine", action="store_true", help=_CONFINE_HELP)
    scan.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    scan.add_argument("--json", action="store_true", help="print the report as JSON")
    scan.set_defaults(run=_cmd_scan)


def _add_pack(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fastloader.datasets.sources import SOURCE_KINDS
    from fastloader.pack.readers import DEFAULT_QUALITY

    pack = commands.add_parser(
        "pack",
        allow_abbrev=False,
        help="pack images into an LMDB, tar shards or Parquet files (resumable)",
        description="Pack the images of SRC into DST: a fastloader LMDB (default), WebDataset tar shards or"
        " Parquet files.",
        epilog=_PACK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pack.add_argument("src", metavar="SRC", help="what to read (see sources below)")
    pack.add_argument(
        "dst",
        metavar="DST",
        help="the output directory (created; an unfinished one is resumed), or s3://bucket/prefix (tar shards)",
    )
    pack.add_argument(
        "--format",
        choices=("lmdb", "tar", "parquet"),
        help="output format (default: lmdb; tar for an s3:// destination or --engine ray)",
    )
    pack.add_argument(
        "--resize-max-side",
        type=_positive,
        metavar="N",
        help="shrink images whose longer side exceeds N pixels to N (never upscales) and re-encode them as "
        "JPEG: decoding then costs less at training time",
    )
    pack.add_argument(
        "--quality",
        type=_quality,
        metavar="Q",
        help=f"re-encode every image as a JPEG of quality Q (1-100; default {DEFAULT_QUALITY} for resized images)",
    )
    pack.add_argument(
        "--workers", type=_non_negative, metavar="N", help="reader processes (default: the usable CPU cores)"
    )
    pack.add_argument("--src-format", choices=("auto", *SOURCE_KINDS), default="auto", help="how to read SRC")
    pack.add_argument("--root", metavar="DIR", help=_ROOT_HELP)
    pack.add_argument("--confine", action="store_true", help=_CONFINE_HELP)
    pack.add_argument(
        "--shard-size", type=_positive, default=10000, metavar="N", help="images per tar shard or Parquet file"
    )
    pack.add_argument(
        "--commit-every", type=_positive, default=256, metavar="N", help="images per LMDB transaction (default 256)"
    )
    pack.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: reader processes on this machine (default); ray: tasks on a Ray cluster (tar or parquet,"
        " pip install fastloader[ray])",
    )
    pack.add_argument(
        "--ray-address",
        metavar="auto|HOST:PORT",
        help="the Ray cluster of --engine ray (default: RAY_ADDRESS, else a new local one)",
    )
    pack.add_argument(
        "--break-lock",
        action="store_true",
        help="take over DST's lock held by a pack on another host (only when that run is known to be gone)",
    )
    pack.add_argument(
        "--max-skipped",
        type=_share,
        default=DEFAULT_MAX_SKIPPED,
        metavar="SHARE",
        help=f"exit 1 when more than this share of the source was skipped (default {DEFAULT_MAX_SKIPPED:g}: 10%%;"
        " 1 accepts any share); a pack that holds nothing always exits 1",
    )
    pack.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    pack.add_argument("--json", action="store_true", help="print the summary as JSON")
    pack.set_defaults(run=_cmd_pack)


def _workers_or_auto(text: str) -> int | str:
    if text == "auto":
        return "auto"
    value = int(_number(text, int, "a number of workers (0 or more) or auto"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, or auto, got {text}")
    return value


def _add_pipeline_arguments(parser: argparse.ArgumentParser, step_help: str) -> None:
    """What `doctor` and `bench` share: the dataset, and the pipeline run over it."""
    from fastloader.datasets.sources import SOURCE_KINDS
    from fastloader.doctor.pipelines import PIPELINES

    parser.add_argument("path", metavar="PATH", help="the dataset (any SRC of `fastloader pack`)")
    parser.add_argument("--src-format", default="auto", choices=("auto", *SOURCE_KINDS), help="how to read PATH")
    parser.add_argument("--root", metavar="DIR", help=_ROOT_HELP)
    parser.add_argument("--batch-size", type=_positive, default=64, metavar="N", help="images per batch (default 64)")
    parser.add_argument(
        "--pipeline",
        choices=PIPELINES,
        default="train",
        help="train: RandomResizedCrop(224) + flip (default); eval: Resize(256) + CenterCrop(224)",
    )
    parser.add_argument("--step-ms", type=_non_negative_float, default=0.0, metavar="MS", help=step_help)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from fastloader.doctor.checkup import checkup, format_text

    result = checkup(
        args.path,
        src_format=args.src_format,
        root=args.root,
        batch_size=args.batch_size,
        num_workers=args.workers,
        transform=args.pipeline,
        decode_on=args.decode_on,
        step_ms=args.step_ms,
        batches=args.batches,
        seconds=args.seconds,
        storage=not args.no_storage,
        progress=not args.no_progress,
    )
    if args.report:
        from fastloader.doctor.report_html import write_report

        write_report(result, args.report)
    print(json.dumps(result, indent=2) if args.json else format_text(result))
    if args.report and not args.json:
        print(f"report: {args.report}")
    return 0


def _cmd_ledger_diff(args: argparse.Namespace) -> int:
    from fastloader.ledger import diff_ledgers, read_ledger

    a, b = read_ledger(args.a), read_ledger(args.b)
    for side, ledger in (("A", a), ("B", b)):
        for note in ledger.notes:
            print(f"fastloader ledger: {side}: {note}", file=sys.stderr)
    diff = diff_ledgers(a, b)
    print(diff)
    return 0 if diff.same else 1


def _cmd_ledger_show(args: argparse.Namespace) -> int:
    from fastloader.ledger import read_ledger, summary

    ledger = read_ledger(args.a)
    for note in ledger.notes:
        print(f"fastloader ledger: {note}", file=sys.stderr)
    for line in summary(ledger):
        print(line)
    return 0


def _add_ledger(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ledger = commands.add_parser(
        "ledger",
        allow_abbrev=False,
        help="compare what two runs' training loops received (DataLoaderX(ledger=PATH))",
        description="Read the delivery ledgers DataLoaderX(ledger=PATH) writes: per rank and epoch, every sample"
        " the training loop received, in order, with a digest of its bytes. PATH as given to ledger= (with"
        " {rank}, or PATH and PATH.rank<r>).",
    )
    actions = ledger.add_subparsers(dest="action", required=True, metavar="ACTION")
    diff = actions.add_parser(
        "diff",
        allow_abbrev=False,
        help="whether two runs saw the same samples, in the same order, with the same bytes",
        description="Compare two ledgers rank by rank and epoch by epoch (a resumed run's replayed as the"
        " training saw it). Exits 0 when they match; 1 naming the rank, epoch, position and kind of the first"
        " difference (missing, doubled, reordered, other bytes).",
    )
    diff.add_argument("a", metavar="A", help="a ledger (the ledger= path of one run)")
    diff.add_argument("b", metavar="B", help="the ledger to compare it with")
    diff.set_defaults(run=_cmd_ledger_diff)
    show = actions.add_parser(
        "show",
        allow_abbrev=False,
        help="samples per rank and epoch",
        description="Print a ledger's samples per rank and epoch.",
    )
    show.add_argument("a", metavar="A", help="a ledger (the ledger= path of a run)")
    show.set_defaults(run=_cmd_ledger_show)


def _add_doctor(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    doctor = commands.add_parser(
        "doctor",
        allow_abbrev=False,
        help="measure a pipeline on a dataset and name its bottleneck",
        description="Run DataLoaderX over PATH (any dataset `pack` reads) with this pipeline and say where the"
        " time goes: storage, read, decode, transform, collate, hand-off, copy; CPU per core, memory, GPU;"
        " the machine's traps; then the verdict and what to do.",
    )
    _add_pipeline_arguments(doctor, "your training step per batch, simulated (default 0: the loader alone)")
    doctor.add_argument(
        "--workers", type=_workers_or_auto, default="auto", metavar="N", help="num_workers, or auto (default)"
    )
    doctor.add_argument("--decode-on", choices=("cpu", "cuda"), default="cpu", help="where JPEGs are decoded")
    doctor.add_argument("--batches", type=_positive, default=60, metavar="N", help="batches to measure (default 60)")
    doctor.add_argument(
        "--seconds", type=_positive_float, default=60.0, metavar="S", help="at most this long (default 60)"
    )
    doctor.add_argument("--no-storage", action="store_true", help="skip the storage read test")
    doctor.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    doctor.add_argument("--report", metavar="FILE", help="also write a self-contained HTML report")
    doctor.add_argument("--json", action="store_true", help="print the result as JSON")
    doctor.set_defaults(run=_cmd_doctor)


def build_parser() -> argparse.ArgumentParser:
    from fastloader.version import __version__

    # No abbreviations: `--worker 2` would silently be `--workers 2`, and a flag added later could turn a
    # working abbreviation into an ambiguous one.
    parser = argparse.ArgumentParser(
        prog="fastloader", description="Fast data loading for PyTorch.", allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"fastloader {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser(
        "info", allow_abbrev=False, help="print what is active: torch, CUDA, PIL flavour, libjpeg, CPUs"
    )
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    info.set_defaults(run=_cmd_info)
    _add_pack(commands)
    _add_scan(commands)
    _add_doctor(commands)
    _add_bench(commands)
    _add_ledger(commands)
    verify = commands.add_parser(
        "verify",
        allow_abbrev=False,
        help="check every record of a pack (checksums, count)",
        description="Check every record of DST (a fastloader LMDB, or a pack of tar shards or Parquet files):"
        " structure, header, checksum, label, fields and count. Exits 1 naming the bad records when any check fails.",
    )
    verify.add_argument("dst", metavar="DST", help="the pack to check")
    verify.add_argument("--show", type=_positive, default=20, metavar="N", help="problems to print (default 20)")
    verify.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument(
        "--expect-digest",
        metavar="HEX",
        help="the pack's content digest you pinned (from `fastloader digest` or `pack`, obtained apart from the "
        "data): fail unless every record is the one it vouches for, naming the first that differs",
    )
    verify.set_defaults(run=_cmd_verify)
    digest = commands.add_parser(
        "digest",
        allow_abbrev=False,
        help="print a pack's content digest: a SHA-256 of every record's key, label, image and fields, in order",
    )
    digest.add_argument("dst", metavar="PACK", help="the pack (LMDB, tar shards or Parquet)")
    digest.set_defaults(run=_cmd_digest)
    fields = commands.add_parser(
        "fields",
        allow_abbrev=False,
        help="list what the samples carry besides the image and label",
        description="List the fields of SRC (any format pack reads), their kinds, and the first items' values:"
        " the names to pass as fields=(...) to its dataset.",
    )
    fields.add_argument("src", metavar="SRC", help="a dataset: tar shards, TFRecord, Parquet, an LMDB, a list, ...")
    fields.add_argument("--items", type=_non_negative, default=2, metavar="N", help="items to show (default 2)")
    fields.add_argument("--src-format", default="auto", help="how to read SRC (default: guessed)")
    fields.add_argument("--root", metavar="DIR", help=_ROOT_HELP)
    fields.add_argument("--json", action="store_true", help="print the report as JSON")
    fields.set_defaults(run=_cmd_fields)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments, a stray one reported with its command's usage (argparse reports those the subcommand
    left over with the top-level usage, which does not show the subcommand's flags)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        if args.command == "pack":
            print("fastloader pack: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except (OSError, ValueError, RuntimeError) as error:  # FormatError is a ValueError
        from fastloader.errors import printable

        print(f"fastloader {args.command}: error: {printable(str(error))}", file=sys.stderr)  # names from data
        return 1


if __name__ == "__main__":
    sys.exit(main())
