"""Worker processes that end with the process that started them, however it ends.

A worker pool's processes are ended by the pool when their parent shuts it down, but not when
the parent is killed (SIGKILL, the OOM killer) or ended by a signal it does not handle: they
would live on, holding their memory and the files they had open (seen: `wtnmt prepare
--workers 2` killed, both encoding workers alive 19 minutes later). On Linux a process can ask
the kernel for a signal when its parent ends (``prctl(PR_SET_PDEATHSIG)``); a worker asks it
first thing, and checks that its parent has not already gone in the meantime.

Free of torch: workers call it before their imports.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
PARENT_ENV = "WTNMT_PARENT_PID"  # a child started by Popen learns its parent's pid here


def end_with_parent(parent: int, signum: int = signal.SIGKILL) -> bool:
    """Have this process sent ``signum`` when ``parent`` (the pid of the process that started
    it) ends; sent at once where it has ended already. SIGKILL for a worker that holds nothing
    of its own; SIGTERM for one that saves its work when stopped (a grid's run). Whether the
    kernel took the request (False off Linux, where nothing is done)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        taken = libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if taken and os.getppid() != parent:  # the parent ended before the request was made
        os.kill(os.getpid(), signum)
    return taken


def end_with_parent_from_env(signum: int = signal.SIGTERM) -> bool:
    """``end_with_parent`` for a child whose parent put its pid in ``WTNMT_PARENT_PID``."""
    pid = os.environ.pop(PARENT_ENV, "")
    return pid.isdigit() and end_with_parent(int(pid), signum)


__all__ = ["PARENT_ENV", "end_with_parent", "end_with_parent_from_env"]
