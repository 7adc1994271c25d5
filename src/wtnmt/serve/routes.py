"""The server's endpoints, as one APIRouter whose handlers read what they need from
``request.app.state`` (set by :func:`wtnmt.serve.app.create_app`): ``translator``,
``settings``, ``batcher``, ``metrics``, ``info`` and ``default_beam``."""

from __future__ import annotations

import asyncio
import secrets
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from wtnmt.decode.sampling import Sampling
from wtnmt.model import chosen_branch_weights
from wtnmt.serve.batcher import PerSentence, QueueFull, ServerStopping, Ticket
from wtnmt.serve.errors import ApiError
from wtnmt.serve.runner import RequestPayload, Search, SentenceResult
from wtnmt.serve.schemas import Candidate, ErrorResponse, TranslateRequest, TranslateResponse
from wtnmt.serve.validation import check_attention_size, is_unicode

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
PAGE = resources.files("wtnmt.serve").joinpath("page.html").read_text(encoding="utf-8")

bearer = HTTPBearer(auto_error=False, description="the server's --api-key, when it has one")


async def require_key(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
) -> None:
    """401 unless the request carries the server's API key (when it has one)."""
    key = request.app.state.settings.api_key
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


router = APIRouter()
guarded = [Depends(require_key)]


@router.get("/", include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(PAGE)


@router.get("/health", summary="the process is alive")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", summary="the model is loaded and has translated once", responses={503: {}})
async def ready(request: Request) -> JSONResponse:
    if request.app.state.batcher.ready.is_set():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "loading"}, status_code=503)


