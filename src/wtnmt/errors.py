"""Errors the command line reports as a one-line message (no traceback). Importing this
module imports no torch."""


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and where."""


class CheckpointError(RuntimeError):
    """A file that is not a usable checkpoint; the message names it."""


class EngineUnavailable(RuntimeError):
    """The decoding engine asked for cannot run here (e.g. ``--engine native`` without a C++
    compiler); the message says why."""


class DecodingError(RuntimeError):
    """Decoding stopped part way (e.g. a decoding worker was killed); the message says why."""
