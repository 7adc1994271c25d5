"""Dynamic batching without a model: a translate function that records what it was given."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from wtnmt.serve.batcher import Batcher, QueueFull, ServerStopping
from wtnmt.serve.metrics import Metrics


class Recorder:
    """'Translates' ids by reversing them; remembers every batch; can be held or made to fail."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []
        self.payloads: list[list[object]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = False

    def __call__(self, ids: list[list[int]], payloads: list[object]) -> list[list[int]]:
        self.entered.set()
        self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the model fell over")
        self.batches.append(ids)
        self.payloads.append(payloads)
        return [seq[::-1] for seq in ids]


def with_batcher(test: Callable, **options) -> None:  # type: ignore[type-arg]
    settings = dict(max_queue=64, batch_wait_ms=50, batch_tokens=10_000, max_batch_sentences=64)
    settings.update(options)
    recorder = Recorder()
    batcher = Batcher(recorder, metrics=Metrics(), **settings)
    batcher.start()

    async def main() -> None:
        try:
            await test(batcher, recorder)
        finally:
            await asyncio.to_thread(batcher.stop)

    asyncio.run(main())


def test_concurrent_requests_share_a_batch_and_get_their_own_answers():
    async def test(batcher, recorder):
        requests = [[[i, i + 1, i + 2]] * (1 + i % 3) for i in range(10)]
        tickets = [batcher.submit(r, key="beam4", payload=n) for n, r in enumerate(requests)]
        answers = await asyncio.gather(*(t.future for t in tickets))
        for request, answer in zip(requests, answers, strict=True):
            assert answer == [seq[::-1] for seq in request]
        assert len(recorder.batches) == 1  # all within the 50 ms window: one batch
        assert sum(map(len, recorder.batches)) == sum(map(len, requests))

    with_batcher(test)


def test_different_searches_never_share_a_batch():
    async def test(batcher, recorder):
        a = batcher.submit([[1], [2]], key=("beam", 4), payload="a")
        b = batcher.submit([[3]], key=("beam", 1), payload="b")
        c = batcher.submit([[4]], key=("beam", 4), payload="c")
        assert await a.future == [[1], [2]] and await b.future == [[3]] and await c.future == [[4]]
        assert sorted(map(sorted, recorder.payloads)) == [["a", "a", "c"], ["b"]]

    with_batcher(test)


def test_batches_are_bounded_by_tokens_and_sentences():
    async def test(batcher, recorder):
        tickets = [batcher.submit([[7] * 9], key=0, payload=None) for _ in range(7)]
        await asyncio.gather(*(t.future for t in tickets))
        # (9 + 1) tokens each under a 30-token budget: at most 3 sentences a batch
        assert [len(b) for b in recorder.batches] == [3, 3, 1]

    with_batcher(test, batch_tokens=30)

    async def test_sentences(batcher, recorder):
        ticket = batcher.submit([[1]] * 5, key=0, payload=None)
        assert await ticket.future == [[1]] * 5
        assert [len(b) for b in recorder.batches] == [1] * 5  # batching off

    with_batcher(test_sentences, max_batch_sentences=1)


def test_a_cancelled_request_has_its_queued_sentences_dropped():
    async def test(batcher, recorder):
        recorder.gate.clear()  # the worker holds the first batch
        first = batcher.submit([[1]], key=0, payload="first")
        await asyncio.to_thread(recorder.entered.wait, 5)
        gone = batcher.submit([[2], [3], [4]], key=0, payload="gone")
        kept = batcher.submit([[5]], key=0, payload="kept")
        assert batcher.cancel(gone) == 3 and batcher.cancel(gone) == 0
        recorder.gate.set()
        assert await first.future == [[1]] and await kept.future == [[5]]
        assert [p for batch in recorder.payloads for p in batch] == ["first", "kept"]
        assert batcher._metrics.dropped._value.get() == 3
        assert batcher._metrics.queue_depth._value.get() == 0

    with_batcher(test)


def test_a_full_queue_refuses_with_a_retry_time():
    async def test(batcher, recorder):
        recorder.gate.clear()
        batcher.submit([[1]], key=0, payload=None)
        await asyncio.to_thread(recorder.entered.wait, 5)
        batcher.submit([[2], [3], [4]], key=0, payload=None)  # 3 of 4 places taken
        with pytest.raises(QueueFull) as refused:
            batcher.submit([[5], [6]], key=0, payload=None)
        assert refused.value.waiting == 3 and refused.value.limit == 4
        assert 1 <= refused.value.retry_after <= 60
        batcher.submit([[7]], key=0, payload=None)  # exactly full is allowed
        recorder.gate.set()

    with_batcher(test, max_queue=4)


def test_a_failing_batch_fails_its_requests_and_the_worker_goes_on():
    async def test(batcher, recorder):
        recorder.fail_next = True
        broken = batcher.submit([[1]], key=0, payload=None)
        with pytest.raises(RuntimeError, match="fell over"):
            await broken.future
        fine = batcher.submit([[2, 3]], key=0, payload=None)
        assert await fine.future == [[3, 2]]

    with_batcher(test)


def test_stopping_fails_the_requests_still_waiting():
    async def test(batcher, recorder):
        recorder.gate.clear()
        running = batcher.submit([[1]], key=0, payload=None)
        await asyncio.to_thread(recorder.entered.wait, 5)
        waiting = batcher.submit([[2]], key=0, payload=None)
        stopper = asyncio.ensure_future(asyncio.to_thread(batcher.stop))
        await asyncio.sleep(0.05)
        recorder.gate.set()
        await stopper
        assert await running.future == [[1]]  # the batch in hand is finished
        with pytest.raises(ServerStopping):
            await waiting.future
        with pytest.raises(ServerStopping):
            batcher.submit([[3]], key=0, payload=None)

    with_batcher(test)


def test_an_empty_request_is_answered_at_once():
    async def test(batcher, recorder):
        assert await batcher.submit([], key=0, payload=None).future == []
        assert recorder.batches == []

    with_batcher(test)
