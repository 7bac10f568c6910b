"""API errors by HTTP status, so callers branch on meaning (retry a 409, ignore a 404) not on text."""

from __future__ import annotations

import re


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


class Unreachable(ConnectionError):
    """The API server could not be reached (refused, TLS, timeout, dropped): a line naming the URL.

    An OSError, so every caller that already treats a down server as one keeps doing so; its text is
    what a person reads, never urllib3's nested repr.
    """


def transport_reason(exc: BaseException) -> str:
    """Why a connection failed, in a few words: the innermost OS or TLS error's own text."""
    import ssl

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return f"TLS certificate not trusted: {current.verify_message}"
        if isinstance(current, ssl.SSLError):
            return f"TLS failed: {current.reason or current.strerror or 'handshake error'}"
        if isinstance(current, OSError) and current.strerror and not isinstance(current, transport_errors()):
            return str(current.strerror)
        following = getattr(current, "reason", None)
        if not isinstance(following, BaseException):
            following = current.__cause__ or current.__context__
        current = following
    text = " ".join(str(exc).split())
    # urllib3 writes "<...Connection object at 0x..>: " and "HTTPSConnectionPool(...): " before its words.
    text = re.sub(r"<[^>]*object at 0x[0-9a-f]+>:?\s*", "", text)
    text = re.sub(r"\w+ConnectionPool\([^)]*\):\s*", "", text)
    return text or type(exc).__name__


def http_problem(status: int, body: str) -> str:
    """A non-API answer (a proxy's or load balancer's page) as one line: its status and, if it is short
    plain text, its words; never an HTML page."""
    from http import HTTPStatus

    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    text = " ".join(body.split())
    plain = text and "<" not in text and len(text) <= 200
    return f"HTTP {status}{' ' + phrase if phrase else ''}" + (f": {text}" if plain else "")
