"""Dynamic batching: the sentences of concurrent requests, translated together.

One worker thread owns the model. Each request puts its sentences on one queue (a ``Ticket``
holds its place and its answers) and awaits an asyncio future. The worker takes the oldest
waiting sentence, waits up to ``batch_wait_ms`` from its arrival for company, then translates
every queued sentence that asks for the same search (beam, n-best, branch weights), oldest
first, up to ``batch_tokens`` padded source tokens and ``max_batch_sentences``; the translator
sorts the batch by length. Each answer goes back to its own request's slot, so requests get
exactly their own translations in their own order.

A request that is cancelled (client gone, or out of time) has its sentences that are still
queued dropped; sentences already in a batch are translated and their answers discarded.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wtnmt.serve.metrics import Metrics

log = logging.getLogger("wtnmt.serve")


class PerSentence(list):  # type: ignore[type-arg]
    """A request's payload that holds one item a sentence (e.g. its forced target prefix):
    each sentence is translated with its own item."""


def _payload_of(job: _Job) -> Any:
    payload = job.ticket.payload
    return payload[job.index] if isinstance(payload, PerSentence) else payload


class QueueFull(Exception):
    def __init__(self, waiting: int, limit: int, retry_after: int) -> None:
        super().__init__(f"queue full: {waiting} sentences waiting, limit {limit}")
        self.waiting, self.limit, self.retry_after = waiting, limit, retry_after


class ServerStopping(Exception):
    """The server shut down before the request was answered."""


@dataclass(eq=False)
class Ticket:
    """One request's sentences on their way through the queue."""

    key: Hashable  # sentences batch together only under equal keys (the search options)
    payload: Any  # what the translate function needs to know of the request
    future: asyncio.Future[list[Any]]
    loop: asyncio.AbstractEventLoop
    results: list[Any]
    remaining: int  # sentences not answered yet
    queued: int  # sentences still waiting in the queue
    cancelled: bool = False


@dataclass(eq=False)
class _Job:
    ticket: Ticket
    index: int  # position in the request
    ids: list[int]
    arrived: float = field(default_factory=time.monotonic)


# translate(ids of the batch's sentences, the requests' payloads, one per sentence) → results
TranslateBatch = Callable[[list[list[int]], list[Any]], Sequence[Any]]


