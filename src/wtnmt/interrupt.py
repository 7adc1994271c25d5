"""Ctrl-C (SIGINT) during training as a request to stop at the next update boundary, so that
the checkpoint saved then is never taken halfway through an optimizer step; a second Ctrl-C
interrupts at once.

Free of torch, so that a process can take SIGINT over before its slow imports: a grid's run
(``wtnmt.experiment.job``) is stopped by a SIGINT that may come while it still imports, and
a KeyboardInterrupt raised inside torch's import can be swallowed there, leaving the run to
train on past the stop (seen with a signal 0.6 s after start). A request is never lost: it
is a flag, read by the training loop before each update. The command line's commands hold
SIGINT the same way while they import torch (``held``) and raise it once the import is done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_requested = False


def _handle(signum: int, frame: object) -> None:
    global _requested
    if _requested:
        raise KeyboardInterrupt
    _requested = True


def take_over() -> Any:
    """Make SIGINT a request (in the main thread, where Python delivers signals); returns
    the handler it replaced. A request made before is kept where the handler was this one
    already (a grid's run took SIGINT over before its imports), else forgotten."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.signal(signal.SIGINT, _handle)
    if previous is not _handle:
        _requested = False
    return previous


def give_back(previous: Any) -> None:
    """Put back the handler ``take_over`` replaced (Python's default where there was none
    from Python); the outermost give-back forgets the request, which has been read."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    if previous is not _handle:
        _requested = False


def requested() -> bool:
    """Whether SIGINT has come since the handler was taken over."""
    return _requested


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGINT held during the block and raised as KeyboardInterrupt when it ends, for an
    import that can lose it (``wtnmt train`` started and stopped at once trained on where
    the signal came during torch's import). Where SIGINT is already a request (a grid's
    run), the request stays for the training loop to read."""
    previous = take_over()
    try:
        yield
    finally:
        came = _requested
        give_back(previous)
    if came and previous is not _handle:
        raise KeyboardInterrupt


__all__ = ["give_back", "held", "requested", "take_over"]


if __name__ == "__main__":
    # python -m wtnmt.interrupt MODULE ARG...: MODULE run as `python -m MODULE ARG...` would
    # run it, SIGINT a request from before its first import (how a grid starts its runs)
    import runpy
    import sys

    from wtnmt import interrupt  # this file runs as __main__: the flag is the module's

    interrupt.take_over()
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
