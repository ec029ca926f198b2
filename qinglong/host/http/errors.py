"""An error raised by a command's code, answered in the one error shape with the status of
:data:`qinglong.contracts.errors.HTTP_STATUSES`."""

from __future__ import annotations

from starlette.responses import JSONResponse

from qinglong.contracts.errors import http_status_for


def response_for(exc: BaseException, field: str | None = None) -> JSONResponse:
    status, code = http_status_for(exc)
    if getattr(exc, "http_status", None) == 403:
        status, code = 403, "forbidden"
    message = str(exc) if status != 500 else f"internal error ({exc.__class__.__name__})"
    return JSONResponse({"error": {"code": code, "message": message,
                                   "field": field or getattr(exc, "field", None)}}, status_code=status)
