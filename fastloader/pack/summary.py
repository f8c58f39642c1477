"""What a pack did (:class:`PackSummary`), and where its list of skipped items goes: every engine's answer."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from fastloader.formats import bad_samples
from fastloader.formats.bad_samples import BadSample


def report_path(dst: str | os.PathLike[str]) -> str:
    """Where the list of skipped items goes: ``<DST>.skipped.tsv``, beside the output."""
    return os.fspath(dst).rstrip(os.sep) + ".skipped.tsv"


def write_report(path: str, skipped: list[BadSample]) -> None:
    bad_samples.write(path, skipped)


def outside_line(count: int, example: str | None) -> str | None:
    """The summary's line on samples read from outside the source's root (``--confine`` refuses them)."""
    if not count:
        return None
    return f"  read {count:,} samples from outside the source's root, e.g. {example} (--confine refuses them)"


@dataclass(frozen=True)
class PackSummary:
    """What a pack did. ``packed`` and ``skipped`` cover every run; the byte and time figures this run.

    ``engine``: ``local`` or ``ray`` (``fastloader.pack.ray_engine``), which also counts the pack's data
    files (``shards``, ``shards_now`` written by this run; None for the local engine). A Ray pack's
    ``resumed_from`` is the number of source items earlier runs packed (its shards finish in any order).
    """

    src: str
    dst: str
    format: str
    total: int  # items in the source
    resumed_from: int  # the first source position this run handled (0: a fresh pack)
    packed_now: int  # images this run wrote
    skipped: tuple[BadSample, ...] = field(default_factory=tuple)
    bytes_in: int = 0  # encoded bytes of the images this run wrote, as read
    bytes_out: int = 0  # and as written
    elapsed_s: float = 0.0
    report_path: str | None = None
    engine: str = "local"
    shards: int | None = None
    shards_now: int | None = None
    content_sha256: str | None = None  # the pack's content digest (fastloader.pack.content_digest), local packs
    outside: int = 0  # items this run read from outside the source's root (symbolic links, ../, absolute paths)
    outside_example: str | None = None  # the first of them: "KEY -> REAL PATH"

    @property
    def packed(self) -> int:
        return self.total - len(self.skipped)

    @property
    def images_per_s(self) -> float:
        return (self.total - self.resumed_from) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def skipped_by_reason(self) -> dict[str, int]:
        """BadSample items counted by reason (its kind and exception type, e.g. ``undecodable: OSError``)."""
        return dict(Counter(": ".join(item.reason.split(": ", 2)[:2]) for item in self.skipped).most_common())

    def format_text(self) -> str:
        mb_in, mb_out = self.bytes_in / 1e6, self.bytes_out / 1e6
        lines = [f"packed {self.packed:,} of {self.total:,} images into {self.dst} ({self.format})"]
        if self.resumed_from == self.total:
            lines.append("  already complete: nothing to do")
        elif self.resumed_from and self.engine == "ray":
            lines.append(f"  resumed: {self.resumed_from:,} items were packed by an earlier run")
        elif self.resumed_from:
            lines.append(f"  resumed at item {self.resumed_from:,}")
        lines.append(
            f"  this run: {self.packed_now:,} images in {self.elapsed_s:.1f} s ({self.images_per_s:,.0f} images/s), "
            f"read {mb_in:,.1f} MB, wrote {mb_out:,.1f} MB"
        )
        if self.shards is not None:
            now = self.shards_now or 0
            lines.append(f"  engine {self.engine}: {self.shards:,} shards, {now:,} written by this run")
        outside = outside_line(self.outside, self.outside_example)
        if outside is not None:
            lines.append(outside)
        if self.content_sha256 is not None:
            lines.append(f"  content digest: {self.content_sha256}")
            lines.append(f"    (pin it: fastloader verify {self.dst} --expect-digest {self.content_sha256})")
        if self.skipped:
            lines.append(f"  skipped {len(self.skipped):,} (listed in {self.report_path}):")
            lines += [f"    {count:>9,}  {reason}" for reason, count in self.skipped_by_reason().items()]
        return "\n".join(lines)

    def shortfall(self, max_skipped: float) -> str | None:
        """Why this pack is not a success, or None: it holds nothing, or it skipped more than ``max_skipped``
        (a share, 0..1) of its source's items. ``fastloader pack`` exits 1 with this; ``pack()`` leaves the
        judgement to its caller, who has the summary."""
        where = f" (listed in {self.report_path})" if self.skipped and self.report_path else ""
        if self.packed == 0:
            if not self.total:
                return f"{self.src}: the source holds no images: nothing was packed"
            return f"nothing was packed: all {self.total:,} items of {self.src} were skipped{where}"
        share = len(self.skipped) / self.total
        if share > max_skipped:
            return (
                f"{len(self.skipped):,} of {self.total:,} items skipped ({share:.1%}), more than the"
                f" {max_skipped:.1%} accepted (--max-skipped {max_skipped:g}){where}"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        extra = {"packed": self.packed, "images_per_s": self.images_per_s, "by_reason": self.skipped_by_reason()}
        return {**asdict(self), **extra}
