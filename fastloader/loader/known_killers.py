"""The samples known to kill DataLoader workers, matched by key: never a position alone.

A quarantine file outlives the run that wrote it; the dataset may change before the next one (five images
added that sort first shift every position after them). A ``WorkerKilled`` line is a position and a key: it
counts for the position only while the dataset's key there is still the one quarantined (as the decode-error
path checks, ``fastloader.datasets.error_policy``). A line whose key is now elsewhere is *moved*: the good
sample now at its old position is sent as any other, and the killer is looked for by key in each batch about
to be sent, until found (one key per sample, in the loader's process, only while a moved killer is unfound:
a dataset that changed under its quarantine). Found, it is left out as if quarantined here, and the
quarantine gets a line at its new position, so the next run finds it without a search.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastloader.datasets.error_policy import ErrorPolicy
    from fastloader.formats.bad_samples import BadSample


class KnownKillers:
    """Positions that must never go to a worker again (``in``), from the quarantine's lines and this run's hunts."""

    def __init__(self, lines: Iterable[BadSample], key: Callable[[int], str], policy: ErrorPolicy) -> None:
        self.key, self.policy = key, policy
        self.at: dict[int, str] = {}  # position -> the reason it is known by
        unplaced: dict[str, str] = {}
        placed: set[str] = set()
        for line in lines:
            if key(line.position) == line.key:
                self.at[line.position] = line.reason
                placed.add(line.key)
            else:
                unplaced.setdefault(line.key, line.reason)
        self.moved = {name: reason for name, reason in unplaced.items() if name not in placed}  # key -> reason

    def __bool__(self) -> bool:
        return bool(self.at or self.moved)

    def __contains__(self, sample: object) -> bool:
        if not isinstance(sample, int):
            return False
        if sample in self.at:
            return True
        if not self.moved:
            return False
        name = self.key(sample)
        reason = self.moved.pop(name, None)
        if reason is None:
            return False
        self.at[sample] = reason
        self.policy.record(sample, name, reason)  # its new position, for the next run (and a warning naming it)
        return True

    def __setitem__(self, sample: int, reason: str) -> None:
        """A sample this run's hunt found (the policy recorded it)."""
        self.at[sample] = reason
