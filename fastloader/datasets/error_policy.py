"""What a dataset does with a bad sample: raise, skip it, or replace it by another one.

A run over 10M images lasts days; one truncated JPEG must not end it, and a flood of them must not
silently turn an epoch into nothing. So (``ImageDataset.set_error_policy``):

* ``"raise"`` (default): the error reaches the training loop, naming the key;
* ``"skip"``: the sample is dropped from its batch (the batch is one shorter);
* ``"replace"``: the next good sample (index + 1, + 2, ... modulo the length) stands in, so batch
  sizes, epoch length and resume state stay exact; deterministic, as it depends on the index only.

Every bad sample is written once to a quarantine file (``position<TAB>key<TAB>reason``, the format of
``fastloader scan`` and ``pack``'s skipped list), which is also how the counts of all worker processes
meet: appends of one short line are atomic, and each process keeps the samples it knows in memory and
reads only what was appended since its last look (linear in bad samples, however many there are).
``max_errors`` (a count, or a fraction of the dataset when < 1) turns too many bad samples into one
clear ``TooManyBadSamples`` error. An exclusion list from ``fastloader scan`` marks samples bad
before they are read.

A sample found bad once stays bad for the run: listed in the quarantine, it is never read again, by any
worker process (they look at the file before each sample: one ``stat`` while nothing was appended) nor
in later epochs, so that every epoch holds the same samples (a random crop that happens to miss a
file's damage does not bring it back). ``skip`` drops it and ``replace`` substitutes it every time;
``raise`` raises its DecodeError again, naming it, without decoding it again. A quarantine line counts
for the position only while the key there is still the sample's (a file reused across runs of a dataset
that changed excludes nothing it should not).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from fastloader import read_digests
from fastloader.errors import DecodeError, TooManyBadSamples, printable
from fastloader.formats import bad_samples
from fastloader.formats.bad_samples import BadSample

MODES = ("raise", "skip", "replace")
_MAX_TRIES = 16  # substitutes tried before giving up: more consecutive bad samples means a broken dataset
_LOG = logging.getLogger("fastloader")
R = TypeVar("R")


class ErrorPolicy:
    """One dataset's policy; picklable (worker processes share it through the quarantine file)."""

    def __init__(
        self,
        mode: str,
        length: int,
        max_errors: float | None = None,
        quarantine: str | os.PathLike[str] | None = None,
        excluded: Iterable[int] = (),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"on_error must be one of {', '.join(MODES)}, got {mode!r}")
        if max_errors is not None and (isinstance(max_errors, bool) or max_errors < 0):
            raise ValueError(f"max_errors must be a count >= 0 or a fraction < 1, got {max_errors!r}")
        self.mode = mode
        self.length = length
        self.budget = None if max_errors is None else (max_errors * length if max_errors < 1 else max_errors)
        if quarantine is None:
            fd, quarantine = tempfile.mkstemp(prefix="fastloader-quarantine-", suffix=".tsv")
            os.close(fd)
        self.quarantine = os.fspath(quarantine)
        if os.path.exists(self.quarantine) and not os.path.isfile(self.quarantine):
            # Read back by every worker (a FIFO would block them, /dev/null would lose their counts).
            raise ValueError(
                f"quarantine must be a regular file, where worker processes' counts meet: {self.quarantine}"
            )
        self.excluded = np.unique(np.fromiter(excluded, dtype=np.int64))
        self._found: dict[str, BadSample] = {}  # every bad sample this process knows, by key, in order found
        self._at: dict[int, BadSample] = {}  # the same, by position: samples never to read again in this run
        self._read_to = 0  # bytes of the quarantine already in _found

    def is_excluded(self, index: int) -> bool:
        """Whether ``index`` is on the exclusion list (``fastloader scan``'s report, or positions)."""
        position = int(np.searchsorted(self.excluded, index))
        return position < self.excluded.size and int(self.excluded[position]) == index

    def found_bad(self, index: int, key: Callable[[int], str]) -> BadSample | None:
        """The quarantine's line for ``index`` when some process found it bad in this run (or a run before that
        wrote the same quarantine), its key still the sample's; else None."""
        self._catch_up(if_grown=True)
        return self._known_bad(index, key)

    def _known_bad(self, index: int, key: Callable[[int], str]) -> BadSample | None:
        sample = self._at.get(index)
        return sample if sample is not None and sample.key == _safe_key(key, index) else None

    def excludes_any(self, indices: Sequence[int], key: Callable[[int], str]) -> bool:
        """Whether any of ``indices`` is excluded or found bad (the batch then goes sample by sample)."""
        if self.excluded.size and bool(np.isin(np.asarray(indices, np.int64), self.excluded).any()):
            return True
        self._catch_up(if_grown=True)  # once for the batch
        return bool(self._at) and any(self._known_bad(int(index), key) is not None for index in indices)

    def record(self, index: int, key: str, error: BaseException | str) -> None:
        """Report a bad sample once (log + quarantine line), then enforce the budget."""
        reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._catch_up()
        known = self._at.get(index)
        if known is None or known.key != key:
            # Once for the whole run: other processes (earlier epochs' workers) may have reported it. A key the
            # quarantine names at another position (a run before, over a dataset that changed since) gets a line
            # at this one: the next run finds it where it is now.
            # printable: a non-UTF-8 file name would make a UTF-8 log handler fail on the line
            _LOG.warning("bad sample %s (position %d): %s", printable(key), index, printable(reason))
            sample = BadSample(index, key, reason)
            bad_samples.append(self.quarantine, sample)
            self._found.setdefault(key, sample)
            self._at[index] = sample
        if self.budget is not None and len(self._found) > self.budget:
            first = next(iter(self._found.values()))
            raise TooManyBadSamples(
                f"{len(self._found)} bad samples, more than max_errors allows ({self.budget:g} of {self.length}); "
                f"the first: {first.key}: {first.reason} (all listed in {self.quarantine})"
            )

    def bad_samples(self) -> list[BadSample]:
        """Every bad sample any process reported, once each, in the order they were found."""
        self._catch_up()
        return list(self._found.values())

    def by_position(self) -> list[BadSample]:
        """The quarantine's latest line for each position (a key may be listed at several: the dataset changed
        between the runs that wrote them); whether its key is still the sample's there is the caller's to check."""
        self._catch_up()
        return list(self._at.values())

    def _catch_up(self, if_grown: bool = False) -> None:
        """Take in the lines other processes appended since the last call (whole lines only: one being
        written, or left half-written by a killed process, waits for its newline). ``if_grown``: only when
        the file's size changed (one ``stat``: what every sample pays)."""
        if if_grown:
            try:
                if os.stat(self.quarantine).st_size == self._read_to:
                    return
            except FileNotFoundError:
                return
        try:
            with open(self.quarantine, "rb") as file:
                if os.fstat(file.fileno()).st_size < self._read_to:  # truncated or replaced: start again
                    self._found, self._at, self._read_to = {}, {}, 0
                file.seek(self._read_to)
                new = file.read()
        except FileNotFoundError:
            return
        end = new.rfind(b"\n") + 1
        lines = new[:end].decode("utf-8", "surrogateescape").split("\n")
        for sample in bad_samples.parse(lines, self.quarantine, strict=False):
            self._found.setdefault(sample.key, sample)
            self._at[sample.position] = sample  # the latest line of a position: its sample now, if any run's
        self._read_to += end

    def stats(self) -> dict[str, Any]:
        bad = self.bad_samples()
        return {
            "on_error": self.mode,
            "bad_samples": len(bad),
            "by_reason": dict(Counter(sample.reason.split(":", 1)[0] for sample in bad)),
            "excluded": int(self.excluded.size),
            "quarantine": self.quarantine,
        }

    def substitutes(self, index: int, key: Callable[[int], str]) -> Iterator[int]:
        """The samples tried in place of a bad ``index``, nearest first, excluded and found bad ones left out."""
        for step in range(1, min(_MAX_TRIES, self.length - 1) + 1):
            candidate = (index + step) % self.length
            if not self.is_excluded(candidate) and self.found_bad(candidate, key) is None:
                yield candidate

    def fetch(
        self, index: int, key: Callable[[int], str], produce: Callable[[int], R], allow_skip: bool = True
    ) -> R | None:
        """``produce(index)`` under the policy: its value, a substitute's (replace, or skip where a
        sample cannot be dropped), None (skip), or raise."""
        if self.is_excluded(index):  # listed by `fastloader scan`: not read again
            return self._instead(index, key, produce, allow_skip)
        found = self.found_bad(index, key)
        if found is not None:  # found bad before, by this process or another: not read again either
            if self.mode == "raise":
                raise DecodeError(f"{found.key}: found bad earlier in this run ({found.reason}; in {self.quarantine})")
            return self._instead(index, key, produce, allow_skip)
        try:
            return produce(index)
        except Exception as error:  # noqa: BLE001 - any failure of one sample is that sample's, by policy
            return self.recover(index, key, error, produce, allow_skip)

    def recover(
        self,
        index: int,
        key: Callable[[int], str],
        error: Exception,
        produce: Callable[[int], R],
        allow_skip: bool = True,
    ) -> R | None:
        """Sample ``index`` failed with ``error`` (in the dataset, or later: the GPU decoder): record it,
        then as the policy says: raise ``error``, None (skip, where ``allow_skip``), or the value of
        ``produce`` for the first substitute it does not fail on (replace)."""
        self.record(index, _safe_key(key, index), error)
        if self.mode == "raise":
            raise error
        return self._instead(index, key, produce, allow_skip)

    def _instead(
        self, index: int, key: Callable[[int], str], produce: Callable[[int], R], allow_skip: bool
    ) -> R | None:
        if self.mode == "skip" and allow_skip:
            read_digests.skipped(index)  # the delivery ledger records what was delivered (off unless ledger=)
            return None
        for candidate in self.substitutes(index, key):
            result = self._attempt(candidate, key, produce)
            if result is not None:
                read_digests.replaced(index, candidate)
                return result[0]
        raise TooManyBadSamples(
            f"sample {index} ({_safe_key(key, index)}) and the {_MAX_TRIES} after it are all bad"
            f" (listed in {self.quarantine})"
        )

    def _attempt(self, index: int, key: Callable[[int], str], produce: Callable[[int], R]) -> tuple[R] | None:
        if self.is_excluded(index) or self.found_bad(index, key) is not None:
            return None  # listed by `fastloader scan`, or found bad: not read again
        try:
            return (produce(index),)
        except Exception as error:  # noqa: BLE001 - any failure of one sample is that sample's, by policy
            self.record(index, _safe_key(key, index), error)
            if self.mode == "raise":
                raise
            return None

    def __getstate__(self) -> dict[str, Any]:
        # A new process reads the quarantine itself, once: the pickle stays small.
        return {**self.__dict__, "_found": {}, "_at": {}, "_read_to": 0}


def _safe_key(key: Callable[[int], str], index: int) -> str:
    try:
        return key(index)
    except Exception:  # noqa: BLE001 - the key of a broken record may itself be unreadable
        return f"#{index}"


def read_exclusions(path: str | os.PathLike[str]) -> list[int]:
    """Positions listed in a ``fastloader scan`` report (or ``pack``'s skipped list)."""
    return [sample.position for sample in bad_samples.read(path)]
