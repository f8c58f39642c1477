"""A pack never writes into what it reads: SRC and DST are refused when one holds the other.

``fastloader pack src src/packed`` would write the pack among the images it reads (the folder then has a
class ``packed`` of pack files, and the next read of ``src`` fails), ``SRC == DST`` writes over the source,
and a DST that holds SRC writes its files among the source's. Both paths are compared with symbolic links
resolved (``os.path.realpath``), so another spelling of one directory is caught too.

A SRC that is a pattern (``'train-*.tar'``, ``'train-{000000..000099}.tar'``) is compared by the directory
its files are in: a DST equal to it or holding it is refused; a DST inside it is allowed (the pack's files
are then in a sub-directory, which no pattern of files names). Remote addresses (``s3://``) and a
:class:`~fastloader.datasets.base.Source` object are not compared.
"""

from __future__ import annotations

import os

from fastloader.remote.url import is_remote

_PATTERN_CHARS = frozenset("*?[{")


def check_apart(src: object, dst: str) -> None:
    """Raise ValueError naming both paths when ``dst`` is ``src``, is inside it, or holds it."""
    if not isinstance(src, (str, os.PathLike)) or is_remote(dst):
        return
    src_name = os.fspath(src)
    if not isinstance(src_name, str) or is_remote(src_name):
        return
    pattern = any(char in _PATTERN_CHARS for char in src_name) and not os.path.exists(src_name)
    source = os.path.realpath(_fixed_directory(src_name) if pattern else src_name)
    target = os.path.realpath(dst)
    if target == source:
        relation = "is the source"
    elif _inside(target, source) and not pattern:
        relation = "is inside the source"
    elif _inside(source, target):
        relation = "holds the source"
    else:
        return
    shown = f" (resolved: {target} and {source})" if (target, source) != (dst, src_name) else ""
    raise ValueError(
        f"the destination {dst} {relation} {src_name}{shown}: a pack would write among the files it reads;"
        " choose a destination outside the source"
    )


def _fixed_directory(pattern: str) -> str:
    """The directory of a file pattern's files: its path up to the first component with a pattern character."""
    parts = pattern.split(os.sep)
    fixed = []
    for part in parts[:-1]:
        if any(char in _PATTERN_CHARS for char in part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or ("/" if pattern.startswith(os.sep) else ".")


def _inside(path: str, directory: str) -> bool:
    return path != directory and os.path.commonpath([path, directory]) == directory
