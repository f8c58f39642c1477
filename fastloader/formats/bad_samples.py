"""The list of bad samples: one format for pack's ``DST.skipped.tsv``, scan's ``SRC.bad.tsv`` and the
error policy's quarantine file, so that any of them can be read back as an exclusion list.

Text, UTF-8 (undecodable bytes of file names kept by ``surrogateescape``), one sample a line::

    position<TAB>key<TAB>reason

after an optional header line (``position	key	reason``). A backslash, tab or newline inside a key or a
reason is written as ``\\\\``, ``\\t`` or ``\\n``, so every sample is exactly one line whatever its name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

HEADER = "position\tkey\treason"
_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n"}


@dataclass(frozen=True)
class BadSample:
    """A sample that was not used (skipped by pack, bad in a scan, replaced or skipped in training), and why."""

    position: int
    key: str
    reason: str


def escape(text: str) -> str:
    return "".join(_ESCAPES.get(char, char) for char in text) if any(c in text for c in _ESCAPES) else text


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, chars = [], iter(text)
    for char in chars:
        if char == "\\":
            following = next(chars, "")
            out.append(_UNESCAPES.get(following, "\\" + following))
        else:
            out.append(char)
    return "".join(out)


def row(sample: BadSample) -> str:
    """One line of the list, newline included."""
    return f"{sample.position}\t{escape(sample.key)}\t{escape(sample.reason)}\n"


def text_of(samples: Iterable[BadSample]) -> str:
    """A whole list, header first."""
    return HEADER + "\n" + "".join(row(sample) for sample in samples)


def parse(lines: Iterable[str], path: str | os.PathLike[str] = "<list>", strict: bool = True) -> Iterator[BadSample]:
    """The samples of a list; the header and blank lines are passed over, anything else malformed is a
    ValueError naming the line (``strict``) or passed over (a line a killed process left half-written)."""
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\n")
        if not text.strip() or (number == 1 and text == HEADER):
            continue
        parts = text.split("\t", 2)
        if len(parts) < 2 or not parts[0].strip().isdigit():
            if not strict:
                continue
            raise ValueError(f"{os.fspath(path)}:{number}: expected 'position<TAB>key<TAB>reason', got {text!r}")
        reason = parts[2] if len(parts) == 3 else ""
        yield BadSample(int(parts[0]), unescape(parts[1]), unescape(reason))


def read(path: str | os.PathLike[str], strict: bool = True) -> list[BadSample]:
    with open(path, encoding="utf-8", errors="surrogateescape") as file:
        return list(parse(file, path, strict))


def append(path: str | os.PathLike[str], sample: BadSample) -> None:
    """Add one line (one ``write`` of a small line: processes appending at once do not interleave)."""
    with open(path, "a", encoding="utf-8", errors="surrogateescape") as file:
        file.write(row(sample))


def write(path: str | os.PathLike[str], samples: Iterable[BadSample]) -> None:
    """A whole list, header first, replacing ``path`` atomically."""
    from fastloader.storage import atomic_write_bytes

    atomic_write_bytes(path, text_of(samples).encode("utf-8", "surrogateescape"))
