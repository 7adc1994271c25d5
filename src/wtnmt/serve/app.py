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
import secrets
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from wtnmt import __version__
from wtnmt.config import ConfigError, config_to_dict
from wtnmt.decode.translator import Translator
from wtnmt.model import branch_weight_table, count_parameters
from wtnmt.serve.batcher import Batcher, QueueFull, ServerStopping, Ticket
from wtnmt.serve.errors import ApiError
from wtnmt.serve.metrics import Metrics
from wtnmt.serve.middleware import BodyDeadline, BodyLimit, RequestMetrics
from wtnmt.serve.runner import ModelRunner, RequestPayload, Search, SentenceResult
from wtnmt.serve.schemas import Candidate, ErrorResponse, TranslateRequest, TranslateResponse
from wtnmt.serve.settings import ServeSettings
from wtnmt.serve.validation import (
    check_attention_size,
    describe_validation_error,
    is_unicode,
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
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": what}
    for code, what in {
        401: "missing or wrong API key",
        413: "request body too large",
        422: "invalid request: bad JSON, wrong type, a limit exceeded",
        429: "queue full (see Retry-After)",
        503: "no translation within the request timeout",
    }.items()
}


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
    app.state.batcher, app.state.metrics, app.state.warmup = batcher, metrics, runner.warmup
    bearer = HTTPBearer(auto_error=False, description="the server's --api-key, when it has one")

    async def require_key(
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
    ) -> None:
        key = settings.api_key
        if key is None:
            return
        given = "" if credentials is None else credentials.credentials
        # headers arrive as bytes, which the server reads as latin-1: the key's UTF-8 bytes
        if not secrets.compare_digest(given.encode("latin-1", "replace"), key.encode()):
            raise ApiError(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                reason="unauthorized",
                headers={"WWW-Authenticate": "Bearer"},
            )

    guarded = [Depends(require_key)]

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

    page_html = resources.files("wtnmt.serve").joinpath("page.html").read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(page_html)

    @app.get("/health", summary="the process is alive")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", summary="the model is loaded and has translated once", responses={503: {}})
    async def ready() -> JSONResponse:
        if batcher.ready.is_set():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/metrics", dependencies=guarded, summary="Prometheus metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/model", dependencies=guarded, responses={401: ERRORS[401]})
    async def model() -> dict[str, Any]:
        """The model: config, parameter count, languages, vocabulary, learned κ/α per layer."""
        return info

    @app.post(
        "/v1/translate",
        dependencies=guarded,
        response_model=TranslateResponse,
        response_model_exclude_unset=True,
        responses=ERRORS,
    )
    async def translate(body: TranslateRequest, request: Request) -> TranslateResponse:
        """Translate one sentence or a list of them; answers come in input order."""
        sentences = [body.text] if isinstance(body.text, str) else body.text
        search = _search(body)
        _check_sentences(sentences)
        warnings: list[str] = []
        ids = translator.encode(sentences, warnings.append, first_line=0, label="text[{}]")
        if body.attention:
            check_attention_size(ids, translator.config, settings)
        payload = RequestPayload(search=search, attention=body.attention)
        try:
            ticket = batcher.submit(ids, key=search, payload=payload)
        except QueueFull as full:
            raise ApiError(
                429,
                f"{full}; retry in {full.retry_after} s",
                reason="queue_full",
                headers={"Retry-After": str(full.retry_after)},
                limit=full.limit,
            ) from None
        except ServerStopping as stopping:
            raise ApiError(503, str(stopping), reason="shutting_down") from None
        results = await _answers(ticket, request)
        fields: dict[str, Any] = {"translations": [r.options[0].text for r in results]}
        if body.nbest is not None:
            fields["nbest"] = [_candidates(r, search.nbest) for r in results]
        if body.attention:
            fields["attention"] = [r.attention for r in results]
        if warnings:
            fields["warnings"] = warnings
        return TranslateResponse(**fields)  # only what was asked for is sent (exclude_unset)

    def _search(body: TranslateRequest) -> Search:
        beam = default_beam if body.beam is None else body.beam
        if not 1 <= beam <= settings.max_beam:
            raise ApiError(
                422,
                f"beam={beam} is out of range: 1 to {settings.max_beam}",
                reason="beam_range",
                field="beam",
                limit=settings.max_beam,
            )
        nbest = 1 if body.nbest is None else body.nbest
        if not 1 <= nbest <= beam:
            raise ApiError(
                422,
                f"nbest={nbest} is out of range: 1 to the beam size ({beam})",
                reason="nbest_range",
                field="nbest",
                limit=beam,
            )
        if body.branch_weights != "learned" and not translator.has_branch_weights:
            raise ApiError(
                422,
                f"branch_weights={body.branch_weights!r}: this model has no branch weights "
                f"(model.attention: {translator.config.model.attention})",
                reason="no_branch_weights",
                field="branch_weights",
            )
        return Search(beam=beam, nbest=nbest, branch_weights=body.branch_weights, seed=body.seed)

    def _check_sentences(sentences: list[str]) -> None:
        if len(sentences) > settings.max_sentences:
            raise ApiError(
                422,
                f"text has {len(sentences):,} sentences; at most {settings.max_sentences:,} "
                f"are accepted per request",
                reason="too_many_sentences",
                field="text",
                limit=settings.max_sentences,
            )
        for i, sentence in enumerate(sentences):
            if not is_unicode(sentence):
                raise ApiError(
                    422,
                    f"text[{i}] is not valid Unicode text (it holds a lone surrogate, "
                    f"half of a character's UTF-16 pair)",
                    reason="invalid_text",
                    field="text",
                    index=i,
                )
            if len(sentence) > settings.max_chars:
                raise ApiError(
                    422,
                    f"text[{i}] has {len(sentence):,} characters; at most "
                    f"{settings.max_chars:,} are accepted per sentence",
                    reason="sentence_too_long",
                    field="text",
                    index=i,
                    limit=settings.max_chars,
                )

    async def _answers(ticket: Ticket, request: Request) -> list[SentenceResult]:
        """The request's results, unless it runs out of time or its client goes away."""
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            done, _ = await asyncio.wait(
                {ticket.future, gone}, timeout=settings.timeout, return_when="FIRST_COMPLETED"
            )
        finally:
            gone.cancel()
        if ticket.future in done:
            try:
                return ticket.future.result()
            except ServerStopping as stopping:
                raise ApiError(503, str(stopping), reason="shutting_down") from None
            except Exception as error:
                raise ApiError(
                    500,
                    f"translation failed ({type(error).__name__}); the server's log has the "
                    f"details",
                    reason="failed",
                ) from None
        batcher.cancel(ticket)
        ticket.future.cancel()
        if gone in done:  # nobody will read this answer
            raise ApiError(499, "the client closed the connection", reason="disconnected")
        raise ApiError(
            503,
            f"no translation within the request timeout of {settings.timeout:g} s",
            reason="timeout",
            limit=settings.timeout,
        )

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


