"""Delivery ledgers, read and compared: did two runs' training loops see the same samples?

A ``DataLoaderX(ledger=PATH)`` records, per rank and epoch, every sample its training loop received, in
order, with the CRC32C of its encoded bytes as the worker read them (``fastloader.loader.ledger_writer``;
the file's layout: ``fastloader.formats.ledger``). :func:`read_ledger` replays a ledger into each rank's
deliveries per epoch, and :func:`diff_ledgers` compares two: an interrupted and resumed run against an
uninterrupted one, or two configurations of a loader. ``fastloader ledger diff A B`` and ``fastloader ledger
show A`` are the same on the command line.

The replay rule: when an iteration begins at position n (a run resumed from a state taken after n
deliveries of its epoch), the epoch's deliveries are cut to their first n and the resumed ones follow.
What the interrupted process delivered after the state it resumed from, the training that resumed never
kept: the ledger holds what the training saw, and a resumed run compares equal to an uninterrupted one
exactly when the resume was exact. An epoch begun again from 0 (the same epoch iterated twice) keeps its
last pass.

A sample is named by its key: the dataset's for fastloader's datasets (a path, an LMDB record), else the
sampler's index (``"17"``); an IterableDataset's batches by their position (``"batch 3"``). Bytes are compared
where both ledgers hold a digest of them. Under an error policy a ledger holds what was delivered: a skipped
sample is absent (the epoch remembers it was asked for, so a difference it makes is named as a skip), a
replaced one is its substitute, with the substitute's digest, marked as standing in for the key asked.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re

from fastloader.formats import ledger as layout

__all__ = ["Difference", "EpochDeliveries", "Ledger", "LedgerDiff", "RankLedger", "diff_ledgers", "read_ledger"]


@dataclasses.dataclass
class EpochDeliveries:
    """One rank's epoch: the key of each sample its training loop received, in order, and its digest (None:
    not read, or not a fastloader dataset); ``iterations``: how many began it (1, plus one per resume)."""

    keys: list[str] = dataclasses.field(default_factory=list)
    crcs: list[int | None] = dataclasses.field(default_factory=list)
    iterations: int = 0
    # Under an error policy: the key asked for at each position a substitute was delivered at ("replace"),
    # and each sample asked for but left out ("skip": the position it would have had, its key).
    replaced: dict[int, str] = dataclasses.field(default_factory=dict)
    skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    def cut(self, start: int) -> None:
        """Keep the first ``start`` deliveries (an iteration resumes after them)."""
        del self.keys[start:], self.crcs[start:]
        self.replaced = {at: key for at, key in self.replaced.items() if at < start}
        self.skipped = [(at, key) for at, key in self.skipped if at < start]


@dataclasses.dataclass(frozen=True)
class RankLedger:
    """One rank's ledger file, replayed."""

    path: str
    rank: int
    world_size: int
    epochs: dict[int, EpochDeliveries]
    notes: list[str]  # what the replay met: bytes skipped (a crash's torn tail), a resume beyond what is held


@dataclasses.dataclass(frozen=True)
class Ledger:
    """Every rank's ledger of one run (``path`` as given to ``ledger=``)."""

    path: str
    ranks: dict[int, RankLedger]

    @property
    def notes(self) -> list[str]:
        return [note for rank in self.ranks.values() for note in rank.notes]


def ledger_files(path: str | os.PathLike[str]) -> list[str]:
    """The files of a ledger: ``PATH`` with ``{rank}`` as any number; else ``PATH`` and ``PATH.rank<r>``."""
    text = os.fspath(path)
    if "{rank}" in text:
        head, _, tail = text.partition("{rank}")
        pattern = re.compile(re.escape(head) + r"\d+" + re.escape(tail) + r"\Z")
        found = [name for name in glob.glob(glob.escape(head) + "*" + glob.escape(tail)) if pattern.match(name)]
    else:
        found = [text] if os.path.isfile(text) else []
        pattern = re.compile(re.escape(text) + r"\.rank\d+\Z")
        found += [name for name in glob.glob(glob.escape(text) + ".rank*") if pattern.match(name)]
    if not found:
        raise FileNotFoundError(f"{text}: no ledger file (nor {text}.rank<r>, or a {{rank}} in the path)")
    return sorted(found)


def read_ledger(path: str | os.PathLike[str]) -> Ledger:
    """Every rank's deliveries per epoch in the ledger at ``path`` (see the module docstring)."""
    ranks: dict[int, RankLedger] = {}
    for name in ledger_files(path):
        rank = _read_file(name)
        if rank.rank in ranks:
            raise ValueError(f"{name}: a second ledger of rank {rank.rank} (the first: {ranks[rank.rank].path})")
        ranks[rank.rank] = rank
    return Ledger(os.fspath(path), dict(sorted(ranks.items())))


