"""ASGI middleware of the server: the request-body limit and deadline, per-request metrics.

Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``, which would stand between the
endpoint and the connection's ``receive`` (the translate endpoint listens there for the
client going away).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wtnmt.serve.errors import ApiError
from wtnmt.serve.metrics import Metrics


async def send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(data)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class BodyLimit:
    """413 for a request body over ``max_bytes``: at once when Content-Length says so, else as
    soon as the streamed body passes the limit."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, metrics: Metrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    def _message(self, size: int | None) -> str:
        what = f"{size:,} bytes" if size is not None else "more bytes than that"
        return f"request body has {what}; at most {self.max_bytes:,} are accepted"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            self.metrics.rejections.labels(reason="body_too_large").inc()
            body = {"detail": self._message(int(declared)), "limit": self.max_bytes}
            await send_json(send, 413, body)
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # a body sent without its length
                    raise ApiError(
                        413, self._message(None), reason="body_too_large", limit=self.max_bytes
                    )
            return message

        await self.app(scope, counted_receive, send)


class BodyDeadline:
    """408 for a request whose body has not all arrived ``seconds`` after the request began:
    a client that sends half a body and waits holds nothing of the server's for longer. The
    connection closes with the answer (its body unread, it cannot carry another request)."""

    def __init__(self, app: ASGIApp, *, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        complete = False

        async def timed_receive() -> Message:
            nonlocal complete
            if complete:  # the body is in: what follows is the client going away
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                raise ApiError(
                    408,
                    f"the request body did not arrive within {self.seconds:g} s",
                    reason="read_timeout",
                    limit=self.seconds,
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, timed_receive, send)


_log = logging.getLogger("wtnmt.serve.requests")


class RequestMetrics:
    """Counts every answer by path and status; times translation requests; logs a line per
    request at INFO on the ``wtnmt.serve`` logger (method, path, status, milliseconds; no
    text, no client address)."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, paths: set[str]) -> None:
        self.app, self.metrics, self.paths = app, metrics, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client gets if the app fails before answering

        async def watched_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            seconds = time.perf_counter() - start
            path = scope["path"] if scope["path"] in self.paths else "other"
            self.metrics.requests.labels(path=path, status=str(status)).inc()
            if path == "/v1/translate":
                self.metrics.request_seconds.observe(seconds)
            _log.info("%s %s %d %.1f ms", scope.get("method", "?"), path, status, 1000 * seconds)


__all__ = ["BodyDeadline", "BodyLimit", "RequestMetrics", "send_json"]
