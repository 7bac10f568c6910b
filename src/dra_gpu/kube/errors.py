"""API errors by HTTP status, so callers branch on meaning (retry a 409, ignore a 404) not on text."""

from __future__ import annotations


class ApiError(Exception):
    status = 500
    reason = "InternalError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ApiError):
    status, reason = 404, "NotFound"


class Conflict(ApiError):
    """A stale resourceVersion or a failed precondition: re-read and retry."""

    status, reason = 409, "Conflict"


class AlreadyExists(ApiError):
    status, reason = 409, "AlreadyExists"


class Invalid(ApiError):
    status, reason = 422, "Invalid"


class Forbidden(ApiError):
    status, reason = 403, "Forbidden"


class Gone(ApiError):
    """The watch's resourceVersion is too old: list again."""

    status, reason = 410, "Expired"


_BY_REASON: dict[str, type[ApiError]] = {
    cls.reason: cls for cls in (NotFound, Conflict, AlreadyExists, Invalid, Forbidden, Gone)
}
_BY_STATUS: dict[int, type[ApiError]] = {
    404: NotFound,
    409: Conflict,
    422: Invalid,
    403: Forbidden,
    410: Gone,
}


def from_status(status: int, reason: str, message: str) -> ApiError:
    """Map an API `Status` (code, reason, message) to the matching error class."""
    cls = _BY_REASON.get(reason) or _BY_STATUS.get(status) or ApiError
    err = cls(message)
    err.status = status
    return err


def transport_errors() -> tuple[type[Exception], ...]:
    """What the real client raises when the API server cannot be reached or the connection drops
    (besides OSError): urllib3's own errors, which are not ApiErrors."""
    try:
        import urllib3.exceptions
    except ImportError:  # pragma: no cover - the kubernetes client depends on urllib3
        return ()
    return (urllib3.exceptions.HTTPError,)