async def _client_gone(request: Request) -> None:
    """Returns once the client has disconnected (the body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _candidates(result: SentenceResult, nbest: int) -> list[Candidate]:
    """Exactly ``nbest`` candidates, as `wtnmt translate --nbest` writes exactly N lines: the
    places the search found no hypothesis for (an empty sentence has only the empty one) are
    an empty text with no score (JSON has no -inf)."""
    found = [Candidate(text=o.text, score=round(o.score, 4)) for o in result.options[:nbest]]
    return found + [Candidate(text="", score=None)] * (nbest - len(found))


def model_info(
    translator: Translator, settings: ServeSettings, *, name: str, default_beam: int
) -> dict[str, Any]:
    """What GET /v1/model answers; computed once, so it shows the learned κ/α even while a
    request translates with replaced ones."""
    config = config_to_dict(translator.config)
    table = branch_weight_table(translator.model)
    return {
        "name": name,
        "architecture": "weighted-transformer" if table else "transformer",
        "parameters": count_parameters(translator.model),
        "quantize": translator.quantize,  # "int8": linear layers decode in int8
        "source_language": translator.config.data.src_lang,
        "target_language": translator.config.data.tgt_lang,
        "vocabulary_size": len(translator.vocab),
        # data paths are the server's business; the model and search are the client's
        "config": {"model": config["model"], "decode": config["decode"]},
        "branch_weights": [{"layer": layer, **w} for layer, w in table.items()],
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
