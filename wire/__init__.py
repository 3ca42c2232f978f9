"""The marketplace wire protocol: framing, envelope, errors, values, ops and dispatch, all
sans-IO, and the blocking client connection."""
from .client import Connection, ConnectionLostError
from .errors import ERROR_CLASSES, ProtocolError
from .ops import BUYER_OPS, SELLER_OPS, OpSpec

PROTOCOL_VERSION = "1.2"  # the contract's, docs/PROTOCOL.md (a test holds them equal)
__version__ = "1.2.0"  # the package version, ping's "version": pyproject.toml reads it from here

__all__ = [
    "BUYER_OPS", "ERROR_CLASSES", "PROTOCOL_VERSION", "SELLER_OPS", "__version__",
    "Connection", "ConnectionLostError", "OpSpec", "ProtocolError",
]
