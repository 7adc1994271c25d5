"""One clear sentence for a request body that is not what the API takes: pydantic's errors,
bodies FastAPI cannot parse, text that is not Unicode, attention maps too large to send."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.exceptions import HTTPException

from wtnmt.serve.errors import ApiError
from wtnmt.serve.schemas import TranslateRequest
from wtnmt.serve.settings import ServeSettings

FIELDS = ", ".join(TranslateRequest.model_fields)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_validation_error(errors: Sequence[Any]) -> dict[str, Any]:
    """pydantic's errors (FastAPI's RequestValidationError) → ``{"detail", "field", "index"}``
    of the first one, worded for a person."""
    error = errors[0]
    kind = error.get("type", "")
    loc = [part for part in error.get("loc", ()) if part != "body"]
    if kind == "json_invalid":
        reason = error.get("ctx", {}).get("error", "")
        return {"detail": f"the request body is not valid JSON ({reason})"}
    if not loc or not isinstance(loc[0], str):
        return {"detail": 'the request body must be a JSON object such as {"text": "Hello."}'}
    field = loc[0]
    index = next((part for part in loc[1:] if isinstance(part, int)), None)
    if kind == "extra_forbidden":
        detail = f"unknown field {field!r}; the fields are: {FIELDS}"
    elif kind == "missing":
        detail = f"the field {field!r} is required"
    elif field == "text":  # a union: pydantic reports the str and the list[str] reading
        index = next((p for e in errors for p in e.get("loc", ())[2:] if isinstance(p, int)), None)
        detail = "text must be a string or a list of strings" + (
            "" if index is None else f"; text[{index}] is not a string"
        )
    else:
        detail = f"{field}: {error.get('msg', 'invalid value')} (got {_shown(error.get('input'))})"
    return {"detail": detail, "field": field, **({} if index is None else {"index": index})}


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unparsable_body(error: HTTPException) -> str | None:
    """Why FastAPI could not read a request body as JSON, or None if that is not ``error``."""
    cause = error.__cause__
    if error.status_code != 400 or cause is None:
        return None
    if isinstance(cause, RecursionError):
        return "nested too deeply"
    if isinstance(cause, UnicodeDecodeError):
        return f"not UTF-8 text at byte {cause.start}"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "an integer has too many digits"
    return type(cause).__name__


def check_attention_size(ids: list[list[int]], config, settings: ServeSettings) -> None:  # type: ignore[no-untyped-def]
    """Refuse, before decoding, a request whose attention maps could be too large to send:
    at most ``max_attention_sentences`` sentences, and the numbers of the maps (decoder layers
    × heads × the longest output allowed × source tokens, summed) at most
    ``max_attention_cells``."""
    wanted = [s for s in ids if s]
    if len(wanted) > settings.max_attention_sentences:
        raise ApiError(
            422,
            f"attention maps are returned for at most {settings.max_attention_sentences} "
            f"sentences a request; this one has {len(wanted)}",
            reason="attention_too_large",
            field="attention",
            limit=settings.max_attention_sentences,
        )
    per_position = config.model.decoder_layers * config.model.heads
    decode = config.decode
    cells = sum(
        per_position * (int(decode.max_len_a * (len(s) + 1) + decode.max_len_b) + 1) * (len(s) + 1)
        for s in wanted
    )
    if cells > settings.max_attention_cells:
        raise ApiError(
            422,
            f"the attention maps of these sentences could hold {cells:,} numbers; at most "
            f"{settings.max_attention_cells:,} are returned a request: ask for them with "
            f"fewer or shorter sentences",
            reason="attention_too_large",
            field="attention",
            limit=settings.max_attention_cells,
        )


__all__ = ["check_attention_size", "describe_validation_error", "is_unicode", "unparsable_body"]
