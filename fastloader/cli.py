"""The ``fastloader`` command line: ``fastloader info`` (more subcommands join as they are built)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _cmd_info(args: argparse.Namespace) -> int:
    from fastloader import info

    report = info.collect()
    print(json.dumps(report, indent=2) if args.json else info.format_report(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastloader", description="Fast data loading for PyTorch.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser("info", help="print what is active: torch, CUDA, PIL flavour, libjpeg, CPUs")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    info.set_defaults(run=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
