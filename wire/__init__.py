"""The marketplace wire protocol: framing, envelope, errors, values, ops, server loop, client.

The core (framing, envelope, values, ops) is sans-IO; `server` and `client` are the thin
socket layers around it that both servers and the CLI use.
"""
from .client import Connection, ConnectionLostError
from .envelope import Request, error_response, make_request, ok_response, parse_request
from .errors import *  # noqa: F403  (one class per error code)
from .errors import ERROR_CLASSES, ProtocolError, error_from_wire
from .framing import DEFAULT_MAX_FRAME, FrameDecoder, decode_body, encode_frame
from .ops import BUYER_OPS, SELLER_OPS, OpSpec

PROTOCOL_VERSION = "1.2"  # the contract's, docs/PROTOCOL.md (a test holds them equal)
__version__ = "1.2.0"  # the package version, ping's "version": pyproject.toml reads it from here

__all__ = [
    "BUYER_OPS", "DEFAULT_MAX_FRAME", "ERROR_CLASSES", "PROTOCOL_VERSION", "SELLER_OPS", "__version__",
    "Connection", "ConnectionLostError", "FrameDecoder", "OpSpec", "ProtocolError", "Request",
    "decode_body", "encode_frame", "error_from_wire", "error_response", "make_request",
    "ok_response", "parse_request",
]
