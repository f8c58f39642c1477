"""JSON text with a fixed bound on its nesting: the same answer in every process.

``json.loads`` and ``json.dumps`` recurse once per level of nesting, under the interpreter's recursion
limit *minus the frames already on the stack*: a value nested 985 deep decodes in one process and
raises ``RecursionError`` in another (a loader worker, a pack reader), and one nested 100,000 deep
raises wherever it is read. So JSON that fastloader reads from data (field values, index and pack
metadata) is measured before it is parsed, and anything nested deeper than :data:`MAX_DEPTH` is a
:class:`~fastloader.errors.FormatError` naming where it came from, whatever the stack.

The measure counts ``[`` and ``{`` outside strings. For valid JSON it is the exact depth; for invalid
JSON it is never less than the depth the parser would reach before failing, so the bound holds.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fastloader.errors import FormatError

MAX_DEPTH = 128  # far beyond real annotations (a few levels), far below the recursion limit (1000)

_OPEN, _CLOSE, _QUOTE, _BACKSLASH = 1, 2, 3, 4
_KINDS = np.zeros(256, dtype=np.uint8)
_KINDS[[ord("["), ord("{")]] = _OPEN
_KINDS[[ord("]"), ord("}")]] = _CLOSE
_KINDS[ord('"')] = _QUOTE
_KINDS[ord("\\")] = _BACKSLASH
_STEPS = np.array([0, 1, -1, 0, 0], dtype=np.int64)


def depth_exceeds(data: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """True when the JSON text ``data`` nests arrays and objects deeper than ``limit``."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # the common case: too few brackets to nest that deep, nothing more to look at
    kinds = _KINDS[np.frombuffer(raw, dtype=np.uint8)]
    events = np.flatnonzero(kinds)
    event_kinds = kinds[events]
    if not np.isin(event_kinds, (_QUOTE, _BACKSLASH)).any():  # no strings: the brackets alone, vectorized
        return bool(np.cumsum(_STEPS[event_kinds]).max() > limit)
    return _deepest_with_strings(events.tolist(), event_kinds.tolist(), limit) > limit


def _deepest_with_strings(positions: list[int], kinds: list[int], limit: int) -> int:
    """The nesting depth, brackets inside strings (and the character after a backslash) passed over;
    one pass over the special characters only, stopping once past ``limit``."""
    depth = deepest = 0
    in_string = False
    escaped_at = -1
    for position, kind in zip(positions, kinds):
        if position == escaped_at:
            continue
        if in_string:
            if kind == _BACKSLASH:
                escaped_at = position + 1
            elif kind == _QUOTE:
                in_string = False
        elif kind == _QUOTE:
            in_string = True
        elif kind == _OPEN:
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif kind == _CLOSE:
            depth -= 1
    return deepest


def too_deep(where: str) -> FormatError:
    return FormatError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels (the limit fastloader reads)")


def loads(data: bytes | str, where: str) -> Any:
    """``json.loads(data)``; FormatError naming ``where`` when it is not JSON or nests too deep."""
    if depth_exceeds(data):
        raise too_deep(where)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise FormatError(f"{where}: not valid JSON ({type(error).__name__}: {error})") from None


def dumps(value: Any, where: str, **options: Any) -> str:
    """``json.dumps(value, **options)``; FormatError naming ``where`` when the value nests too deep
    (TypeError / ValueError for a value JSON cannot hold are left to the caller)."""
    try:
        text = json.dumps(value, **options)
    except RecursionError:
        raise too_deep(where) from None
    if depth_exceeds(text):
        raise too_deep(where)
    return text
