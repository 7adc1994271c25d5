"""`wtnmt serve RUN_DIR`: options, checks, and uvicorn.

Everything a user can get wrong (a limit, a busy port, a missing extra, a device the machine
lacks) is checked before the model is loaded, and answered with one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from wtnmt import interrupt
from wtnmt.cli_args import add_ensemble
from wtnmt.config import ConfigError
from wtnmt.runtime import check_device, check_engine, check_quantize
from wtnmt.serve.settings import API_KEY_ENV, ServeSettings

_LIMITS = (  # option, type, help
    ("--max-body-bytes", int, "largest request body (413 beyond it)"),
    ("--max-sentences", int, "sentences per request (422 beyond it)"),
    ("--max-chars", int, "characters per sentence (422 beyond it)"),
    ("--max-beam", int, "largest beam and n-best a request may ask for (422 beyond it)"),
    ("--max-queue", int, "sentences waiting for the model before requests get 429"),
    ("--timeout", float, "seconds a request may wait for its translations (503 after it)"),
    ("--read-timeout", float, "seconds a client may take to send its request body (408)"),
    ("--header-timeout", float, "seconds a connection may stay without a request's headers"),
    (
        "--max-connections",
        int,
        "connections at once: an idle one is closed for a new one; 503 when all are busy",
    ),
    ("--max-attention-sentences", int, "sentences per request that ask for attention maps"),
    ("--max-attention-cells", int, "attention-map numbers per request, estimated (422)"),
    ("--batch-wait-ms", float, "how long the oldest queued sentence waits for company"),
    ("--batch-tokens", int, "padded source tokens per batch"),
    ("--max-batch-sentences", int, "sentences per batch (1: no batching)"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a trained run directory (config.yaml, spm.model, weights)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free one; default 8000)")
    p.add_argument("--beam", type=int, help="default beam size (default: the run's decode.beam)")
    p.add_argument("--threads", type=int, help="CPU threads for the model")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' (or set ${API_KEY_ENV})")
    p.add_argument("--cors", metavar="ORIGIN", help="let pages from ORIGIN call the API")
    defaults = ServeSettings()
    for option, kind, text in _LIMITS:
        name = option[2:].replace("-", "_")
        p.add_argument(option, type=kind, help=f"{text} (default {getattr(defaults, name)})")
    add_ensemble(p)
    p.add_argument("--no-batching", action="store_true", help="translate one sentence at a time")
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="what the server logs (default info)",
    )


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    limits = {
        option[2:].replace("-", "_"): getattr(args, option[2:].replace("-", "_"))
        for option, _, _ in _LIMITS
    }
    given = {name: value for name, value in limits.items() if value is not None}
    if args.no_batching:
        given["max_batch_sentences"] = 1
    return ServeSettings(
        **given,
        beam=args.beam,
        api_key=args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV),
        cors_origin=args.cors,
    )


def _check_extras() -> None:
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(
                f"wtnmt serve needs the 'serve' extra ({module} is not installed): "
                f"pip install 'wtnmt[serve]'"
            ) from None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a one-line error saying why not.

    Made with the protocol number IPPROTO_TCP, not 0 as ``socket.create_server`` makes it:
    asyncio sets TCP_NODELAY on accepted connections only when their ``proto`` says TCP, and
    without it every answer on a kept-alive connection waited 40 ms for a delayed ACK
    (Nagle: uvicorn writes the headers and the body separately).
    """
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: allowed 0 to 65535")
    sock = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # uvicorn's default backlog
        return sock
    except OSError as e:
        if sock is not None:
            sock.close()
        # a name that does not resolve is a gaierror, whose errno (-2) os.strerror knows not
        reason = e.strerror or (os.strerror(e.errno) if e.errno else str(e))
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from None


def server_config(app, settings: ServeSettings, *, log_level: str = "info"):  # type: ignore[no-untyped-def]
    """uvicorn's settings for the app: a cap on connections at once, a short keep-alive, and
    connections that cannot hold the server idle (serve/connections.py): a request's headers
    have a bounded time to arrive, and an idle connection makes room for a new one (503 only
    when every connection is busy with a request)."""
    import uvicorn

    from wtnmt.serve.connections import guarded_protocol

    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        limit_concurrency=settings.max_connections,
        timeout_keep_alive=5,
        http=guarded_protocol(settings.header_timeout),
    )


def _loopback(host: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(host).is_loopback


def main_serve(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    _check_extras()
    with interrupt.held():  # torch's import can lose a Ctrl-C (wtnmt.cli._IMPORT_TORCH)
        import torch
    check_quantize(args.quantize, args.device)  # (true whatever devices there are)
    from wtnmt.decode.ensemble import ensemble_arguments

    try:
        args.engine, weights = ensemble_arguments(args.ensemble, args.ensemble_weights, args.engine)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_engine(args.engine, args.device)
    check_device(args.device)
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads {args.threads}: must be at least 1")
    from wtnmt.runtime import threads_warning

    if (said := threads_warning(args.threads)) is not None:
        print(f"wtnmt serve: warning: {said}", file=sys.stderr)
    sock = bind(args.host, args.port)

    import uvicorn

    from wtnmt.decode.translator import Translator
    from wtnmt.runtime import tune_cpu_allocator
    from wtnmt.serve.app import create_app

    tune_cpu_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(format="%(levelname)s:     %(name)s: %(message)s")
    logging.getLogger("wtnmt.serve").setLevel(args.log_level.upper())
    run = Path(args.run_dir)
    translator = Translator.load(
        run, device=args.device, quantize=args.quantize, engine=args.engine
    )
    args.engine = translator.engine  # (what --engine auto chose)
    if args.ensemble:
        try:
            translator.ensemble(args.ensemble, weights=weights)
        except ValueError as e:
            raise ConfigError(f"--ensemble {e}") from None
    app = create_app(translator, settings, name=run.resolve().name, worker_thread=False)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if settings.api_key is None and not _loopback(host):
        print(
            f"wtnmt serve: warning: listening on {host}, beyond this machine, with no API key "
            f"(--api-key or ${API_KEY_ENV})",
            file=sys.stderr,
        )
    print(
        f"wtnmt serve: {run} at http://{shown}:{port}/  (API: /v1/translate, docs: /docs; "
        f"{'batching on' if settings.max_batch_sentences > 1 else 'no batching'}"
        f"{'; int8 decoding' if args.quantize == 'int8' else ''}"
        f"{'; ONNX Runtime' if args.engine == 'onnxruntime' else ''}"
        f"{'; native engine' if args.engine == 'native' else ''}"
        f"{f'; an ensemble of {1 + len(args.ensemble)}' if args.ensemble else ''}; Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    server = uvicorn.Server(server_config(app, settings, log_level=args.log_level))
    batcher = app.state.batcher

    def serve_http() -> None:
        try:
            server.run(sockets=[sock])
        finally:  # however uvicorn ends, the model's loop below ends with it
            batcher.stop()

    # HTTP in a thread; the model's work here, in the thread that loaded it (Batcher.run)
    http = threading.Thread(target=serve_http, name="http")

    def shut_down(signum: int, frame: object) -> None:
        # the first Ctrl-C or SIGTERM lets requests in flight finish; a second one does not
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, shut_down)
    http.start()
    try:
        batcher.run(warmup=app.state.warmup)  # returns once the app has shut down
    finally:
        server.should_exit = True
        http.join()
    print("wtnmt serve: stopped", file=sys.stderr)
    return 0


__all__ = ["add_arguments", "bind", "main_serve", "server_config", "settings_from_args"]
