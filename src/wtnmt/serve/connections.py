"""Connections that cannot hold the server: uvicorn's HTTP protocol with two guards.

uvicorn starts no clock on a connection until its request's headers are whole, and counts
every open connection against ``limit_concurrency``: a few hundred sockets that connect and
send nothing (or a header line every few seconds) made every real request a 503 for as long
as they stayed. Here

- a connection must begin a request (its headers whole) within ``header_timeout`` seconds of
  arriving, and again of each answer, or it is closed;
- a connection that arrives when the cap is reached closes the connection idle longest (no
  request in progress: waiting for headers, or kept alive after an answer), so a real client
  gets in; a 503 is left for when every connection is busy with a request.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


def guarded_protocol(header_timeout: float) -> type:
    """uvicorn's HTTP protocol class (httptools where installed, else h11) with the guards."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Guarded(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _idle_since: float | None = None
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._wait_for_a_request()
            self._make_room()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._wait_for_a_request()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _wait_for_a_request(self) -> None:
            """Close the connection if no request has begun ``header_timeout`` from now."""
            self._idle_since = time.monotonic()
            if self._header_timer is not None:
                self._header_timer.cancel()
            waited_after = self.cycle

            def check() -> None:
                if self.cycle is waited_after and not self.transport.is_closing():
                    self.transport.close()

            self._header_timer = self.loop.call_later(header_timeout, check)

        def _make_room(self) -> None:
            limit = self.limit_concurrency
            while limit is not None and len(self.connections) >= limit:
                idle: list[Any] = [
                    c
                    for c in self.connections
                    if c is not self and getattr(c, "_idle_since", None) is not None and c._idle()
                ]
                if not idle:
                    return  # every other one is busy: uvicorn answers 503
                oldest = min(idle, key=lambda c: c._idle_since)
                oldest.transport.close()
                self.connections.discard(oldest)

    return Guarded


__all__ = ["guarded_protocol"]
