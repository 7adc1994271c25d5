"""Ctrl-C (SIGINT) and SIGTERM during training as a request to stop at the next update
boundary, so that the checkpoint saved then is never taken halfway through an optimizer step;
a second signal interrupts at once. SIGTERM is what ``timeout``, ``kill``, ``docker stop``,
systemd and a cluster's pre-emption (Slurm, Kubernetes) send: a run stopped so keeps
everything up to its last update, as one stopped by Ctrl-C does.

Free of torch, so that a process can take the signals over before its slow imports: a grid's
run (``wtnmt.experiment.job``) is stopped by a SIGINT that may come while it still imports,
and a KeyboardInterrupt raised inside torch's import can be swallowed there, leaving the run to
train on past the stop (seen with a signal 0.6 s after start). A request is never lost: it
is a flag, read by the training loop before each update. The command line's commands hold
the signals the same way while they import torch (``held``) and raise them once the import is
done. ``exit_status`` is the status a command stopped so ends with: 130 for SIGINT, 143 for
SIGTERM (128 + the signal's number, as a shell reports a process the signal ended).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_requested = 0  # the signal asking to stop (0: none), until the outermost give-back
_last = 0  # the last signal that asked, kept for the exit status


@dataclass(frozen=True)
class Handlers:
    """The handlers ``take_over`` replaced, SIGINT's and SIGTERM's."""

    sigint: Any
    sigterm: Any

    @property
    def ours(self) -> bool:
        """Whether they were this module's already (an inner take-over)."""
        return self.sigint is _handle


def _handle(signum: int, frame: object) -> None:
    global _requested, _last
    if _requested:
        raise KeyboardInterrupt
    _requested = _last = signum


def take_over() -> Handlers | None:
    """Make SIGINT and SIGTERM requests (in the main thread, where Python delivers signals);
    returns the handlers it replaced. A request made before is kept where the handlers were
    this module's already (a grid's run took them over before its imports), else forgotten."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = Handlers(*(signal.signal(s, _handle) for s in SIGNALS))
    if not previous.ours:
        _requested = 0
    return previous


def give_back(previous: Handlers | None) -> None:
    """Put back the handlers ``take_over`` replaced (Python's defaults where there were none
    from Python); the outermost give-back forgets the request, which has been read."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        return
    if previous is None:
        previous = Handlers(signal.default_int_handler, signal.SIG_DFL)
    for signum, handler in zip(SIGNALS, (previous.sigint, previous.sigterm), strict=True):
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    if not previous.ours:
        _requested = 0


def requested() -> bool:
    """Whether SIGINT or SIGTERM has come since the handlers were taken over."""
    return bool(_requested)


def signal_name() -> str:
    """The signal that asked to stop, for a log line ("Ctrl-C" for SIGINT)."""
    signum = _requested or _last
    return "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C (SIGINT)"


def exit_status() -> int:
    """The exit status of a command stopped by the last request: 143 after SIGTERM, else 130."""
    return 128 + (_last or signal.SIGINT)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGINT and SIGTERM held during the block and raised as KeyboardInterrupt when it ends,
    for an import that can lose them (``wtnmt train`` started and stopped at once trained on
    where the signal came during torch's import). Where they are already requests (a grid's
    run), the request stays for the training loop to read."""
    previous = take_over()
    try:
        yield
    finally:
        came = _requested
        give_back(previous)
    if came and previous is not None and not previous.ours:
        raise KeyboardInterrupt


__all__ = [
    "Handlers",
    "exit_status",
    "give_back",
    "held",
    "requested",
    "signal_name",
    "take_over",
]


if __name__ == "__main__":
    # python -m wtnmt.interrupt MODULE ARG...: MODULE run as `python -m MODULE ARG...` would
    # run it, SIGINT and SIGTERM requests from before its first import (how a grid starts its
    # runs); where the parent gave its pid (WTNMT_PARENT_PID), its end is a SIGTERM here, so
    # that a run never trains on after its grid's runner was killed
    import runpy
    import sys

    from wtnmt import interrupt  # this file runs as __main__: the flag is the module's
    from wtnmt.lifeline import end_with_parent_from_env

    interrupt.take_over()
    end_with_parent_from_env(signal.SIGTERM)
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
