"""The error policy's cost per bad sample: ``record()`` for N distinct bad samples in one process.

Each bad sample is logged once, appended to the quarantine file and counted against ``max_errors``;
the count is shared with other processes through that file. The figure is the wall time of N calls
(logging off, a fresh quarantine in a temporary directory), so a cost that grows with the number
already found shows as a time that more than doubles with N.

    python benchmarks/bench_error_policy.py                      # 1k, 2k, 4k, 8k bad samples
    PYTHONPATH=/path/to/older/checkout python benchmarks/bench_error_policy.py --counts 1000 2000
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path


def seconds_for(count: int) -> float:
    from fastloader.datasets.error_policy import ErrorPolicy

    with tempfile.TemporaryDirectory() as folder:
        policy = ErrorPolicy("replace", 10 * count, None, Path(folder) / "quarantine.tsv", ())
        start = time.perf_counter()
        for i in range(count):
            policy.record(i, f"class_{i % 1000:04d}/image_{i:08d}.jpg", "undecodable: OSError: broken data stream")
        elapsed = time.perf_counter() - start
        if policy.stats()["bad_samples"] != count:
            raise RuntimeError(f"counted {policy.stats()['bad_samples']} of {count} bad samples")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    args = parser.parse_args()
    logging.getLogger("fastloader").setLevel(logging.ERROR)
    for count in args.counts:
        print(f"{count:>7} bad samples: {seconds_for(count):8.3f} s", flush=True)


if __name__ == "__main__":
    main()
