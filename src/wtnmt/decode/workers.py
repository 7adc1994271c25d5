"""Decoding on worker processes, each searching whole batches on its own core(s).

A decoding step on a CPU is a few hundred small operations, and splitting each of them across
cores pays a fork-join per operation: on 2 cores, greedy search of batches of 32 sentences
(the `small` Weighted Transformer, int8) ran only 1.17× faster on 2 threads than on 1, and
beam 5 1.39×. Two single-threaded workers, each decoding its own batches, translated 1.54×
(greedy) and 1.18× (beam 5) as many sentences a second as one process on 2 threads. This is
how Marian (``--cpu-threads``) and CTranslate2 (``inter_threads``) decode on CPUs.

Workers are spawned processes (not threads: Python's interpreter lock would serialise the
search's many small calls). Each rebuilds the model from its config and weights, sent once
when it starts, and keeps it for its life; batches go out as token ids and come back as
hypotheses, in order. For many sentences (a file), not one: starting a worker takes seconds.
Each searches with the PyTorch engine or the native one (decode/native: the extension the
parent built, loaded from its cache). The native engine's steps split across threads with far
fewer fork-joins: two workers decoded only 1.07-1.10× as fast as one process on 2 threads
(docs/BENCHMARKS.md, "On workers").
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch
from torch import Tensor

from wtnmt.decode.search import Hypothesis, search_batch
from wtnmt.errors import DecodingError
from wtnmt.lifeline import end_with_parent

_model: Any = None  # a worker's model (or its native engine), built once by _start
_start_error: str | None = None  # why _start could not build it, said at the first search


class _StartFailed(RuntimeError):
    """A worker could not build its model; raised by its searches, so that the parent process
    says why in one line (an initializer that raises leaves only a broken pool, and a child's
    traceback on stderr)."""


def _start(parent: int, *args: Any) -> None:
    """A worker's initializer: it ends with ``parent`` (however that ends), then
    _build(*args), or the reason it failed into _start_error."""
    global _start_error
    end_with_parent(parent)
    try:
        _build(*args)
    except Exception as e:  # (MemoryError included)
        why = " ".join(str(e).split())  # one line, however many the message had
        why = why if len(why) <= 300 else why[:299] + "…"
        _start_error = f"{type(e).__name__}: {why}" if why else type(e).__name__


def _build(
    model_config: Any,
    sizes: tuple[int, int | None],
    state: dict,
    int8: bool,
    threads: int,
    engine: str,
) -> None:
    global _model
    from wtnmt.model import build_model, quantize_decoding
    from wtnmt.runtime import tune_cpu_allocator

    torch.set_num_threads(threads)
    tune_cpu_allocator()
    model = build_model(model_config, vocab_size=sizes[0], source_vocab_size=sizes[1])
    model.load_state_dict(state)
    if int8:
        quantize_decoding(model, "int8")
    _model = model.eval()
    if engine == "native":
        from wtnmt.decode.native.network import NativeEngine

        _model = NativeEngine(model)


def _worker_engine() -> str:
    """The engine this worker searches with (for tests: run through the pool)."""
    return str(getattr(_model, "engine", "pytorch"))


def _search(job: tuple[Tensor, dict]) -> list[list[Hypothesis]]:
    src, options = job
    if _start_error is not None:
        raise _StartFailed(_start_error)
    assert _model is not None, "a worker searches only after _start"
    return search_batch(_model, src, **options)


ENGINES = ("pytorch", "native")  # what a worker searches with


def _cpu(value: Any) -> Any:
    return value.cpu() if isinstance(value, Tensor) else value


class SearchWorkers:
    """``workers`` processes, each holding a copy of ``model`` (CPU) and decoding on
    ``threads`` threads. ``int8``: its linear layers decode in int8 (quantize_decoding).
    ``engine``: ``native`` searches with decode/native's engine, whose extension the caller
    has built (``NativeEngine(model)`` in this process does)."""

    def __init__(
        self,
        model,  # type: ignore[no-untyped-def]
        *,
        model_config: Any,
        int8: bool,
        workers: int,
        threads: int = 1,
        engine: str = "pytorch",
    ) -> None:
        if workers < 1 or threads < 1:
            raise ValueError(f"workers={workers}, threads={threads}: each must be at least 1")
        if engine not in ENGINES:
            raise ValueError(f"engine: {engine!r}: workers search with {' or '.join(ENGINES)}")
        state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        sizes = (model.embedding.weight.size(0), model.source_vocab_size)
        self.workers, self.engine = workers, engine
        self._pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(os.getpid(), model_config, sizes, state, int8, threads, engine),
        )

    def search(
        self,
        sources: Sequence[Tensor],
        per_batch: Sequence[dict[str, Any]] | None = None,
        **options: Any,
    ) -> Iterator[list[list[Hypothesis]]]:
        """``search_batch(model, src, **options, **per_batch[i])`` for each batch ``i`` of
        ``sources``, in order (``per_batch``: options of each batch, e.g. its forced target
        prefix). Raises DecodingError (one line) if a worker could not start or dies (killed,
        out of memory)."""
        more: Sequence[dict[str, Any]] = per_batch or [{} for _ in sources]
        jobs = [
            (src.cpu(), {**options, **{k: _cpu(v) for k, v in own.items()}})
            for src, own in zip(sources, more, strict=True)
        ]
        try:
            yield from self._pool.map(_search, jobs)
        except _StartFailed as e:
            raise DecodingError(f"a decoding worker could not start: {e}") from None
        except BrokenProcessPool:
            raise DecodingError(
                "a decoding worker died (killed, or out of memory: try fewer --workers)"
            ) from None

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SearchWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["SearchWorkers"]