class Batcher:
    def __init__(
        self,
        translate: TranslateBatch,
        *,
        metrics: Metrics,
        max_queue: int,
        batch_wait_ms: float,
        batch_tokens: int,
        max_batch_sentences: int,
    ) -> None:
        self._translate = translate
        self._metrics = metrics
        self.max_queue = max_queue
        self._wait = batch_wait_ms / 1000
        self._budget = batch_tokens
        self._max_sentences = max_batch_sentences
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._depth = 0  # live sentences in the queue (cancelled ones excluded)
        self._rate = 0.0  # sentences per second lately (moving average), for Retry-After
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # set once the warm-up translation is done

    # ------------------------------------------------------------------ the event loop's side
    def submit(self, ids: list[list[int]], *, key: Hashable, payload: Any) -> Ticket:
        """Queue one request's sentences (call from the event loop). Raises ``QueueFull``."""
        loop = asyncio.get_running_loop()
        ticket = Ticket(
            key=key,
            payload=payload,
            future=loop.create_future(),
            loop=loop,
            results=[None] * len(ids),
            remaining=len(ids),
            queued=len(ids),
        )
        if not ids:
            ticket.future.set_result([])
            return ticket
        with self._cond:
            if self._stopping:
                raise ServerStopping("the server is shutting down")
            if self._depth + len(ids) > self.max_queue:
                raise QueueFull(self._depth, self.max_queue, self._retry_after())
            self._queue.extend(_Job(ticket, i, seq) for i, seq in enumerate(ids))
            self._depth += len(ids)
            self._metrics.queue_depth.set(self._depth)
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> int:
        """Drop the request's sentences still queued; returns how many were dropped."""
        with self._cond:
            if ticket.cancelled:
                return 0
            ticket.cancelled = True
            dropped, ticket.queued = ticket.queued, 0
            self._depth -= dropped
            self._metrics.queue_depth.set(self._depth)
        if dropped:
            self._metrics.dropped.inc(dropped)
        return dropped

    def _retry_after(self) -> int:
        """Seconds until the queue has likely drained (1 to 60)."""
        if self._rate <= 0:
            return 1
        return max(1, min(60, math.ceil(self._depth / self._rate)))

    # ------------------------------------------------------------------------- the worker
    def run(self, warmup: Callable[[], None] | None = None) -> None:
        """Be the worker in the calling thread until ``stop``.

        `wtnmt serve` calls this in the main thread, where the model was loaded: torch's
        OpenMP pool belongs to the thread that first ran parallel work, and a second thread
        doing the model's work gets a second pool, which on 2 cores made single-sentence
        decoding 1.8× slower (measured: 42.8 against 23.1 ms a sentence, beam 4).
        """
        if warmup is not None:
            warmup()
        self.ready.set()
        while (batch := self._next_batch()) is not None:
            self._run(batch)

    def start(self, warmup: Callable[[], None] | None = None) -> None:
        """Run the worker in a thread of its own (for embedding and tests)."""
        self._thread = threading.Thread(
            target=self.run, args=(warmup,), name="wtnmt-model", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batch in hand, then fail every request still waiting."""
        with self._cond:
            self._stopping = True
            left = [job for job in self._queue if not job.ticket.cancelled]
            self._queue.clear()
            self._depth = 0
            self._cond.notify_all()
        for ticket in {job.ticket for job in left}:
            _resolve(ticket, error=ServerStopping("the server shut down before translating"))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _next_batch(self) -> list[_Job] | None:
        with self._cond:
            while True:
                while self._queue and self._queue[0].ticket.cancelled:
                    self._queue.popleft()
                if self._stopping:
                    return None
                if self._queue:
                    break
                self._cond.wait()
            first = self._queue[0]
            # wait for company: up to batch_wait_ms from the oldest sentence's arrival
            while not self._stopping and not self._full(first.ticket.key):
                left = first.arrived + self._wait - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._stopping:
                return None
            return self._take(first.ticket.key)

    def _fits(self, count: int, longest: int) -> bool:
        """Whether ``count`` sentences padded to ``longest`` pieces (+ EOS) fit one batch."""
        return count <= self._max_sentences and count * (longest + 1) <= self._budget

    def _full(self, key: Hashable) -> bool:
        count = longest = 0
        for job in self._queue:
            if job.ticket.key == key and not job.ticket.cancelled:
                count, longest = count + 1, max(longest, len(job.ids))
                if not self._fits(count, longest):
                    return True
        return False

    def _take(self, key: Hashable) -> list[_Job]:
        """The oldest live sentences under ``key`` that fit one batch (at least one)."""
        batch: list[_Job] = []
        rest: deque[_Job] = deque()
        longest = 0
        for job in self._queue:
            if job.ticket.cancelled:
                continue
            fits = job.ticket.key == key and (
                not batch or self._fits(len(batch) + 1, max(longest, len(job.ids)))
            )
            if fits:
                batch.append(job)
                longest = max(longest, len(job.ids))
                job.ticket.queued -= 1
            else:
                rest.append(job)
        self._queue = rest
        self._depth -= len(batch)
        self._metrics.queue_depth.set(self._depth)
        return batch

    def _run(self, batch: list[_Job]) -> None:
        start = time.monotonic()
        m = self._metrics
        for job in batch:
            m.queue_seconds.observe(start - job.arrived)
        try:
            payloads = [_payload_of(j) for j in batch]
            results = self._translate([j.ids for j in batch], payloads)
        except Exception as error:  # the request fails, the server goes on
            log.exception("translating a batch of %d sentences failed", len(batch))
            for ticket in {job.ticket for job in batch}:
                self.cancel(ticket)  # its other sentences need not be translated now
                _resolve(ticket, error=error)
            return
        seconds = time.monotonic() - start
        m.batches.inc()
        m.batch_sentences.observe(len(batch))
        m.batch_requests.observe(len({id(job.ticket) for job in batch}))
        m.batch_seconds.observe(seconds)
        m.sentences.inc(len(batch))
        rate = len(batch) / max(seconds, 1e-6)
        self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate
        for job, result in zip(batch, results, strict=True):
            ticket = job.ticket
            ticket.results[job.index] = result
            ticket.remaining -= 1
            if ticket.remaining == 0 and not ticket.cancelled:
                _resolve(ticket, result=ticket.results)


def _resolve(
    ticket: Ticket, *, result: list[Any] | None = None, error: BaseException | None = None
) -> None:
    """Hand a request its answers (or its error) on its own event loop."""

    def settle() -> None:
        if ticket.future.done():  # the request gave up meanwhile
            return
        if error is not None:
            ticket.future.set_exception(error)
        else:
            ticket.future.set_result(result or [])

    try:
        ticket.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the event loop is closed: nobody is waiting any more
        pass


__all__ = ["Batcher", "QueueFull", "ServerStopping", "Ticket"]
