"""What ``fastloader pack`` writes into: the contract between the pack engine and an output format.

The engine reads a source in order (position 0, 1, 2, ...), re-encodes where asked, and hands each
item to a sink; the sink owns durability and resume. A pack killed at any moment (SIGKILL, a full
disk) and run again with the same arguments must end with every input exactly once: 0 lost, 0
duplicated. So:

* A sink is opened with the source's field kinds (``fields``: name -> kind, see
  ``fastloader.formats.field_values``), part of the fingerprint; ``add`` gets each item's field values
  (a subset of those names: an item may lack a field) and must keep them exactly.
* ``add`` / ``add_skipped`` are called with strictly increasing source ``position``\\ s.
* ``add`` is all-or-nothing: it checks and encodes the whole item first, and raises ValueError,
  having accepted nothing, for an item the output cannot hold (the engine then ``add_skipped``\\ s
  that position). Any other failure (a write, a commit, at any step) *poisons* the sink: it records
  nothing more, ``add`` / ``add_skipped`` / ``checkpoint`` / ``finish`` raise RuntimeError (never
  ValueError), and ``close`` only closes. So what a sink has recorded is always durable, whatever
  failed, and the same pack run again resumes from there.
* ``checkpoint()`` makes durable what the sink's unit of durability allows: everything handed over
  for an LMDB sink (one transaction), whole files only for the tar and Parquet sinks (a file is
  renamed into place when complete, so a resume may redo up to one file of work: see
  ``fastloader.pack.shard_sink``). Whatever the unit,
  ``resume_position()`` always equals the first position that is *not* durable: work may be
  redone, never lost or duplicated.
* A new sink opened on the same destination with the same ``fingerprint`` (a JSON-able dict
  describing the source and the options) reports that ``resume_position()``, and the engine
  continues from there. A different fingerprint is a clear error naming the destination, never
  a silent mix of two packs.
* ``finish`` writes the metadata / index last: it is the commit point that makes the output
  readable as a dataset. Until then a reader of the destination gets a clear "incomplete pack"
  error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from fastloader.formats.bad_samples import BadSample


class Sink(Protocol):
    def resume_position(self) -> int:
        """The first source position not yet durably written or skipped (0 for a fresh destination)."""
        ...

    def add(self, position: int, key: str, label: int, data: bytes, fields: Mapping[str, Any] | None = None) -> None:
        """Append one encoded image and its fields (``key`` is the source's key, kept for reports and lookups)."""
        ...

    def add_skipped(self, position: int, key: str, reason: str) -> None:
        """Record that the item at ``position`` was skipped (it counts as consumed for resume)."""
        ...

    def skipped(self) -> list[BadSample]:
        """Every item skipped so far, across resumed runs."""
        ...

    def checkpoint(self) -> None:
        """Make everything handed over so far durable."""
        ...

    def finish(self, classes: list[str] | None, meta: dict[str, Any]) -> None:
        """Write the metadata / index (the commit point) and close."""
        ...

    def close(self) -> None:
        """Close without finishing (an interrupted pack); what was durable stays durable."""
        ...


def normalize_fingerprint(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``fingerprint`` as it reads back from JSON (tuples become lists), so that equal ones compare equal."""
    try:
        normalized: dict[str, Any] = json.loads(json.dumps(fingerprint, sort_keys=True))
    except (TypeError, ValueError) as error:
        raise ValueError(f"fingerprint must be a JSON-serialisable dict ({error})") from None
    return normalized
