"""The server's answer to a request it will not serve: a status, one clear sentence, and the
field, sentence index or limit concerned."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException


class ApiError(HTTPException):
    """Raised anywhere in a request (FastAPI lets HTTP exceptions through, even from reading
    the body); the app answers it as JSON ``{"detail": ..., "field"/"index"/"limit": ...}`` and
    counts it under ``wtnmt_rejections{reason}``."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        reason: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(status_code=status, detail=detail, headers=headers)
        self.reason = reason
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail, **self.extra}


__all__ = ["ApiError"]
