"""Images a Parquet row names by path: a Hugging Face ``Image`` stored as ``{bytes: null, path: "..."}``.

``datasets.Dataset.from_dict({"image": paths}).cast_column("image", datasets.Image())`` then
``to_parquet`` keeps only the paths; ``datasets`` reads such a row by opening ``path`` when it decodes it
(``Image.decode_example``: ``PIL.Image.open(path)``), so a relative path is relative to the current
directory at that moment, not to the Parquet file. :class:`ImagePaths` reads them the same way, and a
set moved elsewhere is read with ``root``: a relative path is then taken under it (an absolute one stays
as it is). Bytes in the row win over its path, as in ``datasets``.

Each file is read as the folder datasets read theirs (``fastloader.storage.read_regular_file``): a FIFO,
a device or a directory named as an image is an error naming it, never a read that waits forever. A path
that is not local (``hf://``, ``https://``, a ``zip://...::`` chain: ``datasets`` downloads those) is an
error too: fastloader reads no network from its workers behind the user's back.

``confine=True`` (with ``root``) keeps those reads under the root, as it keeps a folder's
(``fastloader.datasets.confine``): a path that leads outside it (``../``, an absolute path, a symbolic
link out, resolved at read time) is refused with :class:`~fastloader.errors.OutsideRoot` naming the row.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fastloader.datasets.confine import check_inside, real_root
from fastloader.errors import ImagePathError
from fastloader.storage import read_regular_file


def _is_local(path: str) -> bool:
    """As ``datasets``' ``is_local_path``, less Windows drive letters: no ``scheme://``."""
    return "://" not in path


class ImagePaths:
    """Where the image paths of a Parquet file's rows lead (picklable: it goes to the workers).

    ``root``: the directory a relative path is taken under (None: the current directory when read, as
    ``datasets`` does). A ValueError naming it when it is not a directory. ``confine``: read nothing
    from outside ``root`` (which it needs): see the module docstring.
    """

    def __init__(self, root: str | os.PathLike[str] | None, confine: bool = False) -> None:
        if root is not None:
            if not isinstance(root, (str, os.PathLike)):
                raise TypeError(f"root must be a path or None, got {type(root).__name__}")
            if not os.path.isdir(root):
                raise ValueError(f"root={os.fspath(root)!r} is not a directory")
            # Absolute now: a worker that changes directory still reads under the root the user meant.
            root = os.path.abspath(root)
        elif confine:
            raise ValueError("confine=True needs root=: the directory the images named by path must stay in")
        self.root: str | None = root
        self._inside = real_root(root) if confine and root is not None else None  # resolved once, as the user gave it

    def resolve(self, path: str) -> str:
        """The path a row's ``path`` is read from."""
        if self.root is not None and not os.path.isabs(path):
            return os.path.join(self.root, path)
        return path

    def read(self, value: dict[str, Any], where: Callable[[], str]) -> bytes | None:
        """The image bytes of a Hugging Face image cell ``{bytes, path}``: its bytes, else the file at its
        path; None when it holds neither. ``where()`` names the row in errors (:class:`ImagePathError`)."""
        data, path = value.get("bytes"), value.get("path")
        if data is not None:
            return bytes(data)
        if path is None:
            return None
        if not _is_local(path):
            raise ImagePathError(f"{where()}: image path {path!r} is not a local file: only local paths are read")
        resolved = self.resolve(path)
        if self._inside is not None:
            check_inside(f"{where()}: image path {path!r}", resolved, self._inside)
        try:
            return read_regular_file(resolved)  # a FIFO or a device named as an image: an error, not a hang
        except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            found = ImagePathError(f"{where()}: cannot read image path {path!r} ({self._read_as(resolved)}): {reason}")
            found.errno = getattr(error, "errno", None)  # FileNotFoundError's ENOENT, ... for whoever asks
            raise found from None

    def _read_as(self, resolved: str) -> str:
        """Where the path was looked for, and why there (for the error)."""
        absolute = os.path.abspath(resolved)
        if self.root is not None:
            return f"read as {absolute}"
        return f"read as {absolute}, from the current directory as Hugging Face datasets does; root= reads a moved set"
