"""`wtnmt serve`'s HTTP application (FastAPI): the JSON API, the web page, health and metrics.

    POST /v1/translate   sentences → translations (+ n-best, attention maps), in input order
    GET  /v1/model       config, parameter count, languages, vocabulary size, κ/α per layer
    GET  /health         the process is alive          GET /ready   model loaded and warmed up
    GET  /metrics        Prometheus text format        GET /        the web page
    GET  /docs           the OpenAPI page              GET /openapi.json

Every refusal is a JSON ``{"detail": ...}`` with a 4xx/5xx status, never a 200.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from wtnmt import __version__
from wtnmt.config import ConfigError, config_to_dict
from wtnmt.decode.translator import Translator
from wtnmt.model import branch_weight_table, count_parameters
from wtnmt.model.pruning import branched_sublayers
from wtnmt.serve.batcher import Batcher
from wtnmt.serve.errors import ApiError
from wtnmt.serve.metrics import Metrics
from wtnmt.serve.middleware import BodyDeadline, BodyLimit, RequestMetrics
from wtnmt.serve.routes import router
from wtnmt.serve.runner import ModelRunner
from wtnmt.serve.settings import ServeSettings
from wtnmt.serve.validation import (
    describe_validation_error,
    unparsable_body,
)

log = logging.getLogger("wtnmt.serve")

PATHS = {
    "/",
    "/health",
    "/ready",
    "/metrics",
    "/v1/model",
    "/v1/translate",
    "/docs",
    "/openapi.json",
}


def _answer_errors_as_json(app: FastAPI, metrics: Metrics) -> None:
    """Every refusal a JSON body with a 4xx/5xx status, counted by reason."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        metrics.rejections.labels(reason=error.reason).inc()
        return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        metrics.rejections.labels(reason="invalid_request").inc()
        return JSONResponse(describe_validation_error(error.errors()), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers a body it cannot parse as JSON (nested too deeply, not UTF-8, an
        # integer too long to convert) with 400 "There was an error parsing the body": the
        # API promises 422 and a reason, as for any other invalid request
        reason = unparsable_body(error)
        if reason is not None:
            metrics.rejections.labels(reason="invalid_request").inc()
            detail = f"the request body is not valid JSON ({reason})"
            return JSONResponse({"detail": detail}, status_code=422)
        return JSONResponse(
            {"detail": error.detail}, status_code=error.status_code, headers=error.headers
        )

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s", request.url.path)
        detail = f"internal error ({type(error).__name__}); the server's log has the details"
        return JSONResponse({"detail": detail}, status_code=500)


def create_app(
    translator: Translator,
    settings: ServeSettings,
    *,
    name: str = "model",
    worker_thread: bool = True,
) -> FastAPI:
    """The server's app. With ``worker_thread`` the app starts its model worker in a thread
    when it starts; without, the caller runs ``app.state.batcher.run(app.state.warmup)`` in
    the thread that loaded the model (`wtnmt serve` does: see ``Batcher.run``)."""
    metrics = Metrics()
    runner = ModelRunner(translator, metrics, batch_tokens=settings.batch_tokens)
    batcher = Batcher(
        runner,
        metrics=metrics,
        max_queue=settings.max_queue,
        batch_wait_ms=settings.batch_wait_ms,
        batch_tokens=settings.batch_tokens,
        max_batch_sentences=settings.max_batch_sentences,
    )
    default_beam = settings.beam or translator.config.decode.beam
    if default_beam > settings.max_beam:  # every request would be refused for it
        raise ConfigError(
            f"the run's decode.beam={default_beam} exceeds --max-beam {settings.max_beam}: "
            f"raise --max-beam, or give --beam"
        )
    info = model_info(translator, settings, name=name, default_beam=default_beam)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        if worker_thread:
            batcher.start(warmup=runner.warmup)
        try:
            yield
        finally:
            await asyncio.to_thread(batcher.stop)

    app = FastAPI(
        title="wtnmt",
        version=__version__,
        summary=f"{info['architecture']} translation, {info['source_language']}→"
        f"{info['target_language']}",
        lifespan=lifespan,
    )
    app.state.translator, app.state.settings, app.state.info = translator, settings, info
    app.state.default_beam = default_beam
    app.state.batcher, app.state.metrics, app.state.warmup = batcher, metrics, runner.warmup
    _answer_errors_as_json(app, metrics)
    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, metrics=metrics)
    app.add_middleware(BodyDeadline, seconds=settings.read_timeout)
    if settings.cors_origin:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[settings.cors_origin],
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(RequestMetrics, metrics=metrics, paths=PATHS)
    return app


def model_info(
    translator: Translator, settings: ServeSettings, *, name: str, default_beam: int
) -> dict[str, Any]:
    """What GET /v1/model answers; computed once, so it shows the learned κ/α even while a
    request translates with replaced ones."""
    config = config_to_dict(translator.config)
    table = branch_weight_table(translator.model)
    # each branch's number in the trained model (a pruned one skips some); sublayers pruning
    # never touches (a weighted decoder self-attention) keep theirs all
    sublayers = {name: key for key, (name, _) in branched_sublayers(translator.model).items()}
    model = translator.config.model
    return {
        "name": name,
        "architecture": "weighted-transformer" if table else "transformer",
        "parameters": count_parameters(translator.model),
        "quantize": translator.quantize,  # "int8": linear layers decode in int8
        "int8_kernels": translator.int8_kernels,  # "fbgemm" or "onednn" (None: not packed here)
        "int8_product": translator.int8_product,  # those, or the native engine's int8.h kernel
        "int8_weight_bits": translator.int8_weight_bits,  # 8, or 7 without VNNI (None: as above)
        "engine": translator.engine,  # "pytorch", "native" or "onnxruntime"
        "source_language": translator.config.data.src_lang,
        "target_language": translator.config.data.tgt_lang,
        "vocabulary_size": len(translator.vocab.target),  # the target's (and output's)
        "joint_vocabulary": translator.vocab.joint,  # one for both languages (data.joint_vocab)
        "source_vocabulary_size": len(translator.vocab.source),
        # data paths are the server's business; the model and search are the client's
        "config": {"model": config["model"], "decode": config["decode"]},
        "branch_weights": [
            {
                "layer": layer,
                "branches": model.branch_numbers(*sublayers[layer])
                if layer in sublayers
                else list(range(1, len(w["kappa"]) + 1)),
                **w,
            }
            for layer, w in table.items()
        ],
        "defaults": {"beam": default_beam, "nbest": 1},
        "limits": {
            "max_sentences": settings.max_sentences,
            "max_chars": settings.max_chars,
            "max_beam": settings.max_beam,
            "max_body_bytes": settings.max_body_bytes,
            "timeout": settings.timeout,
        },
        "auth": settings.api_key is not None,
    }


__all__ = ["create_app", "model_info"]
