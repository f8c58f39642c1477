"""The list of bad samples: one format for pack's ``DST.skipped.tsv``, scan's ``SRC.bad.tsv`` and the
error policy's quarantine file, so that any of them can be read back as an exclusion list.

Text, UTF-8 (undecodable bytes of file names kept by ``surrogateescape``), one sample a line::

    position<TAB>key<TAB>reason

after an optional header line (``position	key	reason``). Inside a key or a reason a backslash, tab, newline
or carriage return is written as ``\\\\``, ``\\t``, ``\\n`` or ``\\r``, and every other character that
``str.splitlines`` ends a line at (``\\x0b``, ``\\x0c``, ``\\x1c`` .. ``\\x1e``, ``\\x85``, ``\\u2028``,
``\\u2029``) and every other control character (ESC, BEL, DEL, C1, the bidirectional overrides) as its
``\\x``/``\\u`` escape: every sample is exactly one line whatever its name, for this reader (which ends
lines at ``\\n`` only) and for any line reader a user's script may use, and a terminal showing the list
runs no escape sequence a name holds. Lists written before the last escapes existed read the same.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

HEADER = "position\tkey\treason"
_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_ESCAPES.update({char: f"\\x{ord(char):02x}" for char in "\x0b\x0c\x1c\x1d\x1e\x85"})
_ESCAPES.update({char: f"\\u{ord(char):04x}" for char in "\u2028\u2029"})
# And every other control a terminal acts on (ESC, BEL, C1, the bidirectional overrides): `cat bad.tsv`
# must show a name a dataset chose, never run it as an escape sequence (fastloader.errors.printable).
_ESCAPES.update(
    {chr(code): f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if chr(code) not in _ESCAPES}
)
_ESCAPES.update({char: f"\\u{ord(char):04x}" for char in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"})
_NEEDS_ESCAPE = re.compile("[" + re.escape("".join(_ESCAPES)) + "]")
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPED = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|.?)", re.DOTALL)


@dataclass(frozen=True)
class BadSample:
    """A sample that was not used (skipped by pack, bad in a scan, replaced or skipped in training), and why."""

    position: int
    key: str
    reason: str


def escape(text: str) -> str:
    return _NEEDS_ESCAPE.sub(lambda match: _ESCAPES[match.group()], text)


def _unescaped(match: re.Match[str]) -> str:
    code = match.group(1)
    if len(code) > 1:
        return chr(int(code[1:], 16))
    return _UNESCAPES.get(code, "\\" + code)  # an unknown escape is kept as written


def unescape(text: str) -> str:
    return _ESCAPED.sub(_unescaped, text) if "\\" in text else text


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
        text = line.removesuffix("\n").removesuffix("\r")  # a list edited on Windows: \r is escaped when written
        if not text.strip() or (number == 1 and text == HEADER):
            continue
        parts = text.split("\t", 2)
        if len(parts) < 2 or not parts[0].strip().isdecimal():
            if not strict:
                continue
            raise ValueError(f"{os.fspath(path)}:{number}: expected 'position<TAB>key<TAB>reason', got {text!r}")
        reason = parts[2] if len(parts) == 3 else ""
        yield BadSample(int(parts[0]), unescape(parts[1]), unescape(reason))


def read(path: str | os.PathLike[str], strict: bool = True) -> list[BadSample]:
    # newline="\n": only \n ends a line (text mode would end lines at a \r that an older list left raw).
    with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as file:
        return list(parse(file, path, strict))


def append(path: str | os.PathLike[str], sample: BadSample) -> None:
    """Add one line (one ``write`` of a small line: processes appending at once do not interleave)."""
    with open(path, "a", encoding="utf-8", errors="surrogateescape") as file:
        file.write(row(sample))


def write(path: str | os.PathLike[str], samples: Iterable[BadSample]) -> None:
    """A whole list, header first: ``path`` replaced atomically (a symlink's target; a FIFO or
    ``/dev/null`` written in place, see :func:`fastloader.storage.write_report_bytes`)."""
    from fastloader.storage import write_report_bytes

    write_report_bytes(path, text_of(samples).encode("utf-8", "surrogateescape"))
