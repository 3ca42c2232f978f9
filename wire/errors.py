"""One exception class per error code of the wire protocol.

Every layer raises these; the server loop turns them into error responses in one
place, and the client turns error responses back into them through ERROR_CLASSES.
"""
from __future__ import annotations

from typing import Any, ClassVar


class ProtocolError(Exception):
    """Base of every error that has a code on the wire."""

    code: ClassVar[str] = "INTERNAL"
    retryable: bool = False  # the code's, as the contract's table has it; an answer may say otherwise

    def __init__(self, message: str = "", *, retryable: bool | None = None) -> None:
        super().__init__(message or self.code.lower().replace("_", " "))
        self.message = str(self.args[0])
        if retryable is not None:
            self.retryable = retryable

    def to_wire(self) -> dict[str, Any]:
        """The `error` object of a response."""
        return {"code": self.code, "message": self.message, "retryable": self.retryable}


class BadFrameError(ProtocolError):
    code = "BAD_FRAME"


class FrameTooLargeError(ProtocolError):
    code = "FRAME_TOO_LARGE"


class BadRequestError(ProtocolError):
    code = "BAD_REQUEST"


class UnknownOpError(ProtocolError):
    code = "UNKNOWN_OP"


class UnauthenticatedError(ProtocolError):
    code = "UNAUTHENTICATED"


class ForbiddenError(ProtocolError):
    code = "FORBIDDEN"


class NotFoundError(ProtocolError):
    code = "NOT_FOUND"


class ConflictError(ProtocolError):
    code = "CONFLICT"


class PaymentDeclinedError(ProtocolError):
    code = "PAYMENT_DECLINED"


class BusyError(ProtocolError):
    code = "BUSY"
    retryable = True


class UnavailableError(ProtocolError):
    code = "UNAVAILABLE"
    retryable = True


class InternalError(ProtocolError):
    code = "INTERNAL"

    def __init__(self, message: str = "internal error; details are in the server log", *,
                 retryable: bool | None = None) -> None:
        super().__init__(message, retryable=retryable)


ERROR_CLASSES: dict[str, type[ProtocolError]] = {
    cls.code: cls
    for cls in (
        BadFrameError, FrameTooLargeError, BadRequestError, UnknownOpError,
        UnauthenticatedError, ForbiddenError, NotFoundError, ConflictError,
        PaymentDeclinedError, BusyError, UnavailableError, InternalError,
    )
}


def error_from_wire(error: Any) -> ProtocolError:
    """The exception for a response's `error` object; unknown codes become INTERNAL."""
    if not isinstance(error, dict):
        return InternalError(f"malformed error object: {error!r}")
    cls = ERROR_CLASSES.get(error.get("code", ""), InternalError)
    retryable = error.get("retryable")
    return cls(str(error.get("message", "")), retryable=retryable if isinstance(retryable, bool) else None)
