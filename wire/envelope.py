"""The request and response envelopes of PROTOCOL.md.

request_args checks the envelope's shape only, once the op is known and its token seen
(UNKNOWN_OP and UNAUTHENTICATED come first); the op's arguments are checked after it by
the op's spec (ops.OpSpec.validate).
"""
from __future__ import annotations

from typing import Any

from .errors import BadRequestError, ProtocolError

RequestId = int | str | None
_ENVELOPE_KEYS = frozenset({"id", "op", "token", "args"})


def request_id(message: dict[str, Any]) -> RequestId:
    """The id to echo: the message's own if it is an integer or string, else None."""
    rid = message.get("id")
    if isinstance(rid, (int, str)) and not isinstance(rid, bool):
        return rid
    return None


def request_args(message: dict[str, Any]) -> dict[str, Any]:
    """The args of a request naming a known op; BadRequestError names a faulty envelope field."""
    unknown = sorted(set(message) - _ENVELOPE_KEYS)
    if unknown:
        raise BadRequestError(f"{unknown[0]}: unknown envelope field")
    if "id" in message and message["id"] is not None and request_id(message) is None:
        raise BadRequestError("id: must be an integer or a string")
    token = message.get("token")
    if token is not None and not isinstance(token, str):
        raise BadRequestError("token: must be a string")
    args = message.get("args")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise BadRequestError("args: must be an object")
    return args


def ok_response(rid: RequestId, result: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "ok": True, "result": result}


def error_response(rid: RequestId, error: ProtocolError) -> dict[str, Any]:
    return {"id": rid, "ok": False, "error": error.to_wire()}


def make_request(op: str, args: dict[str, Any] | None = None, token: str | None = None,
                 rid: RequestId = None) -> dict[str, Any]:
    """A request message as a client sends it."""
    message: dict[str, Any] = {"op": op}
    if rid is not None:
        message["id"] = rid
    if token is not None:
        message["token"] = token
    if args:
        message["args"] = args
    return message
