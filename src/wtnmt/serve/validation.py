"""One clear sentence for a request body that is not what the API takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wtnmt.serve.schemas import TranslateRequest

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


__all__ = ["describe_validation_error"]