def _read_file(name: str) -> RankLedger:
    with open(name, "rb") as file:
        data = file.read()
    head, records, skipped = layout.read_records(data, name)
    notes = [
        f"{name}: {gap.size} bytes at byte {gap.offset} are no complete block"
        + (" (the tail a crash cut short): ignored" if gap.offset + gap.size == len(data) else ": skipped")
        for gap in skipped
    ]
    keys: dict[int, str] = {}
    epochs: dict[int, EpochDeliveries] = {}
    for record in records:
        if isinstance(record, layout.Key):
            keys[record.id] = record.key
        elif isinstance(record, layout.EpochBegins):
            epoch = epochs.setdefault(record.epoch, EpochDeliveries())
            epoch.iterations += 1
            if len(epoch.keys) < record.start:
                notes.append(
                    f"{name}: epoch {record.epoch} resumes at position {record.start} but holds only"
                    f" {len(epoch.keys)} deliveries before it (the ledger of the run before is not in this file)"
                )
            epoch.cut(record.start)
        else:
            epoch = epochs.setdefault(record.epoch, EpochDeliveries())
            ids = record.ids.tolist()
            if record.positions:
                epoch.keys.extend(f"batch {id_}" for id_ in ids)
            else:
                if record.asked is not None and record.slots is not None:
                    at = len(epoch.keys)
                    for asked, slot in zip(record.asked.tolist(), record.slots.tolist()):
                        key = keys.get(asked, str(asked))
                        if slot < 0:  # skipped where the batch's (-1 - slot)-th delivery is
                            epoch.skipped.append((at - 1 - slot, key))
                        else:
                            epoch.replaced[at + slot] = key
                epoch.keys.extend([keys.get(id_, str(id_)) for id_ in ids])
            epoch.crcs.extend(_crcs(record, len(ids)))
    return RankLedger(name, head.rank, head.world_size, dict(sorted(epochs.items())), notes)


def _crcs(record: layout.Samples, count: int) -> list[int | None]:
    if record.crcs is None:
        return [None] * count
    crcs: list[int | None] = list(record.crcs.tolist())
    if record.present is not None:
        crcs = [crc if here else None for crc, here in zip(crcs, record.present.tolist())]
    return crcs


@dataclasses.dataclass(frozen=True)
class Difference:
    """The first place two ledgers differ: ``kind`` is "missing", "doubled", "reordered", "other bytes",
    or "skipped" / "replaced" (an error policy left out or replaced in one run what the other delivered)."""

    rank: int
    epoch: int
    position: int | None  # None: a whole epoch (or rank) is missing
    kind: str  # "skipped" / "replaced" too: the difference an error policy made in one run
    key: str | None
    detail: str

    def __str__(self) -> str:
        where = f"rank {self.rank}, epoch {self.epoch}" + (
            f", position {self.position}" if self.position is not None else ""
        )
        return f"{where}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class LedgerDiff:
    """What :func:`diff_ledgers` found: ``first`` difference (None: the same), and what was compared."""

    first: Difference | None
    epochs: int  # (rank, epoch) pairs compared
    samples: int  # deliveries compared
    ranks: int
    bytes_compared: bool  # every delivery compared had a digest on both sides

    @property
    def same(self) -> bool:
        return self.first is None

    def __str__(self) -> str:
        if self.first is not None:
            return str(self.first)
        epochs = f"{self.epochs} epochs" + (f" of {self.ranks} ranks" if self.ranks > 1 else "")
        if self.bytes_compared:
            return f"same samples, same order, same bytes in {epochs} ({self.samples} samples)"
        return f"same samples, same order in {epochs} ({self.samples} samples; bytes not compared where not digested)"


def diff_ledgers(a: Ledger | str | os.PathLike[str], b: Ledger | str | os.PathLike[str]) -> LedgerDiff:
    """Compare two runs' ledgers rank by rank, epoch by epoch (see :class:`LedgerDiff`)."""
    left = a if isinstance(a, Ledger) else read_ledger(a)
    right = b if isinstance(b, Ledger) else read_ledger(b)
    epochs = samples = 0
    digested = True
    for rank in sorted(set(left.ranks) | set(right.ranks)):
        if rank not in left.ranks or rank not in right.ranks:
            side = "A" if rank not in left.ranks else "B"
            return LedgerDiff(
                Difference(rank, 0, None, "missing", None, f"no ledger of rank {rank} in {side}"),
                epochs,
                samples,
                0,
                False,
            )
        ours, theirs = left.ranks[rank].epochs, right.ranks[rank].epochs
        for epoch in sorted(set(ours) | set(theirs)):
            if epoch not in ours or epoch not in theirs:
                side, other = ("A", theirs) if epoch not in ours else ("B", ours)
                count = len(other[epoch].keys)
                detail = f"epoch missing in {side} ({count} samples in {'B' if side == 'A' else 'A'})"
                return LedgerDiff(Difference(rank, epoch, None, "missing", None, detail), epochs, samples, 0, False)
            first = _first_difference(rank, epoch, ours[epoch], theirs[epoch])
            if first is not None:
                return LedgerDiff(first, epochs, samples, 0, False)
            epochs += 1
            samples += len(ours[epoch].keys)
            digested = digested and all(
                x is not None and y is not None for x, y in zip(ours[epoch].crcs, theirs[epoch].crcs)
            )
    return LedgerDiff(None, epochs, samples, len(left.ranks), digested)


