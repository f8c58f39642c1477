"""The pack's child processes die with it: a reader never outlives a pack killed by SIGKILL.

A reader blocked on its result pipe, or in a slow read, would otherwise stay forever once its pack is
killed (nothing is left to read the pipe, and SIGKILL cannot be caught to stop it). Each reader calls
:func:`die_with_parent` first thing after it starts (the pool's initializer, ``fastloader.pack.readers``).

On Linux that asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to kill this process when its parent
dies. Two caveats, both handled:

* The signal fires when the parent *thread* that forked the child ends, not only the process. The
  readers are forked by the thread that runs the pack (the executor starts its processes from
  ``submit``, in the caller's thread), which outlives the pool: the pool is shut down before ``pack()``
  returns.
* A parent that died between the fork and the ``prctl`` call sends nothing: afterwards the child checks
  that its parent is still the process that started it, and exits when it is not.

Under the ``forkserver`` start method the readers' parent is the fork server, which exits when the pack
does (its end of the server's pipe closes); the check is then on the pack process itself. Elsewhere than
Linux there is no such call: readers there die when they next touch the broken pipe.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(creator: int, start_method: str) -> None:
    """Have the kernel SIGKILL this process when its parent dies; exit now if the pack ``creator`` (its pid)
    is gone already. ``start_method``: the multiprocessing start method that made this process."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(error)}")
    if start_method == "forkserver":
        alive = _exists(creator)  # the parent is the fork server; it goes when the pack goes
    else:
        alive = os.getppid() == creator  # fork and spawn: the pack is the parent; re-parented once it died
    if not alive:
        os._exit(1)  # no finalizers: this process's parent is gone, nobody waits for anything from it


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