@router.get("/metrics", dependencies=guarded, summary="Prometheus metrics")
async def prometheus(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/model", dependencies=guarded, responses={401: ERRORS[401]})
async def model(request: Request) -> dict[str, Any]:
    """The model: config, parameter count, languages, vocabulary, learned κ/α per layer."""
    return request.app.state.info


@router.post(
    "/v1/translate",
    dependencies=guarded,
    response_model=TranslateResponse,
    response_model_exclude_unset=True,
    responses=ERRORS,
)
async def translate(body: TranslateRequest, request: Request) -> TranslateResponse:
    """Translate one sentence or a list of them; answers come in input order."""
    state = request.app.state
    sentences = [body.text] if isinstance(body.text, str) else body.text
    search = choose_search(body, state)
    check_sentences(sentences, state.settings)
    warnings: list[str] = []
    ids = state.translator.encode(sentences, warnings.append, first_line=0, label="text[{}]")
    if body.attention:
        check_attention_size(ids, state.translator.config, state.settings)
    payload: RequestPayload | PerSentence = RequestPayload(
        search=search, attention=body.attention, alignment=body.alignment
    )
    if body.prefix is not None:
        forced = forced_prefixes(body.prefix, sentences, state, warnings)
        payload = PerSentence(
            RequestPayload(
                search=search, attention=body.attention, prefix=tuple(p), alignment=body.alignment
            )
            for p in forced
        )
    try:
        ticket = state.batcher.submit(ids, key=search, payload=payload)
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
    results = await answers(ticket, request)
    fields: dict[str, Any] = {"translations": [r.options[0].text for r in results]}
    if body.nbest is not None or search.nbest > 1:
        fields["nbest"] = [candidates(r, search.nbest) for r in results]
    if body.attention:
        fields["attention"] = [r.attention for r in results]
    if body.alignment is not None:
        fields["alignments"] = [r.alignment or [] for r in results]
    if warnings:
        fields["warnings"] = warnings
    return TranslateResponse(**fields)  # only what was asked for is sent (exclude_unset)


def choose_search(body: TranslateRequest, state: Any) -> Search:
    """The request's beam, n-best and branch weights (where, too), each checked against the
    limits and the model."""
    settings, translator = state.settings, state.translator
    if body.sampling is not None:
        return sampled(body, state)
    beam = state.default_beam if body.beam is None else body.beam
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
    if body.branch_weights != "learned" and translator.engine == "onnxruntime":
        raise ApiError(
            422,
            f"branch_weights={body.branch_weights!r}: this server decodes with "
            "onnxruntime, whose export holds the learned ones only",
            reason="engine",
            field="branch_weights",
        )
    only = None if body.branch_weights_in is None else tuple(sorted(set(body.branch_weights_in)))
    if only is not None:
        check_sublayers(only, body.branch_weights, translator.model)
    return Search(
        beam=beam, nbest=nbest, branch_weights=body.branch_weights, seed=body.seed, only=only
    )


def sampled(body: TranslateRequest, state: Any) -> Search:
    """A request's sampling, checked: without beam or nbest, samples within --max-beam."""
    for name in ("beam", "nbest"):
        if getattr(body, name) is not None:
            raise ApiError(
                422,
                f"{name}: sampling draws each token, {name} searches; ask for sampling.samples",
                reason="sampling",
                field=name,
            )
    s = body.sampling
    assert s is not None
    if s.samples > state.settings.max_beam:
        raise ApiError(
            422,
            f"sampling.samples={s.samples} is out of range: 1 to {state.settings.max_beam}",
            reason="samples_range",
            field="sampling.samples",
            limit=state.settings.max_beam,
        )
    drawn = Sampling(
        temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed, samples=s.samples
    )
    chosen = choose_search(body.model_copy(update={"sampling": None}), state)
    return Search(
        beam=1,
        nbest=s.samples,
        branch_weights=chosen.branch_weights,
        seed=chosen.seed,
        only=chosen.only,
        sampling=drawn,
    )


def forced_prefixes(
    prefix: str | list[str], sentences: list[str], state: Any, warnings: list[str]
) -> list[list[int]]:
    """The request's target prefixes as piece ids, one a sentence: 422 for another count,
    or a prefix as a sentence may not be."""
    given = [prefix] if isinstance(prefix, str) else prefix
    if len(given) != len(sentences):
        raise ApiError(
            422,
            f"prefix has {len(given)} entries for {len(sentences)} sentences; give one each "
            f'("" for none)',
            reason="prefix_count",
            field="prefix",
        )
    check_sentences(given, state.settings, field="prefix")
    return state.translator.encode_prefixes(  # type: ignore[no-any-return]
        given, len(given), warnings.append, first_line=0, label="prefix[{}]"
    )


def check_sublayers(names: tuple[str, ...], how: str, model: Any) -> None:
    """422 for ``branch_weights_in`` with the learned weights, or naming a sublayer the model
    does not have."""
    if how == "learned":
        raise ApiError(
            422,
            "branch_weights_in: names the sublayers whose κ, α branch_weights replaces; "
            "ask for branch_weights 'uniform' or 'random' with it",
            reason="branch_weights_in",
            field="branch_weights_in",
        )
    try:
        chosen_branch_weights(model, names)  # the check evaluate and the override make
    except ValueError as e:
        raise ApiError(
            422, f"branch_weights_in: {e}", reason="branch_weights_in", field="branch_weights_in"
        ) from None


def check_sentences(sentences: list[str], settings: Any, field: str = "text") -> None:
    """422 for too many sentences, text that is not Unicode, or a sentence too long (of the
    request's ``field``)."""
    if len(sentences) > settings.max_sentences:
        raise ApiError(
            422,
            f"{field} has {len(sentences):,} sentences; at most {settings.max_sentences:,} are "
            f"accepted per request",
            reason="too_many_sentences",
            field=field,
            limit=settings.max_sentences,
        )
    for i, sentence in enumerate(sentences):
        if not is_unicode(sentence):
            raise ApiError(
                422,
                f"{field}[{i}] is not valid Unicode text (it holds a lone surrogate, half of a "
                f"character's UTF-16 pair)",
                reason="invalid_text",
                field=field,
                index=i,
            )
        if len(sentence) > settings.max_chars:
            raise ApiError(
                422,
                f"{field}[{i}] has {len(sentence):,} characters; at most {settings.max_chars:,} "
                f"are accepted per sentence",
                reason="sentence_too_long",
                field=field,
                index=i,
                limit=settings.max_chars,
            )


async def answers(ticket: Ticket, request: Request) -> list[SentenceResult]:
    """The request's results, unless it runs out of time or its client goes away."""
    state = request.app.state
    timeout = state.settings.timeout
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        done, _ = await asyncio.wait(
            {ticket.future, gone}, timeout=timeout, return_when="FIRST_COMPLETED"
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
                f"translation failed ({type(error).__name__}); the server's log has the details",
                reason="failed",
            ) from None
    state.batcher.cancel(ticket)
    ticket.future.cancel()
    if gone in done:  # nobody will read this answer
        raise ApiError(499, "the client closed the connection", reason="disconnected")
    raise ApiError(
        503,
        f"no translation within the request timeout of {timeout:g} s",
        reason="timeout",
        limit=timeout,
    )


async def _client_gone(request: Request) -> None:
    """Returns once the client has disconnected (the body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def candidates(result: SentenceResult, nbest: int) -> list[Candidate]:
    """Exactly ``nbest`` candidates, as `wtnmt translate --nbest` writes exactly N lines: the
    places the search found no hypothesis for (an empty sentence has only the empty one) are
    an empty text with no score (JSON has no -inf)."""
    found = [Candidate(text=o.text, score=round(o.score, 4)) for o in result.options[:nbest]]
    return found + [Candidate(text="", score=None)] * (nbest - len(found))


__all__ = ["ERRORS", "router"]