def _first_difference(rank: int, epoch: int, a: EpochDeliveries, b: EpochDeliveries) -> Difference | None:
    for position, (key_a, key_b) in enumerate(zip(a.keys, b.keys)):
        if key_a != key_b:
            return _by_policy(rank, epoch, position, a, b) or _classify(rank, epoch, position, a.keys, b.keys)
        crc_a, crc_b = a.crcs[position], b.crcs[position]
        if crc_a is not None and crc_b is not None and crc_a != crc_b:
            detail = f"key {key_a}: other bytes (CRC32C {crc_a:08x} in A, {crc_b:08x} in B)"
            return Difference(rank, epoch, position, "other bytes", key_a, detail)
    if len(a.keys) != len(b.keys):
        position = min(len(a.keys), len(b.keys))
        return _by_policy(rank, epoch, position, a, b) or _classify(rank, epoch, position, a.keys, b.keys)
    return None


def _by_policy(rank: int, epoch: int, position: int, a: EpochDeliveries, b: EpochDeliveries) -> Difference | None:
    """The first difference at ``position`` when an error policy made it: a sample one run skipped, or
    replaced by a substitute, where the other delivered it."""
    for ours, theirs, side, other in ((a, b, "A", "B"), (b, a, "B", "A")):
        wanted = theirs.keys[position] if position < len(theirs.keys) else None
        asked = ours.replaced.get(position)
        if asked is not None and asked == wanted:
            detail = f"key {asked} replaced by {ours.keys[position]} in {side} (delivered in {other})"
            return Difference(rank, epoch, position, "replaced", asked, detail)
        for at, key in ours.skipped:
            if at == position and key == wanted:
                detail = f"key {key} skipped in {side} (a bad sample left out; delivered in {other})"
                return Difference(rank, epoch, position, "skipped", key, detail)
    return None


def _classify(rank: int, epoch: int, position: int, a: list[str], b: list[str]) -> Difference:
    """What the first differing position of an epoch is: a key doubled, missing, or out of its place."""
    key_a = a[position] if position < len(a) else None
    key_b = b[position] if position < len(b) else None
    count_a, count_b = collections.Counter(a), collections.Counter(b)
    seen_a, seen_b = set(a[:position]), set(b[:position])
    for key, seen, ours, theirs, side in (
        (key_a, seen_a, count_a, count_b, "A"),
        (key_b, seen_b, count_b, count_a, "B"),
    ):
        if key is not None and key in seen and ours[key] > theirs[key]:
            times = "twice" if ours[key] == 2 else f"{ours[key]} times"
            return Difference(rank, epoch, position, "doubled", key, f"key {key} delivered {times} in {side}")
    for key, theirs, side, other in ((key_b, count_a, "A", "B"), (key_a, count_b, "B", "A")):
        if key is not None and theirs[key] < (count_b if side == "A" else count_a)[key]:
            return Difference(
                rank, epoch, position, "missing", key, f"key {key} missing in {side} (delivered in {other})"
            )
    detail = f"reordered: key {key_a} in A, key {key_b} in B"
    if key_b is not None and key_b in a[position:]:
        detail += f" (A delivers {key_b} at position {a.index(key_b, position)})"
    return Difference(rank, epoch, position, "reordered", key_a, detail)


def summary(ledger: Ledger) -> list[str]:
    """One line per rank and epoch: the samples delivered, the iterations that made them, digests held."""
    lines = []
    for rank in ledger.ranks.values():
        for number, epoch in rank.epochs.items():
            digests = sum(crc is not None for crc in epoch.crcs)
            resumed = f", resumed {epoch.iterations - 1}x" if epoch.iterations > 1 else ""
            policy = (
                f", {len(epoch.replaced)} replaced, {len(epoch.skipped)} skipped"
                if epoch.replaced or epoch.skipped
                else ""
            )
            lines.append(
                f"rank {rank.rank}, epoch {number}: {len(epoch.keys)} samples ({digests} with digests{resumed}{policy})"
            )
    return lines
