"""The server's Prometheus metrics, on a registry of its own (one per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# seconds: from a few milliseconds (one short sentence) to the default request timeout
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "wtnmt_requests", "HTTP requests answered", ["path", "status"], registry=r
        )
        self.rejections = Counter(
            "wtnmt_rejections",
            "requests refused or abandoned, by reason",
            ["reason"],
            registry=r,
        )
        self.sentences = Counter("wtnmt_sentences", "sentences translated", registry=r)
        self.tokens = Counter(
            "wtnmt_tokens", "subword tokens translated, by side", ["side"], registry=r
        )
        self.dropped = Counter(
            "wtnmt_dropped_sentences",
            "queued sentences dropped untranslated (client gone, timed out or request failed)",
            registry=r,
        )
        self.queue_depth = Gauge("wtnmt_queue_depth", "sentences waiting for the model", registry=r)
        self.batches = Counter("wtnmt_batches", "batches translated", registry=r)
        self.batch_sentences = Histogram(
            "wtnmt_batch_sentences", "sentences per batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "wtnmt_batch_requests",
            "distinct requests whose sentences shared a batch",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "wtnmt_batch_seconds",
            "time the model took for one batch",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "wtnmt_request_seconds",
            "time from a translation request's arrival to its answer",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "wtnmt_queue_seconds",
            "time a sentence waited before its batch started",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )


__all__ = ["Metrics"]
