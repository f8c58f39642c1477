"""``fastloader scan SRC``: decode every image of a dataset before training, and list the bad ones.

A run over 10M images should not learn at hour 30 that image 7,341,902 is truncated. ``scan``
reads every item of any source ``fastloader pack`` reads (folder, file list, RecordIO, TFRecord,
tar shards, fastloader LMDB) with the same reader processes and the same checks as ``pack``
(every image decoded once: JPEGs at 1/8 scale, which still parses the whole entropy-coded
stream), and writes the items that fail as ``position<TAB>key<TAB>reason`` lines (the format of
``pack``'s skipped list), with a summary by reason.

The list goes where ``report`` says, else to the user's cache
(:func:`~fastloader.storage.default_report_path`): never into the dataset's directory, which a
stranger may have shipped with a symbolic link waiting at ``SRC.bad.tsv``.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from fastloader.datasets.sources import open_source
from fastloader.formats import bad_samples
from fastloader.formats.bad_samples import BadSample
from fastloader.pack.readers import ReencodeOptions, prepared, reader_pool
from fastloader.pack.summary import outside_line, write_report
from fastloader.storage import default_report_path, write_derived_bytes
from fastloader.world import usable_cpus


@dataclass(frozen=True)
class ScanReport:
    """What a scan found: ``bad`` lists every item that could not be read or decoded."""

    source: str
    kind: str
    total: int
    seconds: float
    report: str | None
    bad: list[BadSample] = field(default_factory=list)
    outside: int = 0  # items read from outside the source's root (symbolic links, ../, absolute paths)
    outside_example: str | None = None  # the first of them: "KEY -> REAL PATH"

    def by_reason(self) -> Counter[str]:
        """Bad items counted by the kind of failure (the reason up to its first colon)."""
        return Counter(item.reason.split(":", 1)[0] for item in self.bad)

    def format_text(self) -> str:
        rate = self.total / self.seconds if self.seconds else 0.0
        lines = [f"scanned {self.total} images of {self.source} ({self.kind}) in {self.seconds:.1f}s, {rate:.0f}/s"]
        lines.append(f"bad: {len(self.bad)}" + (f", listed in {self.report}" if self.report else ""))
        lines += [f"  {count:>8}  {reason}" for reason, count in self.by_reason().most_common()]
        outside = outside_line(self.outside, self.outside_example)
        lines += [] if outside is None else [outside.strip()]
        return "\n".join(lines)


def scan(
    src: str | os.PathLike[str],
    *,
    report: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    progress: bool = True,
    src_format: str = "auto",
    root: str | None = None,
    confine: bool = False,
) -> ScanReport:
    """Decode every item of ``src``; write the bad ones to ``report``, a path the user names (a symbolic
    link there is followed: the user's own), else to ``<cache>/reports/<name of SRC>-<digest>.bad.tsv``
    (a symbolic link there is refused). ``ScanReport.report`` says where the list went. ``confine``: read
    nothing from outside a folder's or a list's root (such items are bad, named with where they point);
    without it the report counts the items read from outside and names one."""
    from tqdm import tqdm

    src = os.fspath(src)
    source, kind = open_source(src, src_format, root=root, confine=confine)
    workers = usable_cpus() if workers is None else workers  # affinity and cgroup quota
    if workers < 0:
        raise ValueError(f"workers must be 0 or more, got {workers}")
    options = ReencodeOptions()  # no re-encoding: the decode check alone
    bad: list[BadSample] = []
    outside, example = 0, None
    start = time.perf_counter()
    with reader_pool(source, options, workers) as pool:
        items = prepared(source, options, pool, 0, workers)
        for item in tqdm(items, total=len(source), unit="img", desc="scan", disable=not progress, file=sys.stderr):
            if item.data is None:
                bad.append(BadSample(item.position, item.key, item.reason))
            if item.outside is not None:
                outside += 1
                example = example or f"{item.key} -> {item.outside}"
    seconds = time.perf_counter() - start
    if report is not None:
        path = os.fspath(report)
        write_report(path, bad)
    else:
        path = os.fspath(default_report_path(src, ".bad.tsv"))
        write_derived_bytes(path, bad_samples.text_of(bad).encode("utf-8", "surrogateescape"))
    return ScanReport(src, kind, len(source), seconds, path, bad, outside, example)
