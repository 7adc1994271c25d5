"""What `wtnmt serve` is allowed to do: limits, batching and access, validated once.

Importing this module imports neither torch nor FastAPI, so the command line can check its
options before loading anything.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from wtnmt.config import ConfigError

API_KEY_ENV = "WTNMT_API_KEY"


@dataclass(frozen=True)
class ServeSettings:
    # limits of one request; each is answered with the number that was exceeded
    max_body_bytes: int = 1 << 20  # 413 beyond it
    max_sentences: int = 100  # sentences per request (422)
    max_chars: int = 1000  # characters per sentence (422, with the sentence's index)
    max_beam: int = 16  # beam and nbest in 1 … max_beam, nbest ≤ beam (422)
    max_queue: int = 1024  # sentences waiting for the model; a request beyond it gets 429
    timeout: float = 60.0  # seconds a request may wait for its translations (503)
    read_timeout: float = 10.0  # seconds a client may take to send its body (408)
    # seconds a connection may stay without a request begun (its headers whole), on arrival
    # and after each answer: closed then, so that sockets that send nothing, or trickle a
    # header line now and then, cannot hold connections
    header_timeout: float = 10.0
    max_connections: int = 256  # open connections and requests at once (503 beyond)
    # attention maps grow as sentences × layers × branches × target × source tokens: their
    # own limits (422), estimated before decoding from the longest output allowed
    max_attention_sentences: int = 16
    max_attention_cells: int = 500_000
    # dynamic batching: sentences of concurrent requests are gathered for up to batch_wait_ms
    # into length-sorted batches of at most batch_tokens padded source tokens
    batch_wait_ms: float = 5.0
    batch_tokens: int = 4096
    max_batch_sentences: int = 256  # 1 switches batching off (one sentence at a time)
    beam: int | None = None  # default beam (None: the run's decode.beam)
    api_key: str | None = None  # required as `Authorization: Bearer KEY` on /v1 and /metrics
    cors_origin: str | None = None  # one origin allowed to call the API from a browser

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_sentences", "max_chars", "max_beam", "max_queue"):
            _at_least(name, getattr(self, name), 1)
        for name in ("batch_tokens", "max_batch_sentences", "max_connections"):
            _at_least(name, getattr(self, name), 1)
        for name in ("max_attention_sentences", "max_attention_cells"):
            _at_least(name, getattr(self, name), 1)
        for name in ("timeout", "read_timeout", "header_timeout"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                option = name.replace("_", "-")
                raise ConfigError(f"--{option} {value}: must be more than 0 seconds")
        if not 0 <= self.batch_wait_ms <= 10_000:
            raise ConfigError(f"--batch-wait-ms {self.batch_wait_ms}: allowed 0 to 10000")
        if self.max_queue < self.max_sentences:
            raise ConfigError(
                f"--max-queue {self.max_queue} is less than --max-sentences "
                f"{self.max_sentences}: a full request could never be queued"
            )
        if self.beam is not None and not 1 <= self.beam <= self.max_beam:
            raise ConfigError(f"--beam {self.beam}: allowed 1 to --max-beam {self.max_beam}")
        if self.api_key is not None and not self.api_key.isprintable():
            raise ConfigError(
                f"the API key (--api-key or ${API_KEY_ENV}) has a character a header cannot "
                f"carry (a control character or a line break)"
            )
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError(f"the API key (--api-key or ${API_KEY_ENV}) is empty")


def _at_least(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"--{name.replace('_', '-')} {value!r}: must be a whole number ≥ {low}")


SETTING_NAMES = tuple(f.name for f in fields(ServeSettings))

__all__ = ["API_KEY_ENV", "SETTING_NAMES", "ServeSettings"]
