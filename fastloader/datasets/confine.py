"""``confine=True``: nothing is read from outside a source's root.

A folder's symbolic links (to a file, or to a whole class directory) and a file list's ``../`` or absolute
paths are followed by default, as torchvision follows them. Data someone else made can use them to point a
reader, and ``fastloader pack``, at any file the user can read. Under ``confine`` every read first resolves
its path with ``os.path.realpath`` (every symbolic link along it, a linked directory in the middle
included: ``O_NOFOLLOW`` would only see the last component) and refuses it, with :class:`OutsideRoot`
naming the sample, unless the result lies under the root's own real path.

Checked at read time, not over the index when the source opens: nothing per sample is kept, a 10M-sample
source opens as fast as before, and a refused sample is one bad sample under the dataset's error policy
(pack and scan skip it and list it). Cost: one ``realpath`` per read, an ``lstat`` per path component (a
few microseconds on a local disk with warm caches, a metadata round trip per component on a network
filesystem). A link swapped between the check and the open (someone writing into the tree while it is
read) is not covered: confine is about the data as shipped.
"""

from __future__ import annotations

import os

from fastloader.errors import OutsideRoot


def real_root(root: str) -> str:
    """The prefix a confined read's real path must start with: ``root`` resolved, ending in a separator."""
    return os.path.join(os.path.realpath(root), "")


def outside(path: str, inside: str) -> str | None:
    """``path``'s real path when it lies outside ``inside`` (a :func:`real_root`), else None."""
    real = os.path.realpath(path)
    # The root itself is no sample; a real path equal to it (a link to the root) is refused with the rest.
    return None if real.startswith(inside) else real


def check_inside(key: str, path: str, inside: str) -> None:
    """Raise :class:`OutsideRoot` naming ``key`` and its real path when ``path`` leads outside ``inside``."""
    real = outside(path, inside)
    if real is not None:
        raise OutsideRoot(f"{key}: points outside the root {inside} (to {real}); refused under confine=True")
