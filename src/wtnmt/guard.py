"""Running a command so that a user's mistake is one line on stderr and exit status 2, never
a traceback: the guard around every command of the command line and of `wtnmt experiment`'s
child processes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from wtnmt.config import ConfigError


def run_guarded(command: str, body: Callable[[], int]) -> int:
    """Run a command's body: a user's mistake is one line on stderr and exit status 2, Ctrl-C
    is 130 (SIGTERM, where a command takes it, 143), never a traceback."""
    from wtnmt.data import DataError
    from wtnmt.errors import CheckpointError, DecodingError, EngineUnavailable, TrainingError

    try:
        return body()
    except (
        ConfigError,
        DataError,
        TrainingError,
        CheckpointError,
        EngineUnavailable,
        DecodingError,
    ) as e:
        print(f"wtnmt {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from wtnmt import interrupt

        print(f"wtnmt {command}: interrupted", file=sys.stderr)
        return interrupt.exit_status()  # 130 for Ctrl-C, 143 for SIGTERM
    except BrokenPipeError:
        # the reader went away (`wtnmt translate | head -1`): stdout can take no more, not
        # even the interpreter's last flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(
            f"wtnmt {command}: error: the output was closed before it was all written",
            file=sys.stderr,
        )
        return 2
    except OSError as e:  # a full disk, a device that refuses writes, a file gone
        where = f"{e.filename}: " if e.filename else ""
        print(f"wtnmt {command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


__all__ = ["run_guarded"]
