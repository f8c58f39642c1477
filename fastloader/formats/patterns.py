"""Shard name patterns: WebDataset-style braces (``train-{000000..000099}.tar``, ``{a,b}``) and globs."""

from __future__ import annotations

import glob
import os
import re

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """Expand every ``{N..M}`` (zero-padded to the width of N) and ``{a,b,c}`` in ``pattern``, left to right."""
    matches = [m for m in (_RANGE.search(pattern), _CHOICE.search(pattern)) if m is not None]
    if not matches:
        return [pattern]
    match = min(matches, key=lambda m: m.start())
    head, tail = pattern[: match.start()], pattern[match.end() :]
    if match.re is _RANGE:
        first, last = match.group(1), match.group(2)
        if int(last) < int(first):
            raise ValueError(f"empty brace range {match.group(0)} in {pattern!r}")
        choices = [f"{i:0{len(first)}d}" for i in range(int(first), int(last) + 1)]
    else:
        choices = match.group(1).split(",")
    return [name for choice in choices for name in expand_braces(head + choice + tail)]


def expand_pattern(pattern: str | os.PathLike[str] | list[str]) -> list[str]:
    """The files a shard pattern names: braces expanded, then globs (``*?[``) matched and sorted.

    Raises FileNotFoundError naming the pattern when it matches nothing or names a missing file.
    """
    patterns = [os.fspath(p) for p in pattern] if isinstance(pattern, list) else [os.fspath(pattern)]
    paths: list[str] = []
    for item in patterns:
        for name in expand_braces(item):
            if glob.has_magic(name):
                matched = sorted(glob.glob(name))
                if not matched:
                    raise FileNotFoundError(f"no file matches {name!r}")
                paths.extend(matched)
            elif os.path.exists(name):
                paths.append(name)
            else:
                raise FileNotFoundError(f"{name}: no such file (from pattern {item!r})")
    if not paths:
        raise FileNotFoundError(f"pattern {pattern!r} names no file")
    return paths
