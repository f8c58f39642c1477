"""Whether the GIL is on, and on a free-threaded Python which imported module turned it back on.

A free-threaded Python (3.13t, 3.14t) runs without the GIL until it imports an extension module that does not
declare it can (``Py_MOD_GIL_NOT_USED``): it then turns the GIL back on for the whole process and warns once
(a ``RuntimeWarning`` naming the module). fastloader's JPEG extension declares it; lmdb, for one, does not yet.
``fastloader info`` and ``fastloader doctor`` say which (:func:`gil_report`), importing the modules a training
run imports while recording those warnings.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import sys
import sysconfig
import warnings
from collections.abc import Iterable

# The modules a training run imports that are extensions (or import some), fastloader's JPEG extension first: the
# report imports them by name while it listens for the interpreter's warning, so it can name the one that turned
# the GIL on (by name: this base module imports nothing of fastloader's layers above it when it is imported).
RUN_IMPORTS = ("fastloader.image.jpeg_ext", "numpy", "torch", "PIL.Image", "lmdb")
# CPython's words (Python/import.c): "The global interpreter lock (GIL) has been enabled to load module 'lmdb.cpython',
# which has not declared that it can run safely without the GIL. ..."
_ENABLED_FOR = re.compile(r"GIL\) has been enabled to load module '([^']+)'")


def free_threaded_build() -> bool:
    """Whether this interpreter is a free-threaded build (it may still run with the GIL on)."""
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def gil_enabled() -> bool:
    """Whether the GIL is on now (always, before Python 3.13)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def modules_that_enabled_it(imports: Iterable[str] = RUN_IMPORTS) -> list[str]:
    """Import ``imports`` (those that are installed), and return the modules the interpreter turned the GIL back
    on for while they loaded. A module imported before this call warned then: it is not seen here."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        for name in imports:
            try:
                importlib.import_module(name)
            except ImportError:
                continue
    found = (_ENABLED_FOR.search(str(warning.message)) for warning in caught)
    return [match.group(1) for match in found if match is not None]


def gil_report(imports: Iterable[str] = RUN_IMPORTS) -> str:
    """One line: whether the GIL is on, and why."""
    version = platform.python_version()
    if not hasattr(sys, "_is_gil_enabled"):
        return f"on (Python {sys.version_info.major}.{sys.version_info.minor} has no free-threaded build)"
    if not free_threaded_build():
        return f"on (Python {version} is not a free-threaded build)"
    culprits = modules_that_enabled_it(imports)
    if not gil_enabled():
        return f"off (free-threaded Python {version})"
    if culprits:
        return (
            f"on: turned back on by importing {', '.join(culprits)}, which does not declare it runs without the"
            " GIL (PYTHON_GIL=0 keeps it off, at your own risk)"
        )
    if os.environ.get("PYTHON_GIL") == "1" or "gil" in getattr(sys, "_xoptions", {}):
        return "on (asked for: PYTHON_GIL or -X gil)"
    return "on (turned back on by a module imported before this report: run with -W error::RuntimeWarning to see which)"
