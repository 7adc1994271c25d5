"""The real server's connections (`wtnmt serve`'s uvicorn settings, serve/connections.py)
against clients that send half a body and wait, connections beyond the cap, idle and trickling
sockets, and attention maps too large to send; `wtnmt serve` itself with a half-body client
from another process. (What a request may hold: test_serve_limits.py.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest

from serving import LiveServer, served_at, shared_tiny_run
from wtnmt import Translator
from wtnmt.serve.app import create_app
from wtnmt.serve.main import server_config
from wtnmt.serve.settings import ServeSettings

pytestmark = pytest.mark.slow  # real servers and sockets with timeouts of seconds


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    return Translator.load(shared_tiny_run(tmp_path_factory))


class Live(LiveServer):
    """The real server with the command's own uvicorn settings (connection cap, keep-alive)."""

    def __init__(self, app, settings: ServeSettings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(app)
        import uvicorn

        self.server = uvicorn.Server(server_config(app, settings, log_level="warning"))
        self.thread.__init__(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)


def _half_a_body(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)))
    conn.sendall(
        b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"text": "al'
    )
    return conn


def test_a_slow_client_gets_408_and_the_connection_back(translator):
    settings = ServeSettings(read_timeout=1.0)
    with Live(create_app(translator, settings), settings) as live:
        slow = [_half_a_body(live.url) for _ in range(20)]
        start = time.monotonic()
        for conn in slow:
            conn.settimeout(10)
            answer = b""
            while chunk := conn.recv(4096):  # read until the server closes the connection
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
            assert b"did not arrive within 1 s" in answer
            conn.close()
        assert time.monotonic() - start < 8  # each was let go at its deadline, not later
        assert httpx.post(live.url + "/v1/translate", json={"text": "a"}).status_code == 200


def test_connections_beyond_the_cap_are_refused_not_queued(translator):
    settings = ServeSettings(read_timeout=30.0, max_connections=4)
    with Live(create_app(translator, settings), settings) as live:
        held = [_half_a_body(live.url) for _ in range(4)]
        time.sleep(0.5)
        r = httpx.post(live.url + "/v1/translate", json={"text": "a"}, timeout=10)
        assert r.status_code == 503
        for conn in held:
            conn.close()


def _closed_by_the_server(conn: socket.socket, within: float) -> bool:
    conn.settimeout(within)
    try:
        while conn.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_idle_and_trickling_connections_neither_starve_requests_nor_stay(translator):
    """60 sockets that connect and send nothing and 5 that trickle a header line every half
    second, against a cap of 20 connections: a real request is answered at once (an idle
    connection makes room for it), and each of them is closed within the header timeout."""
    settings = ServeSettings(max_connections=20, header_timeout=2.0)
    with Live(create_app(translator, settings), settings) as live:
        host, port = live.url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(60)]
        trickle = [socket.create_connection((host, int(port))) for _ in range(5)]
        for conn in trickle:
            conn.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        start = time.monotonic()
        r = httpx.post(live.url + "/v1/translate", json={"text": "alpha"}, timeout=10)
        assert r.status_code == 200, r.text
        assert time.monotonic() - start < 2
        for _ in range(6):  # a header line every 0.5 s: never a whole request
            for conn in trickle:
                try:
                    conn.sendall(b"X-Slow: 1\r\n")
                except OSError:  # closed already
                    pass
            time.sleep(0.5)
        for conn in trickle + idle:
            assert _closed_by_the_server(conn, within=3.0)
            conn.close()
        assert httpx.post(live.url + "/v1/translate", json={"text": "a"}).status_code == 200


def test_oversized_attention_against_the_real_server(translator):
    settings = ServeSettings(max_attention_cells=10_000)
    with Live(create_app(translator, settings), settings) as live:
        long = " ".join(["alpha"] * 40)
        r = httpx.post(live.url + "/v1/translate", json={"text": [long] * 4, "attention": True})
        assert r.status_code == 422 and r.json()["field"] == "attention"
        assert len(r.content) < 1000  # refused before anything was decoded or sent
        r = httpx.post(live.url + "/v1/translate", json={"text": "alpha", "attention": True})
        assert r.status_code == 200


def test_serve_with_a_half_body_client_from_another_process(tmp_path_factory):
    """`wtnmt serve` itself: its --read-timeout reaches the real server."""
    run_dir = shared_tiny_run(tmp_path_factory)
    proc = subprocess.Popen(
        [sys.executable, "-m", "wtnmt.cli", "serve", str(run_dir), "--port", "0",
         "--read-timeout", "1"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url, _ = served_at(proc.stderr)
        deadline = time.monotonic() + 60
        while httpx.get(url + "/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        conn = _half_a_body(url)
        conn.settimeout(10)
        assert conn.recv(4096).startswith(b"HTTP/1.1 408 ")
        conn.close()
    finally:
        proc.terminate()
        proc.wait(30)
